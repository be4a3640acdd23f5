//! raid-core: everything that is the array itself, with no GPU and no CLI.
//!
//! Today this crate holds the parity engine (`parity`): the maths every RAID5/6
//! write, degraded read, rebuild and scrub stands on. Layout geometry, member
//! I/O, metadata and the read/write paths land beside it as their own modules.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod array;
pub mod buf;
pub mod layout;
pub mod member;
pub mod metadata;
pub mod parity;
pub mod shard;
pub mod stats;
