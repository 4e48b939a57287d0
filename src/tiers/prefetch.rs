//! Prefetching restores: a host-memory cache of diff files in front of the
//! disk tiers, filled in the background from the application's hints and
//! emptied by an eviction policy ([`super::arena`]).
//!
//! ```text
//! prefetch_enqueue(v)…  prefetch_start()          restore(v)
//!        │                    │                        │
//!   hint queue ──► prefetch thread: resolve v's chain, │
//!                  load each missing file up from the  ▼
//!                  fastest tier holding v ──► cache ──► Catalog over CachedStorage:
//!                  (evicting by policy; it waits       cached files from memory, the
//!                   rather than evict a file needed     others from disk (then admitted)
//!                   sooner than the one it loads)
//! ```
//!
//! A restore reads each file through the tiers' reader (`tiers::reader`):
//! a cached file is served from memory, every other from the fastest tier
//! holding it (only the bytes the restore needs; a miss is not admitted).
//! Every byte is verified as on disk (the catalog
//! checks each file against its committed entry; each block against its
//! digest). After a restore, the files no remaining hinted version needs are
//! *consumed*: evicted first.
//!
//! The cache is also the write side's victim cache (HPDC'23's unified
//! cache): once the first tier has a version's file durable, its flush
//! worker offers the bytes it wrote (`RestoreCache::offer_written`), so
//! the versions written last are restored from memory even without hints.
//!
//! The arena's offsets model one contiguous buffer (what a device cache
//! needs); here each file is its own allocation, within the arena's budget.

use super::arena::{Arena, Evictable, Policy};
use crate::error::{Error, Result};
use crate::restore::Catalog;
use crate::storage::{Posix, Storage};
use crate::store::rank_rel;
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// A diff file: `(rank, version)`.
pub(crate) type FileKey = (u32, u64);

/// The arena id of a file (versions below 2^44).
fn id_of((rank, version): FileKey) -> u64 {
    (u64::from(rank) << 44) | (version & ((1 << 44) - 1))
}

/// What the prefetcher did so far.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct PrefetchStats {
    /// Bytes restores read from cached files.
    pub hit_bytes: u64,
    /// Bytes restores read from the disk tiers (metadata included).
    pub miss_bytes: u64,
    /// Bytes restores read from versions still in the host cache (not yet
    /// flushed).
    pub inflight_bytes: u64,
    /// Files the prefetch thread loaded ahead of their restore.
    pub prefetched_files: u64,
    /// Files the first tier's flush worker left in the cache after writing.
    pub retained_files: u64,
    /// Files evicted.
    pub evicted_files: u64,
    /// Times the prefetch thread waited rather than evict a file needed sooner.
    pub stalls: u64,
}

#[derive(Debug)]
struct State {
    arena: Arena,
    policy: Policy,
    /// Cached files (the same bytes on every tier that holds them).
    files: HashMap<FileKey, Arc<Vec<u8>>>,
    /// Files being loaded (their arena slot is reserved, not evictable).
    loading: HashSet<FileKey>,
    /// Hinted versions not yet restored, the next first.
    hints: VecDeque<u64>,
    /// The files each hinted version needs, with their lengths, once known.
    needs: HashMap<u64, Vec<(FileKey, u64)>>,
    /// Versions the prefetch thread could not resolve or cache (skipped).
    skipped: HashSet<u64>,
    started: bool,
    stopping: bool,
    stats: PrefetchStats,
}

impl State {
    /// File ids in the order the hinted versions need them (next first).
    fn order(&self) -> Vec<u64> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for v in &self.hints {
            if let Some(files) = self.needs.get(v) {
                for (k, _) in files {
                    if seen.insert(*k) {
                        out.push(id_of(*k));
                    }
                }
            }
        }
        out
    }

    /// Admits `bytes` as file `key` if the policy finds room without evicting
    /// a file needed before `before` (a position in [`State::order`];
    /// `usize::MAX`: any unneeded file may go). Returns whether it is cached.
    fn admit(&mut self, key: FileKey, bytes: Arc<Vec<u8>>, before: usize) -> bool {
        if self.files.contains_key(&key) {
            return true;
        }
        let Some(offset) = self.make_room(bytes.len() as u64, before) else { return false };
        if !self.arena.insert(id_of(key), offset, bytes.len() as u64, Evictable::Now) {
            return false;
        }
        self.files.insert(key, bytes);
        true
    }

    /// The position of `key` in [`State::order`] (`usize::MAX`: not hinted).
    fn position(&self, key: FileKey) -> usize {
        self.order().iter().position(|o| *o == id_of(key)).unwrap_or(usize::MAX)
    }

    /// Evicts what the policy names for a file of `len` bytes, unless it
    /// would evict a file needed at or before position `before`, or one
    /// being loaded. The offset where the file goes.
    fn make_room(&mut self, len: u64, before: usize) -> Option<u64> {
        let order = self.order();
        let p = self.arena.place(len, self.policy, &order)?;
        let sooner = |id: &u64| order.iter().position(|o| o == id).is_some_and(|at| at <= before);
        if p.evict.iter().any(sooner) || p.wait_seconds > 0.0 {
            return None;
        }
        for id in &p.evict {
            if let Some(k) = self.files.keys().find(|k| id_of(**k) == *id).copied() {
                self.files.remove(&k);
            }
            self.arena.remove(*id);
            self.stats.evicted_files += 1;
        }
        Some(p.offset)
    }

    /// After a restore of `version`: it leaves the hints; the files no
    /// remaining hinted version needs are consumed.
    fn restored(&mut self, version: u64) {
        self.hints.retain(|v| *v != version);
        self.needs.remove(&version);
        if self.hints.is_empty() {
            return; // no hints: the policy alone decides
        }
        let still: HashSet<FileKey> = self.needs.values().flat_map(|files| files.iter().map(|(k, _)| *k)).collect();
        for k in self.files.keys() {
            if !still.contains(k) {
                self.arena.consume(id_of(*k));
            }
        }
    }
}

