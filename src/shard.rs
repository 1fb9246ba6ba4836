//! Sharding's building blocks: the ring that places each MyApp on one live shard, and the
//! membership that says which shards are live from their Leases. Nothing in the controller
//! uses them yet; with one replica, or sharding off, the controller reconciles every MyApp.

mod members;
mod ring;

pub use members::Members;
pub use ring::{POINTS_PER_SHARD, Ring};
