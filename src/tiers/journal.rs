//! The flush journal (issue #44): what a rank's host cache holds that not
//! every tier has yet, written where the per-node agent (`crate::agent`)
//! finds it when the rank dies. With `agent = "auto"` the host cache's
//! segments are files of a shared-memory directory (`crate::shm`), so a
//! returned checkpoint's bytes outlive the process; the journal says which
//! segments hold which version and which tiers have it.
//!
//! ```text
//! <root>/                         /dev/shm/dckpt-<uid>: one per user and node
//!   agent.lock                    held (flock) by the running agent; its pid
//!   <pid>-<n>/                    one engine of one live process
//!     lock                        held (flock) by that process for its life
//!     owner                       its pid
//!     meta.json                   how to open its stores (JournalMeta)
//!     seg-<k>, spill-<k>          the host cache's segments
//!     v<version>.job              a version not settled on every tier (JournalEntry)
//! ```
//!
//! A directory is made under a hidden name and renamed once its lock is
//! held, so a scanner never takes the lock of a directory being made. An
//! entry is written once the version's bytes are all in the segments (at
//! the hand-over on the CPU, after the device's copy on the GPU) and
//! rewritten as each tier settles; the first tier marks its outcome before
//! the segments go back to the cache, so an entry never names segments lent
//! again. The journal's writes are to memory (tmpfs): a crash of the
//! process loses none of them, only a node's loss does.
//!
//! A finished flush writes each version as the rank kept it (no regions
//! given away): a give-away only removes bytes from the ranks that are not
//! a region's owner, so a kept file is right whatever the step decided.

use super::cache::Cached;
use super::listing::Listing;
use crate::error::{Error, Result};
use crate::format::Compression;
use crate::memory::SegmentAlloc;
use crate::store::StoreOptions;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// How to open a rank's stores again: written once per journal.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JournalMeta {
    /// The rank.
    pub rank: u32,
    /// Bytes the rank protects.
    pub data_len: u64,
    /// The stores' options.
    pub opts: StoreOptions,
    /// The disk tiers, fastest first: name and root.
    pub tiers: Vec<(String, PathBuf)>,
    /// How a durable version is listed.
    pub listing: Listing,
    /// Compression of the first tier's files.
    pub compression: Option<Compression>,
}

/// One version a tier does not hold yet.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JournalEntry {
    /// The version.
    pub version: u64,
    /// Whether it is a baseline.
    pub baseline: bool,
    /// The version before it in its chain.
    pub prev: Option<u64>,
    /// Whether the cached file carries its trailer.
    pub sealed: bool,
    /// The file's length.
    pub len: u64,
    /// Bytes per segment (the whole file for a spill).
    pub segment_len: u64,
    /// The segments holding it, in order (file names in the directory).
    pub segments: Vec<String>,
    /// Per tier: `None` not yet settled, `Some(true)` durable, `Some(false)` failed.
    pub settled: Vec<Option<bool>>,
}

impl JournalEntry {
    /// Whether the cache segments still hold the bytes: no tier has them
    /// yet (the first durable tier gives the segments back).
    pub fn segments_valid(&self) -> bool {
        !self.settled.contains(&Some(true))
    }
}

/// A rank's journal (one per tiered engine), removed with everything in it
/// when dropped: a process that ends normally has flushed or reported all.
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    _lock: File,
    next: AtomicU64,
    tiers: usize,
    entries: Mutex<HashMap<u64, JournalEntry>>,
    /// Whether the directory is removed already ([`Journal::close`]).
    closed: std::sync::atomic::AtomicBool,
}

/// Journals made by this process (their directories' numbers).
static MADE: AtomicU64 = AtomicU64::new(0);

/// The agents' directory of this user on this node: `/dev/shm/dckpt-<uid>`
/// (the system's temporary directory where there is no `/dev/shm`).
pub fn default_root() -> PathBuf {
    let uid = rustix::process::getuid().as_raw();
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
    base.join(format!("dckpt-{uid}"))
}