/// The restore cache: shared by the prefetch thread, the restores reading
/// through it and the first tier's flush worker.
#[derive(Clone, Debug)]
pub(crate) struct RestoreCache {
    shared: Arc<(Mutex<State>, Condvar)>,
    /// Bytes restores read from cached files, and from the disk tiers.
    read: Arc<ReadCounters>,
}

/// Bytes read by restores (counted per read, without the cache's lock).
#[derive(Debug, Default)]
pub(crate) struct ReadCounters {
    /// From cached files.
    pub hit: AtomicU64,
    /// From the disk tiers.
    pub miss: AtomicU64,
    /// From the host cache (versions in flight).
    pub inflight: AtomicU64,
}

impl RestoreCache {
    /// The cached bytes of `key`, if any.
    pub fn lookup(&self, key: FileKey) -> Option<Arc<Vec<u8>>> {
        let mut s = lock(&self.shared.0);
        let bytes = s.files.get(&key).cloned()?;
        s.arena.touch(id_of(key));
        Some(bytes)
    }

    /// The counters of the bytes restores read.
    pub fn counters(&self) -> Arc<ReadCounters> {
        Arc::clone(&self.read)
    }

    /// The first tier made `key` durable with these bytes: they stay cached
    /// (as a flushed, evictable file) if the policy finds room without
    /// evicting a file needed sooner.
    pub fn offer_written(&self, key: FileKey, bytes: Vec<u8>) {
        let (m, cv) = &*self.shared;
        let mut s = lock(m);
        let position = s.position(key);
        if s.admit(key, Arc::new(bytes), position) {
            s.stats.retained_files += 1;
        }
        cv.notify_all();
    }

    /// Whether a file of `len` bytes could be cached at all.
    pub fn fits(&self, len: u64) -> bool {
        len <= lock(&self.shared.0).arena.capacity()
    }

    /// Forgets `keys` (a restore that read them failed: a damaged copy must
    /// not be served again).
    pub fn forget(&self, keys: &[FileKey]) {
        let mut s = lock(&self.shared.0);
        for k in keys {
            if s.files.remove(k).is_some() {
                s.arena.remove(id_of(*k));
            }
        }
    }

    /// `version` was restored (or its restore failed): it leaves the hints
    /// and the files no other hinted version needs are consumed.
    pub fn restored(&self, version: u64) {
        let (m, cv) = &*self.shared;
        lock(m).restored(version);
        cv.notify_all();
    }
}

/// The prefetcher of one rank's restores.
pub struct Prefetcher {
    cache: RestoreCache,
    thread: Option<JoinHandle<()>>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    crate::sync::lock(m)
}

impl Prefetcher {
    /// A prefetcher of `cache_bytes` over the tier roots `roots` (fastest
    /// first) for `rank`; its thread waits for [`Prefetcher::start`].
    pub fn new(rank: u32, roots: Vec<PathBuf>, cache_bytes: u64, policy: Policy) -> Result<Self> {
        let state = State {
            arena: Arena::new(cache_bytes),
            policy,
            files: HashMap::new(),
            loading: HashSet::new(),
            hints: VecDeque::new(),
            needs: HashMap::new(),
            skipped: HashSet::new(),
            started: false,
            stopping: false,
            stats: PrefetchStats::default(),
        };
        let shared = Arc::new((Mutex::new(state), Condvar::new()));
        let worker = Worker { shared: Arc::clone(&shared), rank, roots };
        let thread = std::thread::Builder::new()
            .name("dckpt-prefetch".into())
            .spawn(move || worker.run())
            .map_err(|e| Error::no_thread("the prefetch thread", e))?;
        Ok(Prefetcher { cache: RestoreCache { shared, read: Arc::default() }, thread: Some(thread) })
    }

    /// Hints that `version` will be restored after those already hinted.
    pub fn enqueue(&self, version: u64) {
        let (m, cv) = &*self.cache.shared;
        let mut s = lock(m);
        if !s.hints.contains(&version) {
            s.hints.push_back(version);
        }
        cv.notify_all();
    }

