//! Asynchronous multi-level checkpointing: the application waits only for
//! the de-duplication and the copy of its diff into the host cache; flush
//! workers make it durable on a node-local directory and a shared directory
//! in the background (HPDC'23's multi-level cache, over dckpt's diffs).
//!
//! ```text
//! checkpoint(v) ──► backend dedup ──► serialize into host-cache segments ──► return
//!                                          │ (cache full: the caller waits, reported)
//!                       flush worker 0 ◄───┘  write + fsync + rename + manifest on tier 0
//!                            │ segments back to the cache
//!                       flush worker 1        copy tier 0's file to tier 1, same protocol
//! wait(v) / is_durable(v, tier) ◄── per-version, per-tier states ([`state`])
//! ```
//!
//! Two-phase completion: [`TieredEngine::checkpoint`] returns once the
//! application's memory may change again; [`TieredEngine::wait`] returns
//! once the version is durable on every tier (or says which tier failed).
//! The backend's history advances at `checkpoint`: a version that then fails
//! to flush makes the next checkpoint a baseline, so no chain on any tier is
//! ever listed with a hole, and the versions already durable stay intact.
//! Dropping the engine (or [`TieredEngine::finalize`]) waits for every
//! queued version: data is never dropped.

mod durability;
mod options;
mod restoring;
mod version;

pub use options::*;
pub(crate) use version::*;

pub mod arena;
pub mod cache;
mod flusher;
pub mod journal;
mod listing;
pub mod prefetch;
mod reader;
mod write;
pub(crate) use durability::TierWatch;
pub use reader::RemoteFiles;
pub mod state;
mod writeback;

use crate::backend::budget::GpuCache;
use crate::backend::{AnyBackend, Backend, BackendKind};
use crate::engine::{Engine, OpenReport, OpenWith, RebuildAt};
use crate::error::{Error, Result};
use crate::format::Compression;
use crate::memory::{Protected, ProtectedMut};
use crate::regions::{Region, Rewrite};
use crate::restore::PendingMap;
use crate::store::{Store, StoreOptions, StoreWriter};
use cache::Cached;
use cache::HostCache;
pub(crate) use flusher::LateRewrite;
use flusher::{Flusher, Job, Shared, Source};
pub use listing::Listing;
use reader::Reach;
use serde::{Deserialize, Serialize};
use state::{Progress, TierState};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
pub(crate) use write::{CacheWrite, FileBytes, list_written, write_cached, write_copied};

/// What one asynchronous checkpoint cost the application.
#[derive(Clone, Debug, Serialize)]
pub struct TieredReport {
    /// The version.
    pub version: u64,
    /// Whether it is a baseline.
    pub baseline: bool,
    /// Bytes of its diff file.
    pub file_bytes: u64,
    /// Seconds de-duplicating and serializing (the backend).
    pub dedup_seconds: f64,
    /// Seconds copying the file into the host cache (on the CUDA backend,
    /// the D2H of the diff straight into the page-locked cache).
    pub cache_seconds: f64,
    /// Seconds waiting for room in the host cache (backpressure: the flush
    /// is slower than the checkpoints).
    pub backpressure_seconds: f64,
    /// Seconds from the call to its return: what the application waited.
    pub total_seconds: f64,
    /// Whether the diff waits in the GPU cache tier (the host cache was
    /// full): the flusher copies it to the host when it has room.
    pub held_on_gpu: bool,
    /// Whether the diff was spilled outside the host cache (larger than the
    /// whole cache, or the cache's segments not made yet): held in heap
    /// memory of its own until the first disk tier has it
    /// ([`cache::Cached::spilled`]); a wait for the previous spill counts in
    /// `backpressure_seconds`.
    pub spilled: bool,
    /// Device-side times (CUDA backend).
    pub gpu: Option<crate::backend::cuda::GpuTimings>,
}

