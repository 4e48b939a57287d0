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

pub use crate::storage::fsio;
pub use fsio::{hex, sync_dir, write_atomic, write_output};

use crate::error::{Error, Result};
use crate::format::manifest::{Manifest, VersionEntry};
use crate::hash::HashAlgo;
use crate::layout::Layout;
use crate::method::Method;
use crate::storage::{self, Fill, LockGuard, Posix, Storage};
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

/// One rank's directory: a read-only view ([`Store::open`]) or the one
/// writer's handle ([`Store::open_writer`], which holds the lock). Every
/// access goes through its [`Storage`].
#[derive(Debug)]
pub struct Store {
    storage: Arc<dyn Storage>,
    root: PathBuf,
    /// The rank directory, relative to the storage root.
    rel: PathBuf,
    dir: PathBuf,
    manifest: Manifest,
    lock: Option<Box<dyn LockGuard>>,
}

/// What [`Store::open_writer`] found and did.
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
        Ok(Store { storage, root, rel, dir, manifest, lock: None })
    }

    /// Opens the store of `rank` for writing, creating it (with an empty
    /// manifest, durably) when the rank has no directory or an empty one.
    /// Takes the writer lock (a second writer gets [`Error::Locked`] at
    /// once), checks the parameters, rolls the manifest forward from the
    /// collective commit records, and removes temporary files and diff files
    /// of versions that were never committed. A rank directory holding diff
    /// files but no manifest is refused ([`Error::NeedsRepair`]): dckpt never
    /// silently starts a new history where one exists.
    pub fn open_writer(root: &Path, rank: u32, data_len: u64, opts: &StoreOptions) -> Result<(Self, OpenNotes)> {
        Layout::new(data_len, opts.chunk_size)?;
        // One spelling of the root from here on (`a/../b` through a missing
        // `a` is created, and then resolves to the real `b`).
        Self::open_writer_in(Arc::new(Posix::create(root)?), rank, data_len, opts)
    }

    /// As [`Store::open_writer`], on any storage.
    pub fn open_writer_in(
        storage: Arc<dyn Storage>,
        rank: u32,
        data_len: u64,
        opts: &StoreOptions,
    ) -> Result<(Self, OpenNotes)> {
        Layout::new(data_len, opts.chunk_size)?;
        let root = storage.locate(Path::new(""));
        let rel = rank_rel(rank);
        let dir = storage.locate(&rel);
        storage.create_dir(&rel)?;
        let lock = storage.lock(&rel.join("LOCK"))?;
        let log = CommitLog::load_from(storage.as_ref())?;
        let mut notes = OpenNotes::default();
        let read = read_manifest(storage.as_ref(), &rel, rank).map_err(|e| match e {
            Error::Corrupt { path, reason } => Error::NeedsRepair {
                dir: dir.clone(),
                reason: format!(
                    "{}: corrupt: {reason}; `dckpt repair --dir {}` rebuilds it from the diff files",
                    path.display(),
                    root.display()
                ),
            },
            other => other,
        })?;
        let manifest = match read {
            Some(mut m) => {
                notes.rolled_forward = roll_forward(&mut m, &log);
                m
            }
            None => {
                let present = versions_present(storage.as_ref(), &rel)?;
                let committed = log.entries_of(rank).count();
                if !present.is_empty() || committed > 0 {
                    return Err(Error::NeedsRepair {
                        dir: dir.clone(),
                        reason: format!(
                            "MANIFEST is missing but {} diff file(s) and {committed} committed collective version(s) \
                             are here; `dckpt repair --dir {}` rebuilds it from the files, or move them away to \
                             start a new store",
                            present.len(),
                            root.display()
                        ),
                    });
                }
                notes.created = true;
                Manifest {
                    rank,
                    data_len,
                    chunk_size: opts.chunk_size,
                    method: opts.method,
                    hash: opts.hash,
                    versions: Vec::new(),
                }
            }
        };
        let mut store = Store { storage, root, rel, dir, manifest, lock: Some(lock) };
        if store.manifest.versions.is_empty() {
            // Parameters are fixed by the first committed version, not by an
            // open: an empty store takes the ones asked for.
            let fresh = (data_len, opts.chunk_size, opts.method, opts.hash);
            let m = &mut store.manifest;
            if (m.data_len, m.chunk_size, m.method, m.hash) != fresh {
                (m.data_len, m.chunk_size, m.method, m.hash) = fresh;
                notes.created = true;
            }
        }
        store.check_params(data_len, opts)?;
        if notes.created || !notes.rolled_forward.is_empty() {
            store.write_manifest(&store.manifest.clone())?;
        }
        notes.removed = store.remove_unfinished(rank == 0, &log.damaged_versions())?;
        // This rank's commit parts of versions that never committed (an
        // asynchronous collective run that stopped before every rank had
        // flushed): a later run may take those version numbers again.
        let stray: Vec<PathBuf> = log.stray_parts(rank).map(|(_, rel)| rel.to_path_buf()).collect();
        for rel in &stray {
            store.storage.remove(rel)?;
            notes.removed.push(store.storage.locate(rel));
        }
        if !stray.is_empty() {
            store.storage.barrier(Path::new(commits::COMMITS_DIR))?;
        }
        notes.damaged_records = log.damaged().to_vec();
        Ok((store, notes))
    }

    fn check_params(&self, data_len: u64, opts: &StoreOptions) -> Result<()> {
        let m = &self.manifest;
        let mismatch = |what, existing: String, requested: String| {
            Err(Error::Mismatch { what, dir: self.dir.clone(), existing, requested })
        };
        if m.data_len != data_len {
            return mismatch("data length", format!("{} bytes", m.data_len), format!("{data_len} bytes"));
        }
        if m.chunk_size != opts.chunk_size {
            return mismatch("chunk size", m.chunk_size.to_string(), opts.chunk_size.to_string());
        }
        if m.method != opts.method {
            return mismatch("method", m.method.to_string(), opts.method.to_string());
        }
        if m.hash != opts.hash {
            return mismatch("hash", m.hash.to_string(), opts.hash.to_string());
        }
        Ok(())
    }

    /// Removes temporary files, and diff files of versions not committed
    /// (with `commits`, temporary files of commit records too). Only the
    /// writer (holding the lock) calls it.
    fn remove_unfinished(&self, commits: bool, damaged: &[u64]) -> Result<Vec<PathBuf>> {
        let mut removed = Vec::new();
        let mut dirs = vec![self.rel.clone()];
        if commits {
            dirs.push(PathBuf::from(commits::COMMITS_DIR));
        }
        for dir in &dirs {
            let Ok(entries) = self.storage.list(dir) else { continue };
            let before = removed.len();
            for entry in entries {
                // Files and links only; a version whose commit record is
                // damaged keeps its files for `dckpt repair` to judge.
                let name = &entry.name;
                let stale = !entry.is_dir
                    && (storage::is_temp_name(name)
                        || (dir == &self.rel
                            && parse_diff_name(name)
                                .is_some_and(|v| self.manifest.get(v).is_none() && !damaged.contains(&v))));
                if stale {
                    let rel = dir.join(name);
                    self.storage.remove(&rel)?;
                    removed.push(self.storage.locate(&rel));
                }
            }
            if removed.len() > before {
                self.storage.barrier(dir)?;
            }
        }
        Ok(removed)
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

    fn check_newer(&self, version: u64) -> Result<()> {
        match self.manifest.latest() {
            Some(latest) if latest.version >= version => {
                Err(Error::VersionNotNewer { latest: latest.version, requested: version })
            }
            _ => Ok(()),
        }
    }

    fn check_writer(&self) -> Result<()> {
        if self.lock.is_none() {
            return Err(Error::Internal("a read-only store view cannot write".into()));
        }
        Ok(())
    }

    /// Durably writes a version's diff file and lists it in the manifest.
    pub fn commit(&mut self, version: u64, baseline: bool, diff: &[u8]) -> Result<()> {
        let entry = self.write_files(version, baseline, diff)?;
        self.publish(entry)
    }

    /// Step 1 of a commit: durably writes a version's diff file. It stays
    /// invisible (restore, reopen and `verify` ignore it; the next writer to
    /// open the store removes it) until [`Store::publish`] lists the returned
    /// entry, or a collective commit record names it.
    pub fn write_files(&self, version: u64, baseline: bool, diff: &[u8]) -> Result<VersionEntry> {
        self.write_diff_with(
            version,
            baseline,
            diff.len() as u64,
            diff.get(diff.len().saturating_sub(32)..),
            &mut |f| f.write_all(diff),
        )
    }

    /// As [`Store::write_files`], with the file's bytes written by `fill`
    /// (for example in pieces from pinned memory) and its trailer given.
    pub fn write_diff_with(
        &self,
        version: u64,
        baseline: bool,
        file_len: u64,
        trailer: Option<&[u8]>,
        fill: Fill<'_>,
    ) -> Result<VersionEntry> {
        self.check_writer()?;
        self.check_newer(version)?;
        let trailer = trailer
            .filter(|t| t.len() == 32 && file_len >= 32)
            .ok_or_else(|| Error::Internal("a diff file too short to hold a trailer".into()))?;
        self.storage.write_atomic(&self.diff_rel(version), fill)?;
        self.storage.barrier(&self.rel)?;
        crate::failpoint::hit("store.file_durable");
        Ok(VersionEntry { version, baseline, file_len, trailer: hex(trailer) })
    }

    /// Step 2 of a single-rank commit: lists a written version in the
    /// manifest (atomic). This is the commit point.
    pub fn publish(&mut self, entry: VersionEntry) -> Result<()> {
        self.check_writer()?;
        self.check_newer(entry.version)?;
        let mut next = self.manifest.clone();
        next.versions.push(entry);
        self.write_manifest(&next)?;
        self.manifest = next;
        Ok(())
    }

    /// Lists a version that a collective commit record already committed:
    /// the manifest is only a cache of the record, so the version counts as
    /// committed even when writing the manifest fails (the error is
    /// returned; the next writer to open the store rolls it forward).
    pub fn adopt(&mut self, entry: VersionEntry) -> Result<()> {
        self.check_writer()?;
        self.check_newer(entry.version)?;
        let mut next = self.manifest.clone();
        next.versions.push(entry);
        let written = self.write_manifest(&next);
        self.manifest = next;
        written
    }

    /// Deletes committed `versions` of this rank (retention): first they
    /// leave the manifest (no longer committed), then this rank's commit
    /// parts of them (`part_of`, collective), then their diff files. A crash
    /// in between leaves files of uncommitted versions, which the next
    /// writer removes. The caller makes sure no kept version needs them.
    pub fn retire(&mut self, versions: &[u64], part_of: Option<u32>) -> Result<()> {
        self.check_writer()?;
        if versions.is_empty() {
            return Ok(());
        }
        if self.manifest.versions.iter().any(|e| versions.contains(&e.version)) {
            let mut next = self.manifest.clone();
            next.versions.retain(|e| !versions.contains(&e.version));
            self.write_manifest(&next)?;
            self.manifest = next;
        }
        let remove = |rel: &Path| match self.storage.remove(rel) {
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        };
        if let Some(rank) = part_of {
            for &v in versions {
                remove(&commits::part_rel(v, rank))?;
            }
            self.storage.barrier(Path::new(commits::COMMITS_DIR))?;
        }
        for &v in versions {
            remove(&self.diff_rel(v))?;
        }
        self.storage.barrier(&self.rel)
    }

    fn write_manifest(&self, m: &Manifest) -> Result<()> {
        storage::write_bytes(self.storage.as_ref(), &self.rel.join("MANIFEST"), &m.encode())?;
        crate::failpoint::hit("store.manifest_written");
        self.storage.barrier(&self.rel)
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
