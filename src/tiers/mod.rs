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

pub mod arena;
pub mod cache;
mod flusher;
pub mod prefetch;
mod reader;
pub mod state;
mod writeback;

use crate::backend::Deduplicated;
use crate::backend::budget::GpuCache;
use crate::backend::{Backend, BackendKind};
use crate::engine::LocalCheckpoint;
use crate::engine::{Engine, OpenReport, OpenWith, RebuildAt};
use crate::format::Compression;
use crate::layout::Layout;
use crate::memory::{Protected, ProtectedMut};
use crate::regions::{Conversion, Region, Rewrite};
use crate::restore::PendingMap;
use crate::store::{Store, StoreOptions};
use crate::{Error, Result};
use cache::Cached;
use cache::HostCache;
pub(crate) use flusher::Listing;
use flusher::{Flusher, Job, Shared, Source};
use reader::Reach;
use serde::{Deserialize, Serialize};
use state::{Progress, TierState};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

/// Where the tiers are and how large the cache is. Serde-able for configs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TierOptions {
    /// A node-local directory (fast scratch), if any.
    pub local: Option<PathBuf>,
    /// A shared directory every rank sees (a parallel file system), if any.
    pub shared: Option<PathBuf>,
    /// Bytes of host memory for the cache, allocated when the engine opens.
    /// A diff larger than this cannot be taken (a clear error).
    pub host_cache_bytes: u64,
    /// Compress each file's data on its way from the host cache to the
    /// first disk tier (in that tier's flush worker, off the application's
    /// path); later tiers copy the compressed file. `None`: plain files.
    pub compression: Option<Compression>,
    /// Retention on the local tier: keep the newest N versions there (and
    /// what their chains need), delete older ones as new versions become
    /// durable. `None`: keep every version.
    pub keep_local: Option<u64>,
    /// Retention on the shared tier, as `keep_local`.
    pub keep_shared: Option<u64>,
    /// Bytes of host memory for prefetched diff files
    /// ([`TieredEngine::prefetch_enqueue`]); 0: restores read the disk tiers.
    pub prefetch_cache_bytes: u64,
    /// What the prefetch cache evicts first.
    pub eviction: arena::Policy,
    /// The GPU cache tier (CUDA backend): device memory for diff files on
    /// their way to the host cache, part of `gpu_memory`'s budget
    /// (`crate::backend::budget::GpuCache`: `Auto` takes what the budget
    /// leaves spare, a size is taken first, 0 is none).
    pub gpu_cache: GpuCache,
}

impl Default for TierOptions {
    fn default() -> Self {
        TierOptions {
            local: None,
            shared: None,
            host_cache_bytes: 1 << 30,
            compression: None,
            keep_local: None,
            keep_shared: None,
            prefetch_cache_bytes: 0,
            eviction: arena::Policy::GapAware,
            gpu_cache: GpuCache::Auto,
        }
    }
}

impl TierOptions {
    /// The names of the disk tiers configured, fastest first.
    pub fn disks_named(&self) -> Vec<String> {
        self.disks().into_iter().map(|(name, _)| name).collect()
    }

    /// The retention of the disk tier named `name` (`local` or `shared`).
    fn keep_of(&self, name: &str) -> Option<u64> {
        if name == "local" { self.keep_local } else { self.keep_shared }
    }

    /// The disk tiers, fastest first, with their names.
    fn disks(&self) -> Vec<(String, PathBuf)> {
        let mut v = Vec::new();
        if let Some(p) = &self.local {
            v.push(("local".to_string(), p.clone()));
        }
        if let Some(p) = &self.shared {
            v.push(("shared".to_string(), p.clone()));
        }
        v
    }
}

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
    backend: Box<dyn Backend>,
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
}

/// A version handed to the host cache with no regions to offer
/// ([`TieredEngine::hand_over`]), not yet committed nor queued.
pub(crate) struct HandedVersion {
    handed: crate::backend::Handed,
    cached: Cached,
    sealed: bool,
    report: TieredReport,
    t0: Instant,
    cache_started: Instant,
    copied: Duration,
    waited: Duration,
}