/// What [`TieredEngine::restore_latest`] restored.
#[derive(Clone, Debug, Serialize)]
pub struct Restored {
    /// The version.
    pub version: u64,
    /// The tier it was read from.
    pub tier: String,
    /// Newer versions that could not be restored from any tier, with why.
    pub skipped: Vec<String>,
}

/// A rank's checkpointing engine over a host cache and one or two disk
/// tiers, flushing in the background (see the module documentation).
pub struct TieredEngine {
    backend: AnyBackend,
    opts: StoreOptions,
    shared: Arc<Shared>,
    flusher: Flusher,
    /// The newest version taken, its chain length, and whether it was taken
    /// at all (versions must increase).
    latest: Option<u64>,
    chain_len: u64,
    force_baseline: bool,
    /// The committed version (and the tier holding it) the backend's state
    /// is still to be rebuilt from: at a restart from that restore's bytes,
    /// else at the first checkpoint.
    rebuild_pending: Option<(u64, usize)>,
    rank: u32,
    roots: Vec<PathBuf>,
    opened: OpenReport,
    /// Versions are collective: durable on a tier once every rank's part is there.
    collective: bool,
    /// The restore cache and its prefetch thread, if configured.
    prefetch: Option<prefetch::Prefetcher>,
    /// The host buffer device restores go through, allocated at the first
    /// one (heap memory every core prefaults: page-locking it would cost
    /// more than the copy it speeds up) and kept.
    restore_staging: std::sync::Mutex<Option<crate::memory::Segment>>,
    /// Files restores read out of the GPU cache tier ([`Self::gpu_cache_reads`]).
    gpu_cache_reads: std::sync::atomic::AtomicU64,
    /// The CUDA device it uses (CUDA backend).
    device: usize,
    /// Other nodes' files its restores read ([`TieredEngine::set_remote_files`]).
    remote: std::sync::Mutex<Option<Arc<RemoteFiles>>>,
}

impl TieredEngine {
    /// Opens the tiers of `rank` for a buffer of `data_len` bytes. The
    /// de-duplication state is rebuilt from the tier holding the newest
    /// committed version (as [`Engine`] does); if the tiers disagree on it,
    /// the next checkpoint is a baseline, so that every tier holds whole
    /// chains again.
    pub fn open(
        rank: u32,
        data_len: u64,
        opts: &StoreOptions,
        tiers: &TierOptions,
        backend: BackendKind,
    ) -> Result<Self> {
        Self::open_on(rank, data_len, opts, tiers, backend, 0)
    }

    /// As [`TieredEngine::open`], on CUDA device `device` (the CUDA
    /// backend; the others ignore it).
    pub fn open_on(
        rank: u32,
        data_len: u64,
        opts: &StoreOptions,
        tiers: &TierOptions,
        backend: BackendKind,
        device: usize,
    ) -> Result<Self> {
        Self::open_for(rank, data_len, opts, tiers, backend, device, Listing::Manifest)
    }

