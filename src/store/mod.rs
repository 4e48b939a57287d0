//! A rank's checkpoint directory: its manifest, its diff files, the writer
//! lock, the commit protocol and the clean-up of unfinished versions.
//!
//! ```text
//! <root>/rank-00003/MANIFEST                 parameters + committed versions
//! <root>/rank-00003/LOCK                     held (flock) by the one writer
//! <root>/rank-00003/v000000000007.dckpt      diff file of version 7
//! <root>/commits/v000000000007.commit        collective versions: the commit record
//! ```
//!
//! A commit writes the diff file through an exclusive, uniquely named
//! temporary file, fsyncs it, renames it into place and fsyncs the
//! directory; only then is the manifest rewritten the same way (single
//! rank), or rank 0 writes the version's commit record (collective,
//! [`commits`]). A version is visible only once committed; a crash at any
//! point leaves the previous committed version restorable, and a writer that
//! opens the store removes what unfinished versions left behind.

pub mod commits;
mod writer;

pub use crate::storage::fsio;
pub use fsio::{sync_dir, write_atomic, write_output};
pub use writer::StoreWriter;

use crate::error::{Error, Result};
use crate::format::manifest::{Manifest, VersionEntry};
use crate::hash::HashAlgo;
use crate::layout::Layout;
use crate::method::Method;
use crate::storage::{LockGuard, Posix, Storage};
use commits::CommitLog;
use serde::{Deserialize, Serialize};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Parameters of a store, fixed at its first checkpoint (the last three
/// are policies that may change between runs). Serde-able for TOML configs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreOptions {
    /// Chunk size in bytes (32 B – 64 KiB).
    pub chunk_size: u32,
    /// Checkpointing method.
    pub method: Method,
    /// Digest algorithm.
    pub hash: HashAlgo,
    /// Re-baseline once a chain holds this many versions (baseline included).
    pub max_chain: Option<u64>,
    /// Re-baseline once the record holds more entries than this.
    pub max_record_entries: Option<u64>,
    /// The CUDA backend's device-memory budget (`crate::backend::budget`).
    pub gpu_memory: crate::sizes::GpuMemory,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            chunk_size: 128,
            method: Method::Tree,
            hash: HashAlgo::Murmur3,
            max_chain: None,
            max_record_entries: None,
            gpu_memory: crate::sizes::GpuMemory::default(),
        }
    }
}

/// One rank's directory, read-only ([`Store::open`]): its manifest and
/// where its files are. The one writer's handle is a [`StoreWriter`] (it
/// holds the lock and reads through this view). Every access goes through
/// its [`Storage`].
///
/// A view cannot write: the commit protocol is [`StoreWriter`]'s alone.
///
/// ```compile_fail
/// # fn main() -> dckpt::Result<()> {
/// let mut view = dckpt::store::Store::open("ckpt".as_ref(), 0)?;
/// let entry = view.manifest().versions[0].clone();
/// view.publish(entry)?; // no such method on a read-only view
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Store {
    storage: Arc<dyn Storage>,
    root: PathBuf,
    /// The rank directory, relative to the storage root.
    rel: PathBuf,
    dir: PathBuf,
    manifest: Manifest,
}

/// What [`StoreWriter::open`] found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenNotes {
    /// The store was created by this open.
    pub created: bool,
    /// Versions committed by a collective commit record that the manifest
    /// did not list yet (rolled forward).
    pub rolled_forward: Vec<u64>,
    /// Files of unfinished writes that were removed.
    pub removed: Vec<PathBuf>,
    /// Commit records that could not be read (their versions are not
    /// visible until `dckpt repair` decides), with the reason.
    pub damaged_records: Vec<(PathBuf, String)>,
}

/// The directory of `rank` under `root`.
pub fn rank_dir(root: &Path, rank: u32) -> PathBuf {
    root.join(rank_rel(rank))
}

