//! The background flush: one worker thread per disk tier, in a pipeline.
//! The first tier's worker writes each version from the host cache, then
//! gives the cache segments back and hands the version to the next tier's
//! worker, which copies the first tier's file (or, if that write failed,
//! the cached bytes). Each tier is a [`Store`] with its own manifest and the
//! store's commit protocol, so a version is listed on a tier only once its
//! file is durable there.
//!
//! How a durable file is listed depends on the [`Listing`]: a single rank
//! publishes it in its manifest (the store's commit point); a rank of an
//! asynchronous collective writes its commit part, and the version is
//! committed on the tier once every rank's part is there
//! (`crate::store::commits`).
//!
//! A version whose chain is incomplete on a tier (an earlier version of it
//! failed there) fails there too: a chain is never listed with a hole. Any
//! failure asks the application side for a baseline, which starts a new
//! chain on every tier.

use super::cache::{Cached, HostCache};
use super::listing::Listing;
use super::prefetch::RestoreCache;
use super::state::{Progress, TierState};
use super::write::{CacheWrite, list_written, write_cached, write_copied};
use super::writeback::InFlightMap;
use crate::error::{Error, Result};
use crate::format::Compression;
use crate::regions::Rewrite;
use crate::store::commits::{CommitLog, parse_part_name};
use crate::store::{StoreWriter, rank_rel, versions_present};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

/// One version to flush.
pub(crate) struct Job {
    /// The version.
    pub version: u64,
    /// Whether it is a baseline.
    pub baseline: bool,
    /// The version before it in its chain (`None` for a baseline).
    pub prev: Option<u64>,
    /// Whether the cached file carries its trailer (the GPU hands its files
    /// over unsealed; the first tier seals them). Not read while a rewrite
    /// is pending (the rewrite makes a sealed file).
    pub sealed: bool,
    /// A rewrite the cached bytes still need (regions given away by the
    /// collective step): applied here, off the application's path.
    pub rewrite: Option<Rewrite>,
    /// The rewrite when it is decided after the version was queued (the
    /// collective step running beside the application): the first worker
    /// to see the job waits for it.
    pub late: Option<Arc<dyn LateRewrite>>,
    /// Where its bytes are now.
    pub source: Source,
}

/// A rewrite decided after its version was queued: the collective step of
/// a version committed before the step ran gives regions away (a rewrite)
/// or keeps them (none).
pub(crate) trait LateRewrite: Send + Sync {
    /// Blocks until the step has decided; the rewrite the cached file
    /// needs, if any.
    fn wait(&self) -> Option<Rewrite>;
}

/// What a worker receives.
pub(crate) enum Msg {
    /// A version to flush.
    Flush(Box<Job>),
    /// A retention pass now (forwarded to the next tier): in collective
    /// mode a worker's pass after its own flush may precede other ranks'
    /// parts, so the last pass runs once every rank is done.
    Retire,
}

/// Where a version's file is read from.
pub(crate) enum Source {
    /// The host cache (shared with restores of versions in flight).
    Cache(Arc<Cached>),
    /// A durable file on an earlier tier, with its length.
    File(PathBuf, u64),
}

/// What each tier worker shares with the application side.
pub(crate) struct Shared {
    /// Per-version, per-tier states.
    pub progress: Progress,
    /// Set by a worker when a version failed somewhere: the next checkpoint
    /// must be a baseline.
    pub needs_baseline: AtomicBool,
    /// The host cache (a cached file's segments go back when it is dropped).
    pub cache: Arc<HostCache>,
    /// The restore cache, if any: the first tier's worker leaves each file
    /// it made durable there (the versions written last restore from memory).
    pub restore_cache: Option<RestoreCache>,
    /// Versions the first tier has not settled yet, for restores from the
    /// host cache (single-rank tiers; the first tier's worker removes each
    /// once it is listed there, or failed).
    pub inflight: InFlightMap,
    /// The versions another process still copies from one tier (the
    /// node-local tier's redundancy copies): retention keeps them there.
    pub copy_hold: CopyHold,
    /// The journal the per-node agent finishes flushes from if this
    /// process dies (`agent = "auto"`), if any.
    pub journal: Option<Arc<super::journal::Journal>>,
}

