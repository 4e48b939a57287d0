//! The application runtime: one handle per process for an `mpirun`-launched
//! simulation. It owns a duplicate of the communicator, keeps the regions
//! the application protects (host or device memory it owns, by address and
//! length, any number), and takes each named checkpoint of all of them as
//! one collective checkpoint through the asynchronous tiers
//! ([`crate::collective::TieredCollective`]), configured by a
//! [`Config`](crate::config::Config).
//!
//! ```text
//! protect(id, region)…   checkpoint(name, v): gather the regions (ids in order) into one
//!                        buffer (device regions device-to-device) → collective checkpoint
//!                        → return (mode "sync": after `wait`)
//! restart(name, v):      restore this rank's buffer → scatter it back into the regions
//! ```
//!
//! **Rules for regions.** A name's first checkpoint fixes its regions: their
//! ids, lengths and kinds (host or device). Later checkpoints and restarts of
//! that name need the same set protected (a region may move: re-protect the
//! id at its new address); a different set is an error, not a silent
//! re-layout (use a new name). Every rank calls `checkpoint`, `latest`,
//! `restart` and `finalize` of the same names in the same order (they are
//! collective); each rank protects its own regions, of any sizes.
//!
//! **Restart on another number of ranks** ([`table`], no MPI needed): each
//! rank's first checkpoint of a name writes its region table on every tier;
//! a job of any size lists the old ranks' regions and reads any of them, or
//! a byte range of one, at any committed version
//! ([`Runtime::old_regions`], [`Runtime::read_region`]), then checkpoints
//! under a new name.

#[cfg(feature = "mpi")]
#[cfg(feature = "mpi")]
mod agent_watch;
mod agreement;
#[cfg(feature = "mpi")]
mod handle;
pub mod placement;
#[cfg(feature = "mpi")]
mod raw;
#[cfg(feature = "mpi")]
pub mod study;
pub mod table;

#[cfg(feature = "mpi")]
pub use handle::{HaltReason, Runtime};
#[cfg(feature = "mpi")]
pub use raw::Region;
