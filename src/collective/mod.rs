//! Collective de-duplication (Nicolae, IPDPS'13, section III): after each
//! rank has de-duplicated against its own history, the regions several ranks
//! would store are stored once, by one owner chosen so that no rank becomes
//! the straggler; the others keep a cross-rank reference.
//!
//! - [`merge`](mod@self::merge): the top-K merger (Algorithm 2) as a pure function, and the
//!   wire form of a tuple set (a count word, then 5 words an entry).
//! - [`regions`]: the FIRST regions a rank offers, and the rewrite of its
//!   diff and record once owners are known.
//! - [`step`]: one rank's side of a collective checkpoint around the
//!   reduction, independent of the transport.
//! - [`mpi`] (feature `mpi`): [`Collective`], the entry point an
//!   `mpirun`-launched program calls: the reduction merges the ranks' sets
//!   up a binomial tree, then broadcasts the result (`reduce::Reducer`).
//! - [`tiered`] (feature `mpi`): [`TieredCollective`], the same step through
//!   the asynchronous tiers: each rank flushes only its own files, and a
//!   version is committed on a tier once every rank's are durable there.

#[cfg(feature = "mpi")]
mod background;
#[cfg(feature = "mpi")]
pub mod bench;
pub mod merge;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "mpi")]
mod reduce;
pub mod regions;
pub mod step;
#[cfg(feature = "mpi")]
pub mod tiered;

pub use merge::{DEFAULT_THRESHOLD, HashFreq, local_set, merge, reduce_all};
#[cfg(feature = "mpi")]
pub use mpi::{Collective, CollectiveReport};
#[cfg(feature = "mpi")]
pub use tiered::TieredCollective;

use crate::backend::BackendKind;
use serde::{Deserialize, Serialize};

/// Largest region offered to the reduction when sized automatically
/// (256 KiB): a 1 GiB buffer offers at most 4096 regions.
pub const MAX_AUTO_REGION_BYTES: u64 = 256 * 1024;

/// Regions per rank share that automatic sizing aims for: a buffer
/// replicated on all P ranks is cut into about `64 P` regions, so the
/// greedy owner choice can spread it within a few percent.
pub const AUTO_REGIONS_PER_RANK: u64 = 64;

/// Bytes one cross-rank reference costs in a diff file (a 40-byte SHIFT
/// entry and a 16-byte digest).
pub const REFERENCE_BYTES: u64 = 56;

/// The region size used for `region_bytes = 0` (automatic), for the smallest
/// rank's buffer and P ranks: about `64 P` regions for balance, but large
/// enough that the P − 1 references to a replicated region cost at most 2%
/// of it (`50 · 56 · (P − 1)` bytes), and at most [`MAX_AUTO_REGION_BYTES`].
pub fn auto_region_bytes(min_data_len: u64, ranks: u32) -> u64 {
    let p = u64::from(ranks.max(1));
    let balance = min_data_len / (AUTO_REGIONS_PER_RANK * p);
    let metadata = 50 * REFERENCE_BYTES * (p - 1);
    balance.max(metadata).min(MAX_AUTO_REGION_BYTES)
}

/// Settings of the collective step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CollectiveOptions {
    /// K: the most tuples a partial result keeps (the paper's threshold).
    pub threshold: usize,
    /// Largest region (Merkle node) offered, in bytes, rounded down to a
    /// power-of-two number of chunks (one chunk at least); 0 sizes it
    /// automatically ([`auto_region_bytes`]). All ranks must use the same.
    pub region_bytes: u64,
    /// Where each rank de-duplicates: `auto` (CUDA when a device is usable,
    /// ranks of a node spread over its GPUs), `cpu` or `cuda`.
    pub backend: BackendKind,
    /// Skips the reduction: each rank de-duplicates against its own history
    /// only and stores every region itself (what the collective step is
    /// measured against). Any method is allowed then, `full` included.
    pub local_only: bool,
    /// Smallest region offered, in bytes (0: every region). Smaller FIRST
    /// regions are stored by their rank without entering the reduction:
    /// fewer tuples make a shorter reduction, at the price of the bytes
    /// the small regions repeated across ranks would have saved. Opt-in.
    pub min_region_bytes: u64,
    /// Runs the reduction and the give-away of a checkpoint through the
    /// tiers on a background thread with its own communicator, so the call
    /// returns once the rank's diff is cached (the version settles at the
    /// next collective call: checkpoint, wait, finalize). Takes effect only
    /// where MPI granted `MPI_THREAD_MULTIPLE`; otherwise the step runs in
    /// the call, as with `false`.
    pub overlap: bool,
}

impl Default for CollectiveOptions {
    fn default() -> Self {
        CollectiveOptions {
            threshold: DEFAULT_THRESHOLD,
            region_bytes: 0,
            backend: BackendKind::Auto,
            local_only: false,
            min_region_bytes: 0,
            overlap: true,
        }
    }
}