/// Versions whose files on one tier are still to be copied elsewhere (by
/// the collective layer's protection, through a
/// [`TierWatch`](super::durability::TierWatch)): retention on that tier
/// deletes a version only once its copies are over (made or failed). No
/// tier is held until a protection starts.
#[derive(Debug)]
pub(crate) struct CopyHold {
    /// The tier held (`usize::MAX`: none).
    tier: AtomicUsize,
    /// The newest version whose copies are over (they finish in order).
    through: AtomicU64,
}

impl Default for CopyHold {
    fn default() -> Self {
        CopyHold { tier: AtomicUsize::new(usize::MAX), through: AtomicU64::new(0) }
    }
}

impl CopyHold {
    /// Holds tier `tier` from now on: no version there is copied yet.
    pub fn hold(&self, tier: usize) {
        self.through.store(0, Ordering::SeqCst);
        self.tier.store(tier, Ordering::SeqCst);
    }

    /// `version`'s copies are over (and those of every version before it).
    pub fn copied(&self, version: u64) {
        self.through.fetch_max(version, Ordering::SeqCst);
    }

    /// Whether retention on `tier` may delete `version` as far as copies go.
    pub fn released(&self, tier: usize, version: u64) -> bool {
        self.tier.load(Ordering::SeqCst) != tier || version <= self.through.load(Ordering::SeqCst)
    }
}

/// The running workers.
pub(crate) struct Flusher {
    first: Option<Sender<Msg>>,
    workers: Vec<JoinHandle<()>>,
}

impl Flusher {
    /// Starts one worker per store of `rank` (tier order: fastest first;
    /// each with its retention, if any); the first compresses each file
    /// with `compression`, if any.
    pub fn start(
        rank: u32,
        stores: Vec<(Option<u64>, String, StoreWriter)>,
        shared: Arc<Shared>,
        listing: Listing,
        compression: Option<Compression>,
    ) -> Result<Self> {
        let mut workers = Vec::new();
        let mut next: Option<Sender<Msg>> = None;
        let count = stores.len();
        // Built from the last tier back, so each worker knows its successor.
        for (i, (keep, name, store)) in stores.into_iter().enumerate().rev() {
            let (tx, rx) = channel::<Msg>();
            let worker = Worker {
                rank,
                tier: i,
                name,
                store,
                last: None,
                shared: Arc::clone(&shared),
                next: next.take(),
                listing,
                compression,
                keep,
            };
            let handle = std::thread::Builder::new()
                .name(format!("dckpt-flush-{i}"))
                .spawn(move || worker.run(rx))
                .map_err(|e| Error::no_thread("a flush thread", e))?;
            workers.push(handle);
            next = Some(tx);
        }
        debug_assert_eq!(workers.len(), count);
        Ok(Flusher { first: next, workers })
    }

    /// Queues a version (the first tier takes it next).
    pub fn submit(&self, job: Job) -> Result<()> {
        let Some(tx) = &self.first else { return Err(Error::Internal("the flusher has stopped".into())) };
        tx.send(Msg::Flush(Box::new(job))).map_err(|_| Error::Internal("a flush thread has stopped".into()))
    }

    /// Asks every tier for a retention pass (after what is queued).
    pub fn retire(&self) {
        if let Some(tx) = &self.first {
            // A stopped flusher has nothing left to retire.
            let _ = tx.send(Msg::Retire);
        }
    }