    /// As [`TieredEngine::open`], on CUDA device `device`, listing versions
    /// as `listing` says (a collective rank writes commit parts).
    pub(crate) fn open_for(
        rank: u32,
        data_len: u64,
        opts: &StoreOptions,
        tiers: &TierOptions,
        backend: BackendKind,
        device: usize,
        listing: Listing,
    ) -> Result<Self> {
        let disks = tiers.disks();
        if disks.is_empty() {
            return Err(Error::InvalidOption("the tiers need a local or a shared directory (or both)".into()));
        }
        if let Some((name, _)) = disks.iter().find(|(name, _)| tiers.keep_of(name) == Some(0)) {
            return Err(Error::InvalidOption(format!("the {name} tier must keep at least one version")));
        }
        // Which tier is newest: read-only views first (no lock taken twice).
        let latest_of =
            |root: &PathBuf| Store::open(root, rank).ok().and_then(|s| s.manifest().latest().map(|v| v.version));
        let latests: Vec<Option<u64>> = disks.iter().map(|(_, p)| latest_of(p)).collect();
        let newest = (0..disks.len()).max_by_key(|&i| (latests[i], std::cmp::Reverse(i))).unwrap_or(0);
        // Manifests only: the state is rebuilt from a restart's own restore,
        // else at the first checkpoint.
        let engine = Engine::open_with_cache(
            &disks[newest].1,
            rank,
            data_len,
            opts,
            backend,
            OpenWith { device, gpu_cache: tiers.gpu_cache, rebuild: RebuildAt::Later },
        )?;
        let parts = engine.into_parts();
        let mut stores: Vec<(String, StoreWriter)> = Vec::with_capacity(disks.len());
        let mut base = Some(parts.store);
        for (i, (name, root)) in disks.iter().enumerate() {
            let store = match base.take_if(|_| i == newest) {
                Some(s) => s,
                None => StoreWriter::open(root, rank, data_len, opts)?.0,
            };
            stores.push((name.clone(), store));
        }
        let latest = latests[newest];
        let disagree = latests.iter().any(|l| *l != latest);
        let chain_len = {
            let m = stores[newest].1.manifest();
            latest.and_then(|v| m.chain(v)).map_or(0, |c| c.len() as u64)
        };
        let roots: Vec<PathBuf> = stores.iter().map(|(_, s)| s.root().to_path_buf()).collect();
        let prefetch = match tiers.prefetch_cache_bytes {
            0 => None,
            bytes => Some(prefetch::Prefetcher::new(rank, roots.clone(), bytes, tiers.eviction)?),
        };
        // Made once the first checkpoint or restore asks for quiet, or after
        // a restart's restore: nothing allocated beside that restore.
        // With the agent: the segments in shared memory, and the journal.
        let journal = match &tiers.journal {
            Some(root) => {
                let meta = journal::JournalMeta {
                    rank,
                    data_len,
                    opts: parts.opts.clone(),
                    tiers: disks.clone(),
                    listing,
                    compression: tiers.compression,
                };
                Some(journal::Journal::create(root, &meta)?)
            }
            None => None,
        };
        let mut cache = HostCache::held(
            tiers.host_cache_bytes,
            parts.backend.host_segments(journal.as_ref().map(|j| j.segments("seg"))),
        )?;
        if let Some(j) = &journal {
            cache.spill_into(j.segments("spill"));
        }
        let cache = Arc::new(cache);
        let progress = Progress::new(stores.iter().map(|(n, _)| n.clone()).collect());
        let restore_cache = prefetch.as_ref().map(|p| p.cache().clone());
        let shared = Arc::new(Shared {
            progress,
            needs_baseline: Default::default(),
            cache,
            restore_cache,
            inflight: Default::default(),
            copy_hold: Default::default(),
            journal,
        });
        let stores = stores.into_iter().map(|(name, store)| (tiers.keep_of(&name), name, store)).collect();
        let flusher = Flusher::start(rank, stores, Arc::clone(&shared), listing, tiers.compression)?;
        Ok(TieredEngine {
            backend: parts.backend,
            opts: parts.opts,
            shared,
            flusher,
            latest,
            chain_len,
            force_baseline: parts.force_baseline || disagree,
            rebuild_pending: parts.rebuild_pending.map(|v| (v, newest)),
            rank,
            roots,
            opened: parts.opened,
            collective: matches!(listing, Listing::Part { .. }),
            prefetch,
            restore_staging: Default::default(),
            gpu_cache_reads: Default::default(),
            device,
            remote: Default::default(),
        })
    }

    /// What opening found and cost.
    pub fn open_report(&self) -> &OpenReport {
        &self.opened
    }

    /// The CUDA device it de-duplicates on (CUDA backend; 0 otherwise).
    pub fn device(&self) -> usize {
        self.device
    }