/// The directory of `rank`, relative to the store root.
pub fn rank_rel(rank: u32) -> PathBuf {
    PathBuf::from(format!("rank-{rank:05}"))
}

/// The file name of a version's diff file.
pub fn diff_file_name(version: u64) -> String {
    format!("v{version:012}.dckpt")
}

/// The version of a diff file name `vNNNNNNNNNNNN.dckpt`.
pub fn parse_diff_name(name: &str) -> Option<u64> {
    let v: u64 = name.strip_prefix('v')?.strip_suffix(".dckpt")?.parse().ok()?;
    // The exact spelling only (`v7.dckpt` or `v+7.dckpt` is not a version file).
    (name == diff_file_name(v)).then_some(v)
}

/// Ranks that have a directory under `root`, sorted.
pub fn list_ranks(root: &Path) -> Result<Vec<u32>> {
    let mut ranks = Vec::new();
    for entry in fs::read_dir(root).map_err(|e| Error::io(root, e))? {
        let entry = entry.map_err(|e| Error::io(root, e))?;
        let name = entry.file_name();
        let rank = name.to_str().and_then(|n| n.strip_prefix("rank-")).and_then(|n| n.parse::<u32>().ok());
        // Only the exact spelling, and only directories (a stray file or an
        // alias such as `rank-+0` is not a rank).
        if let Some(r) = rank
            && name.to_str() == Some(format!("rank-{r:05}").as_str())
            && entry.path().is_dir()
        {
            ranks.push(r);
        }
    }
    ranks.sort_unstable();
    Ok(ranks)
}

/// Versions whose diff files are present in a rank directory, sorted.
pub fn diff_files_present(dir: &Path) -> Result<Vec<u64>> {
    versions_present(&Posix::at(dir), Path::new(""))
}

/// Versions whose diff files are present in directory `rel` of `storage`, sorted.
pub fn versions_present(storage: &dyn Storage, rel: &Path) -> Result<Vec<u64>> {
    let mut v: Vec<u64> = storage.list(rel)?.iter().filter_map(|e| parse_diff_name(&e.name)).collect();
    v.sort_unstable();
    Ok(v)
}

/// Reads a rank's manifest; `Ok(None)` when there is none.
fn read_manifest(storage: &dyn Storage, rel: &Path, rank: u32) -> Result<Option<Manifest>> {
    let mrel = rel.join("MANIFEST");
    let path = storage.locate(&mrel);
    let Some(bytes) = storage.read(&mrel)? else { return Ok(None) };
    let manifest = Manifest::decode(&bytes, &path)?;
    if manifest.rank != rank {
        return Err(Error::corrupt(&path, format!("manifest is for rank {}", manifest.rank)));
    }
    Layout::new(manifest.data_len, manifest.chunk_size).map_err(|e| Error::corrupt(&path, e.to_string()))?;
    Ok(Some(manifest))
}

/// Adds the versions the commit log lists for the manifest's rank that are
/// newer than its latest; returns them.
pub fn roll_forward(manifest: &mut Manifest, log: &CommitLog) -> Vec<u64> {
    // Only versions newer than the latest listed: a committed version the
    // manifest skipped must never be spliced into the middle of a chain
    // (later versions' FIXED chunks would then resolve to it).
    let latest = manifest.latest().map_or(0, |v| v.version);
    let missing: Vec<VersionEntry> = log.entries_of(manifest.rank).filter(|e| e.version > latest).collect();
    let added: Vec<u64> = missing.iter().map(|e| e.version).collect();
    if !missing.is_empty() {
        manifest.versions.extend(missing);
        manifest.versions.sort_by_key(|v| v.version);
        manifest.versions.dedup_by_key(|v| v.version);
    }
    added
}

impl Store {
    /// Opens an existing store for reading (no lock): its manifest, plus the
    /// collective versions committed for this rank that it does not list yet.
    pub fn open(root: &Path, rank: u32) -> Result<Self> {
        Self::open_with(root, rank, &CommitLog::load(root)?)
    }