impl HandedVersion {
    /// What the version cost the application until now.
    pub(crate) fn report(&self) -> TieredReport {
        self.report.clone()
    }

    /// The version's number.
    pub(crate) fn version(&self) -> u64 {
        self.report.version
    }

    /// The collective step's side of a version handed over before its
    /// diff was on the host (any thread; the application is not waiting):
    /// the diff decoded from the cached file's metadata, and its FIRST
    /// regions (nodes of at most `2^max_level` chunks) hashed from the
    /// cached FIRST bytes, by the digest rule every backend shares.
    pub(crate) fn describe(mut self, max_level: u32) -> Result<(CachedVersion, Vec<Region>)> {
        self.cached.ready()?;
        let cached = &self.cached;
        let short = || Error::Internal("a cached diff file shorter than its tables".into());
        let mut read = |at: u64, buf: &mut [u8]| cached.read_at(at as usize, buf).ok_or_else(short);
        let (version, data_start) = match (self.handed.pending.take(), self.handed.describe.take()) {
            (_, Some(describe)) => describe(&mut read)?,
            // Described already (the CPU): the data's place from the header.
            (Some(version), None) => {
                let mut header = [0u8; crate::format::diff_file::HEADER_LEN as usize];
                read(0, &mut header)?;
                let at = crate::format::data_start_of(&header, cached.len() as u64)
                    .map_err(|e| Error::Internal(format!("a cached diff file: {e}")))?;
                (version, at as usize)
            }
            (None, None) => return Err(Error::Internal("a handed-over version with nothing to describe it".into())),
        };
        // The FIRST data where it lies in one segment (a spilled file),
        // else gathered.
        let data = data_start..data_start + version.diff.data_bytes() as usize;
        let copied;
        let first = match cached.contiguous(data.clone()) {
            Some(bytes) => bytes,
            None => {
                let mut bytes = vec![0u8; data.len()];
                read(data.start as u64, &mut bytes)?;
                copied = bytes;
                &copied
            }
        };
        let regions = crate::regions::first_regions(
            &version.diff,
            &crate::regions::FirstBytes::gathered(&version.diff, first),
            max_level,
        );
        let HandedVersion { cached, sealed, t0, cache_started, copied, waited, .. } = self;
        let c = CachedVersion { version, cached, sealed, rewrite: None, started: t0, cache_started, copied, waited };
        Ok((c, regions))
    }
}

/// A version de-duplicated and copied into the host cache, not yet queued
/// (the collective step queues it once every rank has got this far).
pub(crate) struct CachedVersion {
    version: Deduplicated,
    cached: Cached,
    sealed: bool,
    /// The give-away's rewrite of the cached file, left to the flush.
    rewrite: Option<Rewrite>,
    started: Instant,
    cache_started: Instant,
    copied: Duration,
    waited: Duration,
}

impl CachedVersion {
    /// Turns the converted regions into references to their owners after
    /// the hand-over (the collective step run in the background): the diff
    /// and the pending record change; the cached bytes wait for
    /// [`TieredEngine::settle_given_away`]'s rewrite.
    pub(crate) fn give_away(&mut self, conv: &[Conversion], layouts: &[Layout]) -> Result<()> {
        self.version.give_away(conv, layouts)
    }