    /// Where the CUDA backend's device budget went (the GPU cache tier's
    /// arena included); `None` on the CPU.
    pub fn device_plan(&self) -> Option<crate::backend::budget::DevicePlan> {
        self.backend.device_plan()
    }

    /// The backend in use.
    pub fn backend(&self) -> BackendKind {
        self.backend.kind()
    }

    /// The tiers' names, fastest first (`local`, `shared`).
    pub fn tiers(&self) -> &[String] {
        self.shared.progress.tiers()
    }

    /// The host cache's capacity and the bytes it holds now.
    pub fn cache_usage(&self) -> (u64, u64) {
        (self.shared.cache.capacity(), self.shared.cache.in_use())
    }

    /// Quiet from the host cache's background allocation while a call's
    /// device work runs ([`HostCache::quiet`]); the wait for an allocation
    /// in progress is span `cache-quiet`.
    fn quiet(&self, version: u64) -> cache::Quiet {
        self.shared.cache.release();
        self.quiet_held(version)
    }

    /// [`TieredEngine::quiet`] without releasing a cache still held (a
    /// restart's restore).
    fn quiet_held(&self, version: u64) -> cache::Quiet {
        let quiet = self.shared.cache.quiet();
        crate::profile::record("cache-quiet", version, quiet.waited);
        quiet
    }

    fn next_is_baseline(&self) -> bool {
        self.force_baseline
            || self.latest.is_none()
            || self.shared.needs_baseline.load(Ordering::SeqCst)
            || self.opts.max_chain.is_some_and(|max| self.chain_len >= max.max(1))
            || self.opts.max_record_entries.is_some_and(|max| self.backend.record_entries() > max)
    }

    /// Takes checkpoint `version` of the protected memory and returns as
    /// soon as the memory may change again: the diff is in the host cache,
    /// queued for every tier. On error nothing was queued and the history is
    /// unchanged.
    pub fn checkpoint<'a>(&mut self, version: u64, data: impl Into<Protected<'a>>) -> Result<TieredReport> {
        let handed = self.hand_over(version, data.into())?;
        self.submit_handed(handed)
    }

    /// Queues a version the backend has committed, whose file is in the
    /// cache, on every tier, with the rewrite its file needs (known now, or
    /// `late`). On error the next checkpoint is a baseline.
    fn enqueue(
        &mut self,
        version: u64,
        baseline: bool,
        cached: Arc<Cached>,
        sealed: bool,
        rewrite: Option<Rewrite>,
        late: Option<Arc<dyn LateRewrite>>,
    ) -> Result<()> {
        crate::failpoint::hit("checkpoint.cached");
        if baseline {
            // Every failure reported so far concerns an older version, which
            // this baseline's new chain no longer needs.
            self.shared.needs_baseline.store(false, Ordering::SeqCst);
        }
        let prev = if baseline { None } else { self.latest };
        self.shared.progress.register(version);
        self.latest = Some(version);
        if let Some(journal) = &self.shared.journal {
            // Bytes still arriving from a device are recorded by the first
            // tier's worker as soon as they are there.
            journal.record(version, baseline, prev, sealed, &cached);
        }
        if !self.collective {
            let flying = writeback::InFlight { cached: Arc::clone(&cached), baseline, prev, sealed };
            crate::sync::lock(&self.shared.inflight).insert(version, flying);
        }
        if let Err(e) =
            self.flusher.submit(Job { version, baseline, prev, sealed, rewrite, late, source: Source::Cache(cached) })
        {
            crate::sync::lock(&self.shared.inflight).remove(&version);
            // The history has this version but no tier will: start over.
            self.force_baseline = true;
            for tier in 0..self.roots.len() {
                self.shared.progress.set(version, tier, TierState::Failed(e.to_string()));
            }
            return Err(e);
        }
        self.chain_len = if baseline { 1 } else { self.chain_len + 1 };
        self.force_baseline = false;
        Ok(())
    }

    /// This engine's rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// How many diff files restores have read out of the GPU cache tier so
    /// far: files held there while the host cache was full, which a restore
    /// copies out instead of waiting for their flush.
    pub fn gpu_cache_reads(&self) -> u64 {
        self.gpu_cache_reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The tiers' root directories, fastest first.
    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// A retention pass on every tier, after what is queued (collective:
    /// once every rank's parts are written).
    pub(crate) fn retire_now(&self) {
        self.flusher.retire();
    }

    /// Waits for every queued version, runs a last retention pass and stops
    /// the flush workers; the first flush failure, if any.
    pub fn finalize(mut self) -> Result<()> {
        let result = self.shared.progress.wait_all();
        // Every version settled everywhere: retention may now delete what a
        // slower tier was still copying.
        self.flusher.retire();
        self.flusher.stop();
        self.close_journal();
        result
    }

    /// Removes the agent's journal once the flush has stopped (the
    /// segments' other holders, such as the cache's allocation thread, may
    /// outlive the engine for a moment).
    fn close_journal(&self) {
        if let Some(journal) = &self.shared.journal {
            journal.close();
        }
    }
}

