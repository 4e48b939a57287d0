//! The synchronous collective checkpoint: [`Collective`], the one driver
//! ([`TieredCollective`]) over a single shared tier, with the step in the
//! call and every checkpoint waited for until it is durable on every rank.
//!
//! A version is committed when every rank's commit part is on the tier
//! (`crate::store::commits`): a crash leaves it everywhere or nowhere, and
//! no rank lists a version whose owners' files are not durable. Stores
//! written by the earlier synchronous driver (rank 0's commit record) read
//! as before.

use super::tiered::TieredCollective;
use super::{CollectiveOptions, CollectiveReport, HashFreq, Overlap};
use crate::backend::budget::GpuCache;
use crate::error::Result;
use crate::memory::Protected;
use crate::store::StoreOptions;
use crate::tiers::{TierOptions, TieredEngine, TieredReport};
use ::mpi::traits::Communicator;
use std::path::Path;
use std::time::Instant;

/// Host cache of the synchronous driver: one file of a buffer this long
/// (a quarter more, and 8 MiB of metadata), at most the tiers' default. A
/// larger diff is spilled to memory of its own, as through the tiers.
fn host_cache_for(data_len: u64) -> u64 {
    let one_file = data_len.saturating_add(data_len / 4).saturating_add(8 << 20);
    one_file.min(TierOptions::default().host_cache_bytes)
}

/// A rank's synchronous collective checkpointing: each checkpoint returns
/// once the version is durable and committed on every rank.
///
/// ```no_run
/// # fn main() -> dckpt::Result<()> {
/// use mpi::traits::*;
/// let universe = mpi::initialize().expect("MPI");
/// let world = universe.world();
/// let data = vec![0u8; 1 << 20];
/// let mut ckpt = dckpt::collective::Collective::open(
///     &world, "ckpt".as_ref(), data.len() as u64, &Default::default(), &Default::default())?;
/// let report = ckpt.checkpoint(1, &data)?;
/// println!("rank {} stored {} bytes", report.rank, report.checkpoint.file_bytes);
/// # Ok(()) }
/// ```
pub struct Collective {
    driver: TieredCollective,
}

impl Collective {
    /// Opens (or creates) this rank's store under `root` (the shared
    /// directory all ranks write to) for a buffer of `data_len` bytes.
    /// Collective: every rank calls it; ranks must agree on the chunk size,
    /// hash and method, and the method must keep a record (tree or list).
    /// `opts.overlap` is ignored: the step runs in the call.
    pub fn open<C: Communicator>(
        comm: &C,
        root: &Path,
        data_len: u64,
        store: &StoreOptions,
        opts: &CollectiveOptions,
    ) -> Result<Self> {
        let tiers = TierOptions {
            shared: Some(root.to_path_buf()),
            host_cache_bytes: host_cache_for(data_len),
            gpu_cache: GpuCache::NONE,
            ..TierOptions::default()
        };
        let opts = CollectiveOptions { overlap: Overlap::Off, ..opts.clone() };
        Ok(Collective { driver: TieredCollective::open(comm, &tiers, data_len, store, &opts)? })
    }

    /// The rank's engine (its store, options, backend).
    pub fn engine(&self) -> &TieredEngine {
        self.driver.engine()
    }

    /// Takes collective checkpoint `version` of the protected memory (host
    /// bytes, or a [`DeviceRegion`](crate::memory::DeviceRegion) on the CUDA
    /// backend) and returns once it is durable on every rank. Collective:
    /// every rank calls it with the same version. On error the version is
    /// committed nowhere, and the next one is a baseline on every rank.
    pub fn checkpoint<'a>(
        &mut self,
        version: u64,
        data: impl Into<Protected<'a>>,
    ) -> Result<CollectiveReport<TieredReport>> {
        let t0 = Instant::now();
        let taken = self.driver.checkpoint(version, data);
        // Collective: every rank waits, also one whose part of the call failed.
        let waited = {
            let _span = crate::profile::Span::new("wait", version);
            self.driver.wait(version)
        };
        let mut report = taken?;
        waited?;
        // The call's report is the settled one (the step ran in the call).
        let _ = self.driver.take_settled();
        report.total_seconds = t0.elapsed().as_secs_f64();
        report.checkpoint.total_seconds = report.total_seconds;
        Ok(report)
    }

    /// The reduction alone: every rank's set in, the merged set out (the
    /// same on every rank). Collective.
    pub fn reduce(&mut self, set: &[HashFreq]) -> Result<Vec<HashFreq>> {
        self.driver.reduce(set)
    }

    /// Stops the flush worker, every version durable. Collective (dropping
    /// the handle also stops it, without the agreement).
    pub fn finalize(self) -> Result<()> {
        self.driver.finalize()
    }
}
