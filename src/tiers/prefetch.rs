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
//! A restore reads each file through [`CachedStorage`], a storage decorator:
//! a cached file is served from memory, every other from its tier (and then
//! admitted to the cache, so versions sharing a chain share its files even
//! without hints). Every byte is verified as on disk (the catalog checks
//! each file against its committed entry; each block against its digest).
//! After a restore, the files no remaining hinted version needs are
//! *consumed*: evicted first.
//!
//! The arena's offsets model one contiguous buffer (what a device cache
//! needs); here each file is its own allocation, within the arena's budget.

use super::arena::{Arena, Evictable, Policy};
use crate::restore::{Catalog, restore_in};
use crate::storage::{Entry, Fill, LockGuard, Posix, ReadAt, Storage};
use crate::store::{parse_diff_name, rank_rel};
use crate::{Error, Result};
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

/// A diff file: `(rank, version)`.
type FileKey = (u32, u64);

/// The arena id of a file (versions below 2^44).
fn id_of((rank, version): FileKey) -> u64 {
    (u64::from(rank) << 44) | (version & ((1 << 44) - 1))
}

/// What the prefetcher did so far.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct PrefetchStats {
    /// Bytes of files restores read from the cache.
    pub hit_bytes: u64,
    /// Bytes of files restores read from a disk tier.
    pub miss_bytes: u64,
    /// Files the prefetch thread loaded ahead of their restore.
    pub prefetched_files: u64,
    /// Files evicted.
    pub evicted_files: u64,
    /// Times the prefetch thread waited rather than evict a file needed sooner.
    pub stalls: u64,
}

#[derive(Debug)]
struct State {
    arena: Arena,
    policy: Policy,
    /// Cached files, with the tier root each was read from.
    files: HashMap<FileKey, (PathBuf, Arc<Vec<u8>>)>,
    /// Files being loaded (their arena slot is reserved, not evictable).
    loading: HashSet<FileKey>,
    /// Hinted versions not yet restored, the next first.
    hints: VecDeque<u64>,
    /// The files each hinted version needs, with their lengths, once known;
    /// and the tier root it is read from.
    needs: HashMap<u64, (PathBuf, Vec<(FileKey, u64)>)>,
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
            if let Some((_, files)) = self.needs.get(v) {
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
    fn admit(&mut self, key: FileKey, root: &Path, bytes: Arc<Vec<u8>>, before: usize) -> bool {
        if self.files.contains_key(&key) {
            return true;
        }
        let Some(offset) = self.make_room(bytes.len() as u64, before) else { return false };
        if !self.arena.insert(id_of(key), offset, bytes.len() as u64, Evictable::Now) {
            return false;
        }
        self.files.insert(key, (root.to_path_buf(), bytes));
        true
    }

    /// Forgets every file cached from `root` (a restore from it failed: a
    /// damaged copy must not be served again).
    fn forget_root(&mut self, root: &Path) {
        let gone: Vec<FileKey> = self.files.iter().filter(|(_, (r, _))| r == root).map(|(k, _)| *k).collect();
        for k in gone {
            self.files.remove(&k);
            self.arena.remove(id_of(k));
        }
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
        let still: HashSet<FileKey> =
            self.needs.values().flat_map(|(_, files)| files.iter().map(|(k, _)| *k)).collect();
        for k in self.files.keys() {
            if !still.contains(k) {
                self.arena.consume(id_of(*k));
            }
        }
    }
}

/// The prefetcher of one rank's restores.
pub struct Prefetcher {
    shared: Arc<(Mutex<State>, Condvar)>,
    rank: u32,
    roots: Vec<PathBuf>,
    thread: Option<JoinHandle<()>>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
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
        let worker = Worker { shared: Arc::clone(&shared), rank, roots: roots.clone() };
        let thread = std::thread::Builder::new()
            .name("dckpt-prefetch".into())
            .spawn(move || worker.run())
            .map_err(|e| Error::Internal(format!("starting the prefetch thread: {e}")))?;
        Ok(Prefetcher { shared, rank, roots, thread: Some(thread) })
    }

    /// Hints that `version` will be restored after those already hinted.
    pub fn enqueue(&self, version: u64) {
        let (m, cv) = &*self.shared;
        let mut s = lock(m);
        if !s.hints.contains(&version) {
            s.hints.push_back(version);
        }
        cv.notify_all();
    }

    /// Starts (or resumes) loading the hinted versions in the background.
    pub fn start(&self) {
        let (m, cv) = &*self.shared;
        lock(m).started = true;
        cv.notify_all();
    }

    /// What it did so far.
    pub fn stats(&self) -> PrefetchStats {
        lock(&self.shared.0).stats
    }

    /// Bytes cached now.
    pub fn cached_bytes(&self) -> u64 {
        lock(&self.shared.0).arena.used()
    }

    /// Restores `version` from tier root `root` through the cache.
    pub fn restore(&self, version: u64, root: &Path) -> Result<Vec<u8>> {
        let storage = Arc::new(CachedStorage {
            inner: Posix::at(root),
            root: root.to_path_buf(),
            shared: Arc::clone(&self.shared),
        });
        let mut catalog = Catalog::on(storage);
        let result = restore_in(&mut catalog, self.rank, version).map(|(bytes, _, _)| bytes);
        let (m, cv) = &*self.shared;
        let mut s = lock(m);
        if result.is_err() {
            s.forget_root(root);
        }
        s.restored(version);
        drop(s);
        cv.notify_all();
        result
    }