    /// As [`Store::open`], with the commit log already loaded.
    pub fn open_with(root: &Path, rank: u32, log: &CommitLog) -> Result<Self> {
        Self::open_in(Arc::new(Posix::at(root)), rank, log)
    }

    /// As [`Store::open`], on any storage.
    pub fn open_in(storage: Arc<dyn Storage>, rank: u32, log: &CommitLog) -> Result<Self> {
        let root = storage.locate(Path::new(""));
        let rel = rank_rel(rank);
        let Some(mut manifest) = read_manifest(storage.as_ref(), &rel, rank)? else {
            return Err(Error::NoStore { dir: root, rank });
        };
        roll_forward(&mut manifest, log);
        let dir = storage.locate(&rel);
        Ok(Store { storage, root, rel, dir, manifest })
    }

    /// The storage the store lives on.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// A version's diff file, relative to the storage root.
    pub fn diff_rel(&self, version: u64) -> PathBuf {
        self.rel.join(diff_file_name(version))
    }

    /// The store's root directory (all ranks).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// This rank's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The manifest as last committed.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The chunk layout.
    pub fn layout(&self) -> Result<Layout> {
        Layout::new(self.manifest.data_len, self.manifest.chunk_size)
    }

    /// Path of a version's diff file.
    pub fn diff_path(&self, version: u64) -> PathBuf {
        self.dir.join(diff_file_name(version))
    }
}

/// Takes the writer lock of a POSIX rank directory (`LOCK`, an advisory
/// `flock` held for the guard's life; the holder's pid is written into it
/// for the message a second writer gets).
pub fn lock_rank_dir(dir: &Path) -> Result<Box<dyn LockGuard>> {
    Posix::at(dir).lock(Path::new("LOCK"))
}

#[cfg(test)]
mod tests {
    use super::commits::{CommitRecord, RankEntry};
    use super::*;

    fn entry(version: u64) -> VersionEntry {
        VersionEntry { version, baseline: version == 1, file_len: 100, trailer: "ab".into() }
    }

    #[test]
    fn rolling_forward_only_appends_newer_versions() {
        let dir = tempfile::tempdir().expect("tempdir");
        for v in [3u64, 6] {
            let e = RankEntry { rank: 0, baseline: false, file_len: 100, trailer: "ab".into() };
            CommitRecord { version: v, ranks: 1, entries: vec![e] }.write(dir.path()).expect("write");
        }
        let log = CommitLog::load(dir.path()).expect("load");
        let mut m = Manifest {
            rank: 0,
            data_len: 1000,
            chunk_size: 64,
            method: Method::Tree,
            hash: HashAlgo::Murmur3,
            versions: [1, 2, 4, 5, 6].into_iter().map(entry).collect(),
        };
        // Version 3 is older than the latest listed: never spliced into the
        // chain (6's unchanged chunks would then resolve to it).
        assert_eq!(roll_forward(&mut m, &log), Vec::<u64>::new());
        let got: Vec<u64> = m.versions.iter().map(|v| v.version).collect();
        assert_eq!(got, vec![1, 2, 4, 5, 6]);
        // A committed version newer than the latest is added, once, in order.
        let e = RankEntry { rank: 0, baseline: false, file_len: 100, trailer: "ab".into() };
        CommitRecord { version: 8, ranks: 1, entries: vec![e] }.write(dir.path()).expect("write");
        let log = CommitLog::load(dir.path()).expect("load");
        assert_eq!(roll_forward(&mut m, &log), vec![8]);
        assert_eq!(roll_forward(&mut m, &log), Vec::<u64>::new());
        let got: Vec<u64> = m.versions.iter().map(|v| v.version).collect();
        assert_eq!(got, vec![1, 2, 4, 5, 6, 8]);
        assert!(Manifest::decode(&m.encode(), Path::new("m")).is_ok());
    }
}