/// Makes `root` (owner-only) if missing and checks that it is a directory
/// of this user, not a link: the directory is in a world-writable place.
pub fn prepare_root(root: &Path) -> Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(root) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::io(root, e)),
    }
    let meta = std::fs::symlink_metadata(root).map_err(|e| Error::io(root, e))?;
    let uid = rustix::process::getuid().as_raw();
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(Error::InvalidOption(format!(
            "the agent's directory {} is not a directory of this user (uid {uid}) that only it may write",
            root.display()
        )));
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically (a temporary file renamed; no sync:
/// the directory is memory, which a process's death does not lose).
fn put(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    f.write_all(bytes)?;
    drop(f);
    std::fs::rename(&tmp, path)
}

impl Journal {
    /// A new journal in `root` for the engine `meta` describes, its lock held.
    pub fn create(root: &Path, meta: &JournalMeta) -> Result<Arc<Journal>> {
        prepare_root(root)?;
        let pid = std::process::id();
        let n = MADE.fetch_add(1, Ordering::SeqCst);
        let hidden = root.join(format!(".new-{pid}-{n}"));
        let dir = root.join(format!("{pid}-{n}"));
        let made = (|| -> std::io::Result<File> {
            let _ = std::fs::remove_dir_all(&hidden);
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::DirBuilder::new().mode(0o700).create(&hidden)?;
            let lock = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(hidden.join("lock"))?;
            lock.try_lock().map_err(std::io::Error::other)?;
            put(&hidden.join("owner"), pid.to_string().as_bytes())?;
            let json = serde_json::to_vec_pretty(meta).map_err(std::io::Error::other)?;
            put(&hidden.join("meta.json"), &json)?;
            std::fs::rename(&hidden, &dir)?;
            Ok(lock)
        })();
        let lock = made.map_err(|e| {
            let _ = std::fs::remove_dir_all(&hidden);
            Error::io(&hidden, e)
        })?;
        Ok(Arc::new(Journal {
            dir,
            _lock: lock,
            next: AtomicU64::new(0),
            tiers: meta.tiers.len(),
            entries: Mutex::new(HashMap::new()),
            closed: Default::default(),
        }))
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Cache segments in its directory (`seg-<k>`; `spill-<k>` for a spill).
    pub fn segments(self: &Arc<Self>, kind: &'static str) -> SegmentAlloc {
        let journal = Arc::clone(self);
        Box::new(move |len| {
            let k = journal.next.fetch_add(1, Ordering::SeqCst);
            let seg = crate::shm::ShmSegment::create(&journal.dir, &format!("{kind}-{k}"), len)?;
            Ok(Box::new(seg) as crate::memory::Segment)
        })
    }

    /// Records a version whose bytes are all in `cached` (once; a file not
    /// all in this journal's segments, or still arriving, is not recorded:
    /// its flush dies with the process, as without the agent).
    pub(crate) fn record(&self, version: u64, baseline: bool, prev: Option<u64>, sealed: bool, cached: &Cached) {
        let mut entries = crate::sync::lock(&self.entries);
        if entries.contains_key(&version) {
            return;
        }
        let Some((segments, segment_len)) = cached.shm_layout() else {
            // Still arriving (the first worker records it once there), or
            // not in shared memory (a segment fell back to the heap).
            tracing::debug!("version {version}: not journaled now (its bytes still arriving, or not in shared memory)");
            return;
        };
        let entry = JournalEntry {
            version,
            baseline,
            prev: prev.filter(|_| !baseline),
            sealed,
            len: cached.len() as u64,
            segment_len: segment_len as u64,
            segments,
            settled: vec![None; self.tiers],
        };
        if self.write(&entry) {
            entries.insert(version, entry);
        }
    }

    /// Tier `tier` has settled `version`: durable, or failed. The entry goes
    /// once every tier has settled it.
    pub fn settle(&self, version: u64, tier: usize, durable: bool) {
        let mut entries = crate::sync::lock(&self.entries);
        let Some(entry) = entries.get_mut(&version) else { return };
        if let Some(s) = entry.settled.get_mut(tier) {
            *s = Some(durable);
        }
        if entry.settled.iter().all(Option::is_some) {
            let path = self.entry_path(version);
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!("the flush journal: removing {}: {e}", path.display());
            }
            entries.remove(&version);
        } else {
            let entry = entry.clone();
            self.write(&entry);
        }
    }

    fn entry_path(&self, version: u64) -> PathBuf {
        self.dir.join(format!("v{version}.job"))
    }

    /// Writes an entry; whether it is there.
    fn write(&self, entry: &JournalEntry) -> bool {
        let path = self.entry_path(entry.version);
        let written = serde_json::to_vec(entry).map_err(std::io::Error::other).and_then(|j| put(&path, &j));
        if let Err(e) = &written {
            tracing::warn!("the flush journal: writing {}: {e}; the agent cannot finish this version", path.display());
        }
        written.is_ok()
    }
}

impl Journal {
    /// Removes the directory and everything in it (once): its engine has
    /// stopped, every version flushed or reported. Segments still mapped
    /// stay valid; one made after this falls back to the heap.
    pub fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        // The lock is still held: no agent takes the directory meanwhile.
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!("the flush journal: removing {}: {e}", self.dir.display());
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.close();
    }
}

/// Whether the file name is an entry's (`v<version>.job`): its version.
pub fn entry_version(name: &str) -> Option<u64> {
    name.strip_prefix('v')?.strip_suffix(".job")?.parse().ok()
}

/// The pid that wrote journal directory `dir`.
pub fn read_owner(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join("owner")).ok()?.trim().parse().ok()
}