    /// Starts (or resumes) loading the hinted versions in the background.
    pub fn start(&self) {
        let (m, cv) = &*self.cache.shared;
        lock(m).started = true;
        cv.notify_all();
    }

    /// What it did so far.
    pub fn stats(&self) -> PrefetchStats {
        let mut stats = lock(&self.cache.shared.0).stats;
        stats.hit_bytes = self.cache.read.hit.load(Ordering::Relaxed);
        stats.miss_bytes = self.cache.read.miss.load(Ordering::Relaxed);
        stats.inflight_bytes = self.cache.read.inflight.load(Ordering::Relaxed);
        stats
    }

    /// Bytes cached now.
    pub fn cached_bytes(&self) -> u64 {
        lock(&self.cache.shared.0).arena.used()
    }

    /// The cache restores read through and flushes offer their files to.
    pub(crate) fn cache(&self) -> &RestoreCache {
        &self.cache
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        {
            let (m, cv) = &*self.cache.shared;
            lock(m).stopping = true;
            cv.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The prefetch thread (files are loaded whole: a hinted version's restore
/// reads their data).
struct Worker {
    shared: Arc<(Mutex<State>, Condvar)>,
    rank: u32,
    roots: Vec<PathBuf>,
}

/// What the thread does next.
enum Step {
    Resolve(u64),
    Load(u64, FileKey, u64, usize),
}

impl Worker {
    fn run(self) {
        let (m, cv) = &*self.shared;
        let mut s = lock(m);
        loop {
            if s.stopping {
                return;
            }
            let step = if s.started { next_step(&s) } else { None };
            let Some(step) = step else {
                s = crate::sync::wait(cv, s);
                continue;
            };
            match step {
                Step::Resolve(v) => {
                    drop(s);
                    let found = self.resolve(v);
                    s = lock(m);
                    match found {
                        Some(needs) => {
                            s.needs.insert(v, needs);
                        }
                        None => {
                            s.skipped.insert(v);
                        }
                    }
                }
                Step::Load(v, key, len, at) => {
                    if len > s.arena.capacity() {
                        s.skipped.insert(v); // read from disk when restored
                        continue;
                    }
                    let Some(offset) = s.make_room(len, at) else {
                        // Full of files needed sooner: wait for a restore to consume some.
                        s.stats.stalls += 1;
                        s = crate::sync::wait(cv, s);
                        continue;
                    };
                    if !s.arena.insert(id_of(key), offset, len, Evictable::Never) {
                        s.skipped.insert(v);
                        continue;
                    }
                    s.loading.insert(key);
                    drop(s);
                    let bytes = self.load(key);
                    s = lock(m);
                    s.loading.remove(&key);
                    match bytes.filter(|b| b.len() as u64 == len) {
                        Some(b) => {
                            s.files.insert(key, Arc::new(b));
                            s.arena.set_evictable(id_of(key), Evictable::Now);
                            s.stats.prefetched_files += 1;
                        }
                        None => {
                            s.arena.remove(id_of(key));
                            // The version is read from disk when restored.
                            s.skipped.insert(v);
                        }
                    }
                    cv.notify_all();
                }
            }
        }
    }

    /// The file `key` from the fastest tier holding it (the restore checks
    /// it against the committed entry).
    fn load(&self, key: FileKey) -> Option<Vec<u8>> {
        let rel = rank_rel(key.0).join(crate::store::diff_file_name(key.1));
        self.roots.iter().find_map(|root| Posix::at(root).read(&rel).ok().flatten())
    }

    /// The files a restore of `version` reads, with their lengths (resolved
    /// on the fastest tier that lists it).
    fn resolve(&self, version: u64) -> Option<Vec<(FileKey, u64)>> {
        for root in &self.roots {
            let mut catalog = Catalog::new(root);
            let Ok(res) = crate::restore::resolve_all(&mut catalog, self.rank, version) else { continue };
            let mut keys: Vec<FileKey> = res.sources.iter().map(|s| (s.rank, s.version)).collect();
            keys.extend(res.references.iter().map(|r| (r.owner, r.version)));
            keys.sort_unstable();
            keys.dedup();
            let mut files = Vec::with_capacity(keys.len());
            for k in keys {
                let len = catalog.reader(k.0, k.1).ok()?.file_len();
                files.push((k, len));
            }
            return Some(files);
        }
        None
    }
}

/// The thread's next step: resolve the first hinted version not resolved,
/// or load the first missing file of the first hinted version that has one.
fn next_step(s: &State) -> Option<Step> {
    let order = s.order();
    for v in &s.hints {
        if s.skipped.contains(v) {
            continue;
        }
        let Some(files) = s.needs.get(v) else { return Some(Step::Resolve(*v)) };
        for (k, len) in files {
            if !s.files.contains_key(k) && !s.loading.contains(k) {
                let at = order.iter().position(|o| *o == id_of(*k)).unwrap_or(usize::MAX);
                return Some(Step::Load(*v, *k, *len, at));
            }
        }
    }
    None
}
