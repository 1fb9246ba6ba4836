//! Sharding: the ring that places each MyApp on one live shard, the membership that says
//! which shards are live from their Leases, the sharder's next label change for a MyApp, and
//! the sharder that makes those changes. Each shard's controller reconciles only the MyApps
//! labelled with its name (`controller::Config::shard`); with sharding off, the controller
//! reconciles every MyApp.

mod assign;
pub mod by_namespace;
mod live;
mod members;
pub mod ranges;
mod ring;
pub mod server_side;
pub mod sharder;
pub mod view;

pub use assign::{DRAIN_LABEL, Move, SHARD_LABEL, next_move};
pub use live::LiveShards;
pub use members::Members;
pub use ring::{POINTS_PER_SHARD, Ring};