    /// The tier roots it reads (fastest first).
    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        {
            let (m, cv) = &*self.shared;
            lock(m).stopping = true;
            cv.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The prefetch thread.
struct Worker {
    shared: Arc<(Mutex<State>, Condvar)>,
    rank: u32,
    roots: Vec<PathBuf>,
}

/// What the thread does next.
enum Step {
    Resolve(u64),
    Load(u64, FileKey, u64, PathBuf, usize),
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
                s = cv.wait(s).unwrap_or_else(PoisonError::into_inner);
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
                Step::Load(v, key, len, root, at) => {
                    if len > s.arena.capacity() {
                        s.skipped.insert(v); // read from disk when restored
                        continue;
                    }
                    let Some(offset) = s.make_room(len, at) else {
                        // Full of files needed sooner: wait for a restore to consume some.
                        s.stats.stalls += 1;
                        s = cv.wait(s).unwrap_or_else(PoisonError::into_inner);
                        continue;
                    };
                    if !s.arena.insert(id_of(key), offset, len, Evictable::Never) {
                        s.skipped.insert(v);
                        continue;
                    }
                    s.loading.insert(key);
                    drop(s);
                    let rel = rank_rel(key.0).join(crate::store::diff_file_name(key.1));
                    let bytes = Posix::at(&root).read(&rel).ok().flatten();
                    s = lock(m);
                    s.loading.remove(&key);
                    match bytes.filter(|b| b.len() as u64 == len) {
                        Some(b) => {
                            s.files.insert(key, (root.clone(), Arc::new(b)));
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

    /// The tier root holding `version` (fastest first) and the files its
    /// restore reads, with their lengths.
    fn resolve(&self, version: u64) -> Option<(PathBuf, Vec<(FileKey, u64)>)> {
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
            return Some((root.clone(), files));
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
        let Some((root, files)) = s.needs.get(v) else { return Some(Step::Resolve(*v)) };
        for (k, len) in files {
            if !s.files.contains_key(k) && !s.loading.contains(k) {
                let at = order.iter().position(|o| *o == id_of(*k)).unwrap_or(usize::MAX);
                return Some(Step::Load(*v, *k, *len, root.clone(), at));
            }
        }
    }
    None
}

/// A file served from memory.
#[derive(Debug)]
struct MemFile(Arc<Vec<u8>>);

impl ReadAt for MemFile {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let at = usize::try_from(offset).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        let src = self.0.get(at..at + buf.len()).ok_or(std::io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

/// Reads through the prefetch cache (the restore's storage decorator):
/// cached diff files from memory, every other file from `inner`; a diff file
/// read from disk is admitted to the cache. Read-only.
#[derive(Debug)]
pub struct CachedStorage {
    inner: Posix,
    root: PathBuf,
    shared: Arc<(Mutex<State>, Condvar)>,
}

fn diff_key(rel: &Path) -> Option<FileKey> {
    let mut parts = rel.iter();
    let dir = parts.next()?.to_str()?;
    let name = parts.next()?.to_str()?;
    if parts.next().is_some() {
        return None;
    }
    let rank: u32 = dir.strip_prefix("rank-")?.parse().ok()?;
    Some((rank, parse_diff_name(name)?))
}

impl Storage for CachedStorage {
    fn locate(&self, rel: &Path) -> PathBuf {
        self.inner.locate(rel)
    }

    fn create_dir(&self, _: &Path) -> Result<()> {
        Err(read_only())
    }

    fn read(&self, rel: &Path) -> Result<Option<Vec<u8>>> {
        self.inner.read(rel)
    }

    fn open(&self, rel: &Path) -> Result<Box<dyn ReadAt>> {
        let Some(key) = diff_key(rel) else { return self.inner.open(rel) };
        let (m, cv) = &*self.shared;
        {
            let mut s = lock(m);
            if let Some((_, bytes)) = s.files.get(&key).filter(|(r, _)| *r == self.root).cloned() {
                s.stats.hit_bytes += bytes.len() as u64;
                s.arena.touch(id_of(key));
                return Ok(Box::new(MemFile(bytes)));
            }
        }
        // A miss: the whole file from disk (one read), offered to the cache;
        // a file larger than the cache is read block by block as usual.
        let file = self.inner.open(rel)?;
        if file.len() > lock(m).arena.capacity() {
            return Ok(file);
        }
        let mut bytes = vec![0u8; file.len() as usize];
        file.read_exact_at(&mut bytes, 0).map_err(|e| Error::io(self.inner.locate(rel), e))?;
        let bytes = Arc::new(bytes);
        let mut s = lock(m);
        s.stats.miss_bytes += bytes.len() as u64;
        let position = s.order().iter().position(|o| *o == id_of(key)).unwrap_or(usize::MAX);
        if s.admit(key, &self.root, Arc::clone(&bytes), position) {
            s.arena.touch(id_of(key));
        }
        cv.notify_all();
        Ok(Box::new(MemFile(bytes)))
    }

    fn list(&self, rel: &Path) -> Result<Vec<Entry>> {
        self.inner.list(rel)
    }

    fn write_atomic(&self, _: &Path, _: Fill<'_>) -> Result<()> {
        Err(read_only())
    }

    fn remove(&self, _: &Path) -> Result<()> {
        Err(read_only())
    }

    fn rename(&self, _: &Path, _: &Path) -> Result<()> {
        Err(read_only())
    }

    fn barrier(&self, _: &Path) -> Result<()> {
        Err(read_only())
    }

    fn lock(&self, _: &Path) -> Result<Box<dyn LockGuard>> {
        Err(read_only())
    }
}

fn read_only() -> Error {
    Error::Internal("the prefetch cache's storage is read-only".into())
}
