//! Sharding's building blocks: the ring that places each MyApp on one live shard, the
//! membership that says which shards are live from their Leases, and the sharder's next label
//! change for a MyApp. Nothing in the controller uses them yet; with one replica, or sharding
//! off, the controller reconciles every MyApp.

mod assign;
mod members;
mod ring;

pub use assign::{DRAIN_LABEL, Move, SHARD_LABEL, next_move};
pub use members::Members;
pub use ring::{POINTS_PER_SHARD, Ring};