    /// What the version cost the application until now (its file's length
    /// after the rewrite, if one is attached).
    pub(crate) fn report(&self) -> TieredReport {
        let file_bytes = self.rewrite.as_ref().map_or(self.cached.len() as u64, Rewrite::file_len);
        let (v, d) = (&self.version, &self.version.diff);
        let mut report = report_of(
            d.version,
            d.baseline,
            file_bytes,
            self.started,
            self.cache_started,
            self.copied,
            self.waited,
            v.gpu,
        );
        report.held_on_gpu = self.cached.deferred();
        report.spilled = self.cached.spilled();
        report
    }
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
        Self::open_for(rank, data_len, opts, tiers, backend, 0, Listing::Manifest)
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
        let mut stores: Vec<(String, Store)> = Vec::with_capacity(disks.len());
        let mut base = Some(parts.store);
        for (i, (name, root)) in disks.iter().enumerate() {
            let store = match base.take_if(|_| i == newest) {
                Some(s) => s,
                None => Store::open_writer(root, rank, data_len, opts)?.0,
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
        let cache = Arc::new(HostCache::with_memory(tiers.host_cache_bytes, parts.backend.host_segments())?);
        let progress = Progress::new(stores.iter().map(|(n, _)| n.clone()).collect());
        let restore_cache = prefetch.as_ref().map(|p| p.cache().clone());
        let shared = Arc::new(Shared {
            progress,
            needs_baseline: Default::default(),
            cache,
            restore_cache,
            inflight: Default::default(),
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

    /// The call's part of a checkpoint with no regions to offer (one
    /// rank, or local-only): de-duplicates `input` and hands its file to
    /// the host cache, nothing more on the host (a device-made diff's
    /// tables are not decoded); the version stays pending until
    /// [`TieredEngine::submit_handed`] or [`TieredEngine::abandon`].
    pub(crate) fn hand_over(&mut self, version: u64, input: Protected<'_>) -> Result<HandedVersion> {
        let t0 = Instant::now();
        let _quiet = self.quiet(version);
        self.rebuild_if_pending();
        if let Some(latest) = self.latest.filter(|&l| l >= version) {
            return Err(Error::VersionNotNewer { latest, requested: version });
        }
        let baseline = self.next_is_baseline();
        let mut sink = CacheSink { cache: &self.shared.cache, handed: None };
        let handed = self.backend.hand_over_new(version, input, baseline, &mut sink)?;
        let Some((cached, waited, t1, copied, sealed)) = sink.handed else {
            self.backend.rollback()?;
            return Err(Error::Internal("the backend handed no file over".into()));
        };
        let file_bytes = cached.len() as u64;
        let baseline = handed.baseline;
        let mut report = report_of(version, baseline, file_bytes, t0, t1, copied, waited, handed.gpu);
        report.held_on_gpu = cached.deferred();
        report.spilled = cached.spilled();
        Ok(HandedVersion { handed, cached, sealed, report, t0, cache_started: t1, copied, waited })
    }

    /// Commits a version [`TieredEngine::hand_over`] cached and queues it on
    /// every tier. On error the next checkpoint is a baseline.
    pub(crate) fn submit_handed(&mut self, h: HandedVersion) -> Result<TieredReport> {
        let HandedVersion { handed, cached, sealed, mut report, t0, .. } = h;
        self.backend.commit_handed(handed)?;
        self.enqueue(report.version, report.baseline, cached, sealed, None)?;
        report.total_seconds = t0.elapsed().as_secs_f64();
        Ok(report)
    }

    /// Queues a version the backend has committed, whose file is in the
    /// cache, on every tier. On error the next checkpoint is a baseline.
    fn enqueue(
        &mut self,
        version: u64,
        baseline: bool,
        cached: Cached,
        sealed: bool,
        rewrite: Option<Rewrite>,
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
        let cached = Arc::new(cached);
        if !self.collective {
            let flying = writeback::InFlight { cached: Arc::clone(&cached), baseline, prev, sealed };
            self.shared.inflight.lock().unwrap_or_else(PoisonError::into_inner).insert(version, flying);
        }
        if let Err(e) =
            self.flusher.submit(Job { version, baseline, prev, sealed, rewrite, source: Source::Cache(cached) })
        {
            self.shared.inflight.lock().unwrap_or_else(PoisonError::into_inner).remove(&version);
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

    /// Collective step 1: de-duplicates `input` without changing the
    /// history (the backend keeps it pending).
    pub(crate) fn deduplicate_local<'a>(&mut self, version: u64, input: Protected<'a>) -> Result<LocalCheckpoint<'a>> {
        let _quiet = self.quiet(version);
        self.rebuild_if_pending();
        if let Some(latest) = self.latest.filter(|&l| l >= version) {
            return Err(Error::VersionNotNewer { latest, requested: version });
        }
        let baseline = self.next_is_baseline();
        let started = Instant::now();
        let version = self.backend.deduplicate(version, input, baseline)?;
        Ok(LocalCheckpoint::new(version, started, input))
    }

    /// The regions `local` offers to the collective step
    /// ([`Engine::regions`]).
    pub(crate) fn regions(&mut self, local: &LocalCheckpoint<'_>, data: &[u8], max_level: u32) -> Result<Vec<Region>> {
        self.backend.regions(local.deduplicated(), data, max_level)
    }

    /// Collective step 2: serializes the (rewritten) diff into the host
    /// cache; still reversible ([`TieredEngine::abandon`]). `data` is the
    /// protected buffer on the CPU backend.
    pub(crate) fn cache(&mut self, local: LocalCheckpoint<'_>, data: &[u8]) -> Result<CachedVersion> {
        let (mut version, started) = local.into_inner();
        let _quiet = self.quiet(version.diff.version);
        let mut sink = CacheSink { cache: &self.shared.cache, handed: None };
        let rewrite = self.backend.hand_over(&mut version, data, &mut sink)?;
        let (cached, waited, cache_started, copied, sealed) =
            sink.handed.ok_or_else(|| Error::Internal("the backend handed no file over".into()))?;
        Ok(CachedVersion { version, cached, sealed, rewrite, started, cache_started, copied, waited })
    }

    /// Collective step 2b, for a version cached before its regions were
    /// given away ([`CachedVersion::give_away`]): moves the backend's record
    /// entries and attaches the rewrite the cached file needs.
    pub(crate) fn settle_given_away(&mut self, c: &mut CachedVersion) -> Result<()> {
        let _quiet = self.quiet(c.version.diff.version);
        if let Some(rewrite) = self.backend.settle_given_away(&mut c.version)? {
            c.rewrite = Some(rewrite);
        }
        Ok(())
    }

    /// Collective step 3 (every rank has cached its file): the backend
    /// commits the version and the flush workers take it.
    pub(crate) fn submit(&mut self, c: CachedVersion) -> Result<TieredReport> {
        let report = c.report();
        let CachedVersion { version, cached, sealed, rewrite, .. } = c;
        let (number, baseline) = (version.diff.version, version.diff.baseline);
        {
            let _span = crate::profile::Span::new("submit-commit", number);
            self.backend.commit(version)?;
        }
        let _span = crate::profile::Span::new("submit-enqueue", number);
        self.enqueue(number, baseline, cached, sealed, rewrite)?;
        Ok(report)
    }

    /// Marks `version` failed on every tier with `reason` (the collective
    /// step gave it up after its call returned): [`TieredEngine::wait`]
    /// then says why.
    pub(crate) fn fail_version(&self, version: u64, reason: &str) {
        self.shared.progress.register(version);
        for tier in 0..self.roots.len() {
            self.shared.progress.set(version, tier, TierState::Failed(reason.to_string()));
        }
    }

    /// Gives up a version between steps 1 and 3 (another rank failed): the
    /// backend's state is as before it; cached bytes go back when dropped.
    pub(crate) fn abandon(&mut self) -> Result<()> {
        self.backend.rollback()
    }

    /// Makes the next version a baseline (the collective step asks for it
    /// when any rank needs one).
    pub(crate) fn force_baseline(&mut self) {
        self.force_baseline = true;
    }

    /// Whether the next version will be a baseline.
    /// (A state still to be rebuilt is rebuilt first: a rebuild that fails
    /// makes it one.)
    pub(crate) fn next_baseline(&mut self) -> bool {
        self.rebuild_if_pending();
        self.next_is_baseline()
    }

    /// The newest version taken (or found committed at open).
    pub fn latest(&self) -> Option<u64> {
        self.latest
    }

    /// Blocks until `version` is durable on every tier; an error names the
    /// tier where it is not (it may still be durable on another: see
    /// [`TieredEngine::is_durable`]).
    pub fn wait(&self, version: u64) -> Result<()> {
        let tracked = self.shared.progress.states(version).is_some();
        if !tracked && self.latest.is_none_or(|l| version > l) {
            return Err(Error::MissingVersion { dir: self.roots[0].clone(), rank: self.rank, version });
        }
        if self.shared.progress.wait(version)? {
            return Ok(());
        }
        // Not tracked (an earlier run's version, a checkpoint that failed,
        // or one durable everywhere long ago): the tiers' manifests say.
        for (i, tier) in self.tiers().iter().enumerate() {
            if !self.listed(version, i) {
                return Err(Error::NotDurable {
                    version,
                    tier: tier.clone(),
                    reason: format!("it is not listed in {}", self.roots[i].display()),
                });
            }
        }
        Ok(())
    }

    /// Whether `version` was taken in this run or is listed on some tier.
    pub fn knows(&self, version: u64) -> bool {
        self.shared.progress.states(version).is_some() || (0..self.roots.len()).any(|i| self.listed(version, i))
    }

    /// This engine's rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Whether tier `i`'s manifest lists `version` now.
    fn listed(&self, version: u64, i: usize) -> bool {
        Store::open(&self.roots[i], self.rank).is_ok_and(|s| s.manifest().get(version).is_some())
    }

    /// Blocks until every version taken so far is settled on every tier;
    /// the first failure, if any. Then asks for a retention pass (in the
    /// background), which may now delete what a slower tier was still
    /// copying during the last one.
    pub fn wait_all(&self) -> Result<()> {
        let result = self.shared.progress.wait_all();
        self.flusher.retire();
        result
    }

    /// Whether `version` is durable on tier `tier` (its name) now: listed
    /// there, and for a collective version committed there (every rank's
    /// files durable on that tier).
    pub fn is_durable(&self, version: u64, tier: &str) -> bool {
        let Some(i) = self.tiers().iter().position(|t| t == tier) else { return false };
        match self.shared.progress.states(version) {
            // This rank's file is durable; a collective version needs every rank's.
            Some(states) if states.get(i) == Some(&TierState::Durable) => !self.collective || self.listed(version, i),
            Some(_) => false,
            // Not tracked any more: the tier's manifest says.
            None => self.listed(version, i),
        }
    }

    /// Whether this rank's own file of `version` is durable on every tier
    /// (the collective `wait` combines every rank's answer); per tier.
    pub(crate) fn own_durable(&self, version: u64) -> Vec<bool> {
        let _ = self.shared.progress.wait(version);
        match self.shared.progress.states(version) {
            // Retired: it was durable there (retention deleted it since).
            Some(states) => states.iter().map(|s| matches!(s, TierState::Durable | TierState::Retired)).collect(),
            None => (0..self.roots.len()).map(|i| self.listed(version, i)).collect(),
        }
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

    /// A version's state on every tier (`None` once it is no longer tracked).
    pub fn states(&self, version: u64) -> Option<Vec<TierState>> {
        self.shared.progress.states(version)
    }

    /// Restores `version` into `dst`, every byte verified. A version still
    /// in the host cache is restored from there at once; otherwise as soon
    /// as some tier has it durable (waiting tier by tier, fastest first):
    /// its metadata from the fastest tier listing it, each file of its chain
    /// from the restore cache or the fastest tier holding it. If that fails
    /// (a damaged copy), from each tier listing it alone. The error, if
    /// every way fails, is the first one's; host memory is restored in
    /// place, so after an error its content is unspecified.
    pub fn restore_into(&self, version: u64, mut dst: ProtectedMut<'_>) -> Result<()> {
        let _quiet = self.quiet(version);
        self.restore_mapped(version, &mut dst).map(PendingMap::discard)
    }

    /// A restart's restore: `version` restored into `dst` as
    /// [`TieredEngine::restore_into`] does, and the de-duplication state
    /// rebuilt from those same bytes (on the device for device memory), so
    /// that the next checkpoint continues from it; nothing is read twice.
    /// A version older than the newest taken makes the next checkpoint a
    /// baseline (the record points into its chain, which retention may
    /// drop once newer chains exist).
    pub fn restart_into(&mut self, version: u64, mut dst: ProtectedMut<'_>) -> Result<()> {
        let _quiet = self.quiet(version);
        let map = self.restore_mapped(version, &mut dst)?;
        let _span = crate::profile::Span::new("restart-rebuild", version);
        let data = match &dst {
            ProtectedMut::Host(bytes) => Protected::Host(bytes),
            ProtectedMut::Device(region) => Protected::Device(*region),
        };
        match self.backend.rebuild_from(version, data, map) {
            Ok(()) => self.rebuild_pending = None,
            Err(e) => {
                tracing::warn!(
                    "rank {}: rebuilding from version {version}: {e}; the next checkpoint is a baseline",
                    self.rank
                );
                self.force_baseline = true;
                self.rebuild_pending = None;
            }
        }
        if self.latest != Some(version) {
            self.force_baseline = true;
        }
        Ok(())
    }

    /// Rebuilds the backend's state from the newest committed version if
    /// no restart did (the first checkpoint after opening a store).
    fn rebuild_if_pending(&mut self) {
        if let Some((version, tier)) = self.rebuild_pending.take()
            && !crate::engine::rebuild_from_disk(
                self.backend.as_mut(),
                &self.roots[tier],
                self.rank,
                version,
                &mut self.opened,
            )
        {
            self.force_baseline = true;
        }
    }

    /// [`TieredEngine::restore_into`], returning where the version's chunks
    /// are stored (the map still to be made).
    fn restore_mapped(&self, version: u64, dst: &mut ProtectedMut<'_>) -> Result<PendingMap> {
        let _span = crate::profile::Span::new("restore", version);
        // Still in the host cache: from there, without waiting for its flush.
        let (overlay, mut first_error) =
            match writeback::Overlay::of(&self.shared.inflight, &self.roots[0], self.rank, version) {
                Ok(overlay) => (overlay, None),
                Err(e) => (None, Some(e)),
            };
        let mut map = None;
        let mut attempt = |home: usize, reach: Reach, overlay: Option<writeback::Overlay>| match self.restore_from(
            version,
            home,
            reach,
            overlay.map(Arc::new),
            dst,
        ) {
            Ok(m) => {
                map = Some(m);
                true
            }
            Err(e) => {
                first_error.get_or_insert(e);
                false
            }
        };
        let mut restored = false;
        if let Some(overlay) = overlay {
            self.gpu_cache_reads.fetch_add(overlay.peeked() as u64, std::sync::atomic::Ordering::Relaxed);
            restored = attempt(0, Reach::Fastest, Some(overlay));
        }
        let home = if restored { None } else { self.first_durable(version) };
        if let Some(home) = home {
            restored = attempt(home, Reach::Fastest, None) || attempt(home, Reach::HomeOnly, None);
        }
        if !restored {
            // The slower tiers, once they have settled it.
            let _ = self.shared.progress.wait(version);
            for (i, tier) in self.tiers().iter().enumerate() {
                if Some(i) != home && self.is_durable(version, tier) && attempt(i, Reach::HomeOnly, None) {
                    break;
                }
            }
        }
        if let Some(map) = map {
            return Ok(map);
        }
        Err(first_error.unwrap_or_else(|| Error::MissingVersion {
            dir: self.roots[0].clone(),
            rank: self.rank,
            version,
        }))
    }

    /// One way of restoring `version` (listed on tier `home`, or in flight
    /// through `overlay`) into `dst`: host memory in place, device memory
    /// through a host buffer.
    fn restore_from(
        &self,
        version: u64,
        home: usize,
        reach: Reach,
        overlay: Option<Arc<writeback::Overlay>>,
        dst: &mut ProtectedMut<'_>,
    ) -> Result<PendingMap> {
        let cache = self.prefetch.as_ref().map(prefetch::Prefetcher::cache);
        let at = reader::At { roots: &self.roots, home, overlay };
        match dst {
            ProtectedMut::Host(buf) => reader::restore(at, self.rank, version, reach, cache, buf),
            ProtectedMut::Device(region) => {
                // Through a reused host buffer (page-locked on the CUDA
                // backend: no page faults, and the H2D at full speed).
                let mut staging = self.restore_staging.lock().unwrap_or_else(PoisonError::into_inner);
                // A new buffer is made (every page touched) on a thread of
                // its own while the restore resolves the version.
                let len = region.len();
                let making = match staging.as_ref().is_none_or(|s| s.bytes().len() != len) {
                    true => {
                        *staging = None; // freed before the new one is allocated
                        Some(std::thread::spawn(move || crate::memory::HeapSegment::prefaulted(len)))
                    }
                    false => None,
                };
                let slot = &mut *staging;
                let map = reader::restore_with(at, self.rank, version, reach, cache, |want| {
                    if let Some(making) = making {
                        let _span = crate::profile::Span::new("restore-staging", version);
                        let made = making.join().map_err(|_| Error::Internal("making the restore buffer".into()))?;
                        *slot = Some(Box::new(made));
                    }
                    let buf = slot.as_mut().ok_or_else(|| Error::Internal("restore staging".into()))?.bytes_mut();
                    match buf.len() == want {
                        true => Ok(buf),
                        false => {
                            Err(Error::InvalidOption(format!("{want} restored bytes do not fit a {len}-byte region")))
                        }
                    }
                })?;
                let buf = staging.as_ref().ok_or_else(|| Error::Internal("restore staging".into()))?.bytes();
                let _span = crate::profile::Span::new("restore-upload", version);
                self.backend.place(buf, ProtectedMut::Device(*region))?;
                Ok(map)
            }
        }
    }

    /// The fastest tier where `version` is durable, waiting for each tier
    /// in turn to settle it (a version still in flight restores as soon as
    /// the first tier has it).
    fn first_durable(&self, version: u64) -> Option<usize> {
        (0..self.roots.len()).find(|&i| {
            self.shared.progress.wait_tier(version, i);
            self.is_durable(version, &self.tiers()[i])
        })
    }

    /// A restart's restore: the newest version listed on any tier that
    /// restores intact (every byte verified), from the fastest tier holding
    /// it intact, into `dst`. Newer versions that are damaged on every tier
    /// are skipped, each with the reason, in [`Restored::skipped`].
    pub fn restore_latest(&self, dst: ProtectedMut<'_>) -> Result<Restored> {
        let _ = self.shared.progress.wait_all();
        let listed: Vec<Vec<u64>> = self
            .roots
            .iter()
            .map(|root| {
                Store::open(root, self.rank)
                    .map(|s| s.manifest().versions.iter().map(|v| v.version).collect())
                    .unwrap_or_default()
            })
            .collect();
        let mut candidates: Vec<u64> = listed.iter().flatten().copied().collect();
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        candidates.dedup();
        let (mut skipped, mut first_error) = (Vec::new(), None);
        for version in candidates {
            for (i, tier) in self.tiers().iter().enumerate() {
                if !listed[i].contains(&version) {
                    continue;
                }
                match crate::restore::restore_version(&self.roots[i], self.rank, version) {
                    Ok(bytes) => {
                        self.backend.place(&bytes, dst)?;
                        return Ok(Restored { version, tier: tier.clone(), skipped });
                    }
                    Err(e) => {
                        skipped.push(format!("version {version} on the {tier} tier: {e}"));
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        // Nothing restores: the newest version's error, or no version at all.
        Err(first_error.unwrap_or_else(|| Error::NoStore { dir: self.roots[0].clone(), rank: self.rank }))
    }

    /// Hints that `version` will be restored after the versions hinted
    /// before it (a no-op without a prefetch cache). Once started, a
    /// background thread loads the hinted versions' files from the fastest
    /// tier holding them into the prefetch cache, in hint order.
    pub fn prefetch_enqueue(&self, version: u64) {
        if let Some(p) = &self.prefetch {
            p.enqueue(version);
        }
    }

    /// Starts prefetching the hinted versions (a no-op without a cache).
    pub fn prefetch_start(&self) {
        if let Some(p) = &self.prefetch {
            p.start();
        }
    }

    /// What the prefetch cache did so far (`None` without one).
    pub fn prefetch_stats(&self) -> Option<prefetch::PrefetchStats> {
        self.prefetch.as_ref().map(prefetch::Prefetcher::stats)
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
        result
    }
}

impl Drop for TieredEngine {
    fn drop(&mut self) {
        // The flusher's own drop lets every queued version finish.
        self.flusher.stop();
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