    /// Lets every queued version finish, then stops the workers.
    pub fn stop(&mut self) {
        self.first = None;
        for w in self.workers.drain(..) {
            // A worker that panicked has failed what it left (SettleOnExit).
            let _ = w.join();
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One tier's worker.
struct Worker {
    /// The rank whose files it writes.
    rank: u32,
    tier: usize,
    name: String,
    store: StoreWriter,
    /// The newest version durable here, and whether it ends an intact chain.
    last: Option<u64>,
    shared: Arc<Shared>,
    next: Option<Sender<Msg>>,
    listing: Listing,
    /// Compression applied to files taken from the cache (the first tier;
    /// later tiers copy its file).
    compression: Option<Compression>,
    /// Retention: the newest versions to keep on this tier.
    keep: Option<u64>,
}

impl Worker {
    fn run(mut self, rx: Receiver<Msg>) {
        // However this thread ends (its queue closed, or a panic), what it
        // never settled is failed, so that no `wait` blocks forever.
        let _settle = SettleOnExit { shared: Arc::clone(&self.shared), tier: self.tier, name: self.name.clone() };
        // Versions already on this tier when the flush started.
        self.last = self.store.manifest().latest().map(|v| v.version);
        while let Ok(msg) = rx.recv() {
            let mut job = match msg {
                Msg::Flush(job) => *job,
                Msg::Retire => {
                    self.retire_marking();
                    if let Some(next) = &self.next {
                        let _ = next.send(Msg::Retire);
                    }
                    continue;
                }
            };
            let version = job.version;
            if self.tier == 0
                && let (Some(journal), Source::Cache(c)) = (&self.shared.journal, &job.source)
                && c.ready().is_ok()
            {
                // A device's copy just arrived (the call returned before it):
                // journaled now, not after the collective step decides.
                journal.record(version, job.baseline, job.prev, job.sealed, c);
            }
            if let Some(late) = job.late.take() {
                let _span = crate::profile::Span::new("flush-wait-step", version);
                job.rewrite = late.wait();
            }
            self.shared.progress.set(version, self.tier, TierState::Writing);
            let outcome = self.flush(&job);
            let state = match &outcome {
                Ok(len) => {
                    tracing::debug!("version {version}: durable on the {} tier ({len} bytes)", self.name);
                    crate::failpoint::hit("flush.durable");
                    self.last = Some(version);
                    self.retire_marking();
                    TierState::Durable
                }
                Err(e) => {
                    tracing::info!(
                        "version {version}: not durable on the {} tier: {e}; the next checkpoint is a baseline",
                        self.name
                    );
                    self.shared.needs_baseline.store(true, Ordering::SeqCst);
                    TierState::Failed(e.to_string())
                }
            };
            if let Some(journal) = &self.shared.journal {
                // Before the cache segments go back (below): the agent must
                // never read segments lent again.
                journal.settle(version, self.tier, outcome.is_ok());
            }
            // What the next tier reads: this tier's file if it is durable
            // (the cache segments go back now), else the cached bytes; the
            // last tier gives them back in any case.
            let forward = match job.source {
                Source::Cache(c) if outcome.is_ok() || self.next.is_none() => {
                    // The file as written here (a rewrite changes its length).
                    let len = outcome.as_ref().map_or(c.len() as u64, |l| *l);
                    drop(c); // the segments go back to the cache
                    Source::File(self.store.diff_path(version), len)
                }
                s => s,
            };
            self.shared.progress.set(version, self.tier, state);
            if self.tier == 0 {
                // Listed here (or failed): restores no longer need the cached bytes.
                crate::sync::lock(&self.shared.inflight).remove(&version);
            }
            if let Some(next) = &self.next {
                // A forwarded file is sealed and rewritten; cached bytes keep their state.
                let from_file = matches!(forward, Source::File(..));
                let sealed = job.sealed || from_file;
                let rewrite = if from_file { None } else { job.rewrite };
                let job = Job {
                    version,
                    baseline: job.baseline,
                    prev: job.prev,
                    sealed,
                    rewrite,
                    late: None,
                    source: forward,
                };
                // A stopped successor drops the job (and any cache segments
                // with it); the version is then not durable there.
                if next.send(Msg::Flush(Box::new(job))).is_err() {
                    self.shared.needs_baseline.store(true, Ordering::SeqCst);
                    let why = "the flush thread of the next tier has stopped".to_string();
                    self.shared.progress.set(version, self.tier + 1, TierState::Failed(why));
                }
            }
        }
    }

    /// Writes and lists one version on this tier; the file's length.
    fn flush(&mut self, job: &Job) -> Result<u64> {
        let (len, retained) = self.write_and_list(job)?;
        if let (Some(bytes), Some(cache)) = (retained, &self.shared.restore_cache) {
            cache.offer_written((self.rank, job.version), bytes);
        }
        Ok(len)
    }

    /// Whether this worker keeps a copy of a file of `len` bytes it writes
    /// from the host cache, for the restore cache.
    fn retains(&self, len: u64) -> bool {
        self.tier == 0 && self.shared.restore_cache.as_ref().is_some_and(|c| c.fits(len))
    }

    /// Writes and lists one version on this tier: the file's length, and
    /// its bytes if the restore cache may keep them ([`Worker::retains`]).
    fn write_and_list(&mut self, job: &Job) -> Result<(u64, Option<Vec<u8>>)> {
        if !job.baseline && job.prev != self.last {
            return Err(Error::NotDurable {
                version: job.version,
                tier: self.name.clone(),
                reason: format!(
                    "its chain is incomplete on this tier (version {} is missing); the next checkpoint is a baseline",
                    job.prev.map_or_else(|| "?".into(), |p| p.to_string())
                ),
            });
        }
        let (entry, retained) = match &job.source {
            Source::Cache(c) => {
                // A device may still be copying the file in.
                c.ready()?;
                let retain = |len: u64| self.retains(len);
                let how =
                    CacheWrite { rewrite: job.rewrite.as_ref(), sealed: job.sealed, compression: self.compression };
                write_cached(&self.store, job.version, job.baseline, c.as_ref(), &how, &retain)?
            }
            Source::File(path, len) => (write_copied(&self.store, job.version, job.baseline, path, *len)?, None),
        };
        let len = entry.file_len;
        list_written(&mut self.store, self.listing, job.version, job.baseline, job.prev, entry)?;
        Ok((len, retained))
    }
}

impl Worker {
    /// A retention pass; the versions it deleted are `Retired` on this tier.
    /// Retention never fails a version: what it could not delete stays for
    /// the next pass (or `dckpt prune`).
    fn retire_marking(&mut self) {
        for old in self.retire().unwrap_or_default() {
            self.shared.progress.set(old, self.tier, TierState::Retired);
        }
    }

    /// Retention: deletes this rank's versions older than the chain start
    /// of the oldest of the newest `keep` versions committed on this tier;
    /// the versions deleted. With collective parts, the chain start is the
    /// earliest over every rank (a version dense on one rank is a baseline
    /// there only), so no kept version of any rank references a deleted
    /// file; versions committed by a full record are left to `dckpt prune`.
    fn retire(&mut self) -> Result<Vec<u64>> {
        let Some(keep) = self.keep.and_then(|k| usize::try_from(k).ok()) else { return Ok(Vec::new()) };
        let (doomed, part_of) = match self.listing {
            Listing::Manifest => {
                let m = self.store.manifest();
                let Some(oldest) = m.versions.len().checked_sub(keep).map(|i| m.versions[i].version) else {
                    return Ok(Vec::new());
                };
                let start_of = |v: u64| m.chain(v).and_then(|c| c.first()).map_or(0, |e| e.version);
                let start = start_of(oldest);
                let doomed = m.versions.iter().map(|e| e.version).filter(|&v| v < start).collect::<Vec<_>>();
                (settled_prefix(doomed, &self.copied(), start_of), None)
            }
            Listing::Part { rank, ranks } => {
                let log = CommitLog::load_from(self.store.storage().as_ref())?;
                let committed: Vec<_> = log.records().collect();
                let Some(oldest) = committed.len().checked_sub(keep).map(|i| committed[i].version) else {
                    return Ok(Vec::new());
                };
                // Rank r's chain holding version `at` starts at its newest
                // baseline at or before it.
                let chain_start = |r: u32, at: u64| {
                    committed
                        .iter()
                        .rev()
                        .filter(|c| c.version <= at)
                        .find(|c| c.entry(r).is_some_and(|e| e.baseline))
                        .map_or(0, |c| c.version)
                };
                // To a fixpoint: a version where every rank's chain starts.
                // (A version dense on one rank is a baseline there only;
                // another rank's part of it still needs its predecessors,
                // and a part whose predecessor is gone commits nothing.)
                let mut start = oldest;
                loop {
                    let s = (0..ranks).map(|r| chain_start(r, start)).min().unwrap_or(0);
                    if s == start {
                        break;
                    }
                    start = s;
                }
                let only_parts = |v: u64| {
                    let files = log.files_of(v);
                    !files.is_empty()
                        && files
                            .iter()
                            .all(|f| f.file_name().and_then(|n| n.to_str()).and_then(parse_part_name).is_some())
                };
                // This rank's files below the start, committed or not (other
                // ranks may have retired their parts of them already).
                let mut doomed: Vec<u64> = versions_present(self.store.storage().as_ref(), &rank_rel(rank))?
                    .into_iter()
                    .chain(log.stray_parts(rank).map(|(v, _)| v))
                    .filter(|&v| v < start && (!log.is_committed(v) || only_parts(v)))
                    .collect();
                doomed.sort_unstable();
                doomed.dedup();
                let start_of = |v: u64| {
                    let mut s = v;
                    loop {
                        let next = (0..ranks).map(|r| chain_start(r, s)).min().unwrap_or(0);
                        if next == s {
                            break s;
                        }
                        s = next;
                    }
                };
                (settled_prefix(doomed, &self.copied(), start_of), Some(rank))
            }
        };
        self.store.retire(&doomed, part_of)?;
        Ok(doomed)
    }

    /// Whether every later tier has settled version `v` and its copies
    /// elsewhere are over (until then, this tier's file is still copied).
    fn copied(&self) -> impl Fn(u64) -> bool + '_ {
        move |v| {
            self.shared.progress.states(v).is_none_or(|st| st.iter().skip(self.tier + 1).all(TierState::settled))
                && self.shared.copy_hold.released(self.tier, v)
        }
    }
}

/// The versions of `doomed` (ascending) that retention may delete now: all
/// of them if every later tier has copied them; otherwise only those older
/// than the chain start (`start_of`) of the first one not yet copied, so
/// that what stays listed still begins with a baseline (deleting only the
/// copied ones could leave an incremental version first, and a tier whose
/// oldest listed version is not a baseline does not open).
fn settled_prefix(doomed: Vec<u64>, copied: &impl Fn(u64) -> bool, start_of: impl Fn(u64) -> u64) -> Vec<u64> {
    match doomed.iter().copied().find(|&v| !copied(v)) {
        None => doomed,
        Some(first_kept) => {
            let start = start_of(first_kept);
            doomed.into_iter().filter(|&v| v < start).collect()
        }
    }
}

/// Fails what a worker leaves unsettled when it stops.
struct SettleOnExit {
    shared: Arc<Shared>,
    tier: usize,
    name: String,
}

impl Drop for SettleOnExit {
    fn drop(&mut self) {
        self.shared.needs_baseline.store(true, Ordering::SeqCst);
        let why = format!("the flush thread of the {} tier stopped before writing it", self.name);
        self.shared.progress.fail_unsettled(self.tier, &why);
    }
}

#[cfg(test)]
mod retention_tests {
    use super::settled_prefix;

    #[test]
    fn retention_never_leaves_an_incremental_version_first() {
        // Chains 1-4 and 5-8 doomed; a later tier has copied all but 6.
        let start_of = |v: u64| if v < 5 { 1 } else { 5 };
        let doomed: Vec<u64> = (1..=8).collect();
        assert_eq!(settled_prefix(doomed.clone(), &|v| v != 6, start_of), vec![1, 2, 3, 4]);
        assert_eq!(settled_prefix(doomed.clone(), &|_| true, start_of), doomed);
        assert!(settled_prefix(doomed, &|v| v != 2, start_of).is_empty());
    }
}