impl Drop for TieredEngine {
    fn drop(&mut self) {
        // The flusher's own drop lets every queued version finish.
        self.flusher.stop();
        self.close_journal();
    }
}

/// The application side's sink of a checkpoint: the file into the host cache
/// (copied from parts, or written there by the device).
struct CacheSink<'c> {
    cache: &'c HostCache,
    /// The cached file, the wait for room, when the hand-over began, how
    /// long it took, and whether the file is sealed.
    handed: Option<(Cached, Duration, Instant, Duration, bool)>,
}

impl crate::backend::FileSink for CacheSink<'_> {
    fn put(&mut self, parts: &[&[u8]], sealed: bool) -> Result<()> {
        crate::failpoint::hit("checkpoint.deduplicated");
        let t1 = Instant::now();
        let (cached, waited) = self.cache.store_parts(parts)?;
        self.handed = Some((cached, waited, t1, t1.elapsed(), sealed));
        Ok(())
    }

    fn fill(&mut self, len: usize, sealed: bool, fill: &mut crate::backend::Fill<'_>) -> Result<()> {
        crate::failpoint::hit("checkpoint.deduplicated");
        let t1 = Instant::now();
        let (cached, waited) = self.cache.store_with(len, fill)?;
        self.handed = Some((cached, waited, t1, t1.elapsed(), sealed));
        Ok(())
    }

    fn has_room(&self, len: usize) -> bool {
        self.cache.has_room(len)
    }

    fn defer(&mut self, len: usize, sealed: bool, file: crate::backend::Deferred) -> Result<()> {
        crate::failpoint::hit("checkpoint.deduplicated");
        let t1 = Instant::now();
        let cached = self.cache.defer(len, file)?;
        self.handed = Some((cached, Duration::ZERO, t1, t1.elapsed(), sealed));
        Ok(())
    }
}

/// The report of a version queued after de-duplicating from `t0` and
/// copying into the cache from `t1` for `copied`, of which `waited` was
/// waiting for room.
#[allow(clippy::too_many_arguments)]
fn report_of(
    version: u64,
    baseline: bool,
    file_bytes: u64,
    t0: Instant,
    t1: Instant,
    copied: Duration,
    waited: Duration,
    gpu: Option<crate::backend::cuda::GpuTimings>,
) -> TieredReport {
    TieredReport {
        version,
        baseline,
        file_bytes,
        dedup_seconds: (t1 - t0).as_secs_f64(),
        cache_seconds: copied.saturating_sub(waited).as_secs_f64(),
        backpressure_seconds: waited.as_secs_f64(),
        total_seconds: t0.elapsed().as_secs_f64(),
        held_on_gpu: false,
        spilled: false,
        gpu,
    }
}
