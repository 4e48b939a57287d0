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
pub mod fsio;

pub use fsio::{hex, sync_dir, write_atomic, write_output};

use crate::format::manifest::{Manifest, VersionEntry};
use crate::layout::Layout;
use crate::{Error, HashAlgo, Method, Result};
use commits::CommitLog;
use serde::{Deserialize, Serialize};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Parameters of a store, fixed at its first checkpoint (the last two are
/// policies that may change between runs). Serde-able for TOML configs.
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
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            chunk_size: 128,
            method: Method::Tree,
            hash: HashAlgo::Murmur3,
            max_chain: None,
            max_record_entries: None,
        }
    }
}

/// One rank's directory: a read-only view ([`Store::open`]) or the one
/// writer's handle ([`Store::open_writer`], which holds the lock).
#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    dir: PathBuf,
    manifest: Manifest,
    lock: Option<File>,
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
    root.join(format!("rank-{rank:05}"))
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
    let mut v: Vec<u64> = match fs::read_dir(dir) {
        Ok(entries) => entries.flatten().filter_map(|e| parse_diff_name(&e.file_name().to_string_lossy())).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(Error::io(dir, e)),
    };
    v.sort_unstable();
    Ok(v)
}

/// Reads a rank's manifest; `Ok(None)` when there is none.
fn read_manifest(dir: &Path, rank: u32) -> Result<Option<Manifest>> {
    let path = dir.join("MANIFEST");
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(&path, e)),
    };
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
        let dir = rank_dir(root, rank);
        let Some(mut manifest) = read_manifest(&dir, rank)? else {
            return Err(Error::NoStore { dir: root.to_path_buf(), rank });
        };
        roll_forward(&mut manifest, log);
        Ok(Store { root: root.to_path_buf(), dir, manifest, lock: None })
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
        fs::create_dir_all(root).map_err(|e| Error::io(root, e))?;
        // One spelling of the root from here on (`a/../b` through a missing
        // `a` has just been created, and now resolves to the real `b`).
        let root = root.canonicalize().map_err(|e| Error::io(root, e))?;
        let dir = rank_dir(&root, rank);
        fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let lock = lock_rank_dir(&dir)?;
        let log = CommitLog::load(&root)?;
        let mut notes = OpenNotes::default();
        let read = read_manifest(&dir, rank).map_err(|e| match e {
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
                let present = diff_files_present(&dir)?;
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
        let mut store = Store { root: root.clone(), dir, manifest, lock: Some(lock) };
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
        let mut dirs = vec![self.dir.clone()];
        if commits {
            dirs.push(commits::commits_dir(&self.root));
        }
        for dir in &dirs {
            let Ok(entries) = fs::read_dir(dir) else { continue };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                // Files and links only; a version whose commit record is
                // damaged keeps its files for `dckpt repair` to judge.
                let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
                let stale = !is_dir
                    && (fsio::is_temp_name(&name)
                        || (dir == &self.dir
                            && parse_diff_name(&name)
                                .is_some_and(|v| self.manifest.get(v).is_none() && !damaged.contains(&v))));
                if stale {
                    let path = entry.path();
                    fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
                    removed.push(path);
                }
            }
            if !removed.is_empty() {
                sync_dir(dir)?;
            }
        }
        Ok(removed)
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
        self.write_diff_with(version, baseline, diff.len() as u64, diff.get(diff.len().saturating_sub(32)..), |f| {
            f.write_all(diff)
        })
    }

    /// As [`Store::write_files`], with the file's bytes written by `fill`
    /// (for example in pieces from pinned memory) and its trailer given.
    pub fn write_diff_with(
        &self,
        version: u64,
        baseline: bool,
        file_len: u64,
        trailer: Option<&[u8]>,
        fill: impl FnOnce(&mut File) -> std::io::Result<()>,
    ) -> Result<VersionEntry> {
        self.check_writer()?;
        self.check_newer(version)?;
        let trailer = trailer
            .filter(|t| t.len() == 32 && file_len >= 32)
            .ok_or_else(|| Error::Internal("a diff file too short to hold a trailer".into()))?;
        fsio::write_atomic_with(&self.diff_path(version), fill)?;
        sync_dir(&self.dir)?;
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

    fn write_manifest(&self, m: &Manifest) -> Result<()> {
        write_atomic(&self.dir.join("MANIFEST"), &m.encode())?;
        sync_dir(&self.dir)
    }
}

/// Takes the writer lock of a rank directory (`LOCK`, an advisory `flock`
/// held for the handle's life; the holder's pid is written into it for the
/// message a second writer gets).
pub fn lock_rank_dir(dir: &Path) -> Result<File> {
    let path = dir.join("LOCK");
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| Error::io(&path, e))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            let holder = text.trim().parse::<u32>().map(|p| format!(" (pid {p})")).unwrap_or_default();
            return Err(Error::Locked { dir: dir.to_path_buf(), holder });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(&path, e)),
    }
    // The pid is a courtesy for the message above; failing to write it is harmless.
    let _ = file.set_len(0).and_then(|()| file.rewind()).and_then(|()| write!(file, "{}", std::process::id()));
    Ok(file)
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
