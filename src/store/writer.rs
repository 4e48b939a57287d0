//! The one writer of a rank's directory: [`StoreWriter`] holds the
//! directory's lock for its life, cleans up what an interrupted writer
//! left, and is the only type that writes files or the manifest (the
//! commit protocol: a durable diff file, then the manifest, or a
//! collective commit record that names it). Reads go through the
//! [`Store`] view it dereferences to.

use super::commits::{self, CommitLog};
use super::{OpenNotes, Store, StoreOptions, parse_diff_name, rank_rel, read_manifest, roll_forward, versions_present};
use crate::error::{Error, Result};
use crate::format::manifest::{Manifest, VersionEntry};
use crate::layout::Layout;
use crate::storage::{self, Fill, LockGuard, Posix, Storage};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The writer's handle of one rank's directory (the lock held).
#[derive(Debug)]
pub struct StoreWriter {
    view: Store,
    /// Held for the writer's life; dropping it lets the next writer in.
    _lock: Box<dyn LockGuard>,
}

impl std::ops::Deref for StoreWriter {
    type Target = Store;

    fn deref(&self) -> &Store {
        &self.view
    }
}

impl StoreWriter {
    /// Opens the store of `rank` for writing, creating it (with an empty
    /// manifest, durably) when the rank has no directory or an empty one.
    /// Takes the writer lock (a second writer gets [`Error::Locked`] at
    /// once), checks the parameters, rolls the manifest forward from the
    /// collective commit records, and removes temporary files and diff files
    /// of versions that were never committed. A rank directory holding diff
    /// files but no manifest is refused ([`Error::NeedsRepair`]): dckpt never
    /// silently starts a new history where one exists.
    pub fn open(root: &Path, rank: u32, data_len: u64, opts: &StoreOptions) -> Result<(Self, OpenNotes)> {
        Layout::new(data_len, opts.chunk_size)?;
        // One spelling of the root from here on (`a/../b` through a missing
        // `a` is created, and then resolves to the real `b`).
        Self::open_in(Arc::new(Posix::create(root)?), rank, data_len, opts)
    }

    /// As [`StoreWriter::open`], but removing nothing: the writer that
    /// finishes a dead writer's flushes (the per-node agent), for which the
    /// files of versions not committed yet are the work, not debris.
    pub fn open_to_finish(root: &Path, rank: u32, data_len: u64, opts: &StoreOptions) -> Result<Self> {
        Layout::new(data_len, opts.chunk_size)?;
        Self::open_with(Arc::new(Posix::create(root)?), rank, data_len, opts, false).map(|(s, _)| s)
    }

    /// As [`StoreWriter::open`], on any storage.
    pub fn open_in(
        storage: Arc<dyn Storage>,
        rank: u32,
        data_len: u64,
        opts: &StoreOptions,
    ) -> Result<(Self, OpenNotes)> {
        Self::open_with(storage, rank, data_len, opts, true)
    }

    /// Opens the store; `tidy`: removes what no committed version needs.
    fn open_with(
        storage: Arc<dyn Storage>,
        rank: u32,
        data_len: u64,
        opts: &StoreOptions,
        tidy: bool,
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
        let mut store = StoreWriter { view: Store { storage, root, rel, dir, manifest }, _lock: lock };
        if store.view.manifest.versions.is_empty() {
            // Parameters are fixed by the first committed version, not by an
            // open: an empty store takes the ones asked for.
            let fresh = (data_len, opts.chunk_size, opts.method, opts.hash);
            let m = &mut store.view.manifest;
            if (m.data_len, m.chunk_size, m.method, m.hash) != fresh {
                (m.data_len, m.chunk_size, m.method, m.hash) = fresh;
                notes.created = true;
            }
        }
        store.check_params(data_len, opts)?;
        if notes.created || !notes.rolled_forward.is_empty() {
            store.write_manifest(&store.view.manifest.clone())?;
        }
        if !tidy {
            notes.damaged_records = log.damaged().to_vec();
            return Ok((store, notes));
        }
        notes.removed = store.remove_unfinished(rank == 0, &log.damaged_versions())?;
        // This rank's commit parts of versions that never committed (an
        // asynchronous collective run that stopped before every rank had
        // flushed): a later run may take those version numbers again.
        let stray: Vec<PathBuf> = log.stray_parts(rank).map(|(_, rel)| rel.to_path_buf()).collect();
        for rel in &stray {
            store.view.storage.remove(rel)?;
            notes.removed.push(store.view.storage.locate(rel));
        }
        if !stray.is_empty() {
            store.view.storage.barrier(Path::new(commits::COMMITS_DIR))?;
        }
        notes.damaged_records = log.damaged().to_vec();
        Ok((store, notes))
    }

    fn check_params(&self, data_len: u64, opts: &StoreOptions) -> Result<()> {
        let m = &self.view.manifest;
        let mismatch = |what, existing: String, requested: String| {
            Err(Error::Mismatch { what, dir: self.view.dir.clone(), existing, requested })
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
        let mut dirs = vec![self.view.rel.clone()];
        if commits {
            dirs.push(PathBuf::from(commits::COMMITS_DIR));
        }
        for dir in &dirs {
            let Ok(entries) = self.view.storage.list(dir) else { continue };
            let before = removed.len();
            for entry in entries {
                // Files and links only; a version whose commit record is
                // damaged keeps its files for `dckpt repair` to judge.
                let name = &entry.name;
                let stale = !entry.is_dir
                    && (storage::is_temp_name(name)
                        || (dir == &self.view.rel
                            && parse_diff_name(name)
                                .is_some_and(|v| self.view.manifest.get(v).is_none() && !damaged.contains(&v))));
                if stale {
                    let rel = dir.join(name);
                    self.view.storage.remove(&rel)?;
                    removed.push(self.view.storage.locate(&rel));
                }
            }
            if removed.len() > before {
                self.view.storage.barrier(dir)?;
            }
        }
        Ok(removed)
    }

    fn check_newer(&self, version: u64) -> Result<()> {
        crate::error::check_version_number(version)?;
        match self.view.manifest.latest() {
            Some(latest) if latest.version >= version => {
                Err(Error::VersionNotNewer { latest: latest.version, requested: version })
            }
            _ => Ok(()),
        }
    }

    /// Durably writes a version's diff file and lists it in the manifest.
    pub fn commit(&mut self, version: u64, baseline: bool, diff: &[u8]) -> Result<()> {
        let entry = self.write_files(version, baseline, diff)?;
        self.publish(entry)
    }

    /// Step 1 of a commit: durably writes a version's diff file. It stays
    /// invisible (restore, reopen and `verify` ignore it; the next writer to
    /// open the store removes it) until [`StoreWriter::publish`] lists the returned
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

    /// As [`StoreWriter::write_files`], with the file's bytes written by `fill`
    /// (for example in pieces from pinned memory) and its trailer given.
    pub fn write_diff_with(
        &self,
        version: u64,
        baseline: bool,
        file_len: u64,
        trailer: Option<&[u8]>,
        fill: Fill<'_>,
    ) -> Result<VersionEntry> {
        self.check_newer(version)?;
        let trailer = trailer
            .filter(|t| t.len() == 32 && file_len >= 32)
            .ok_or_else(|| Error::Internal("a diff file too short to hold a trailer".into()))?;
        self.view.storage.write_atomic(&self.diff_rel(version), fill)?;
        self.view.storage.barrier(&self.view.rel)?;
        crate::failpoint::hit("store.file_durable");
        Ok(VersionEntry { version, baseline, file_len, trailer: hex::encode(trailer) })
    }

    /// Step 2 of a single-rank commit: lists a written version in the
    /// manifest (atomic). This is the commit point.
    pub fn publish(&mut self, entry: VersionEntry) -> Result<()> {
        self.check_newer(entry.version)?;
        let mut next = self.view.manifest.clone();
        next.versions.push(entry);
        self.write_manifest(&next)?;
        self.view.manifest = next;
        Ok(())
    }

    /// Deletes committed `versions` of this rank (retention): first they
    /// leave the manifest (no longer committed), then this rank's commit
    /// parts of them (`part_of`, collective), then their diff files. A crash
    /// in between leaves files of uncommitted versions, which the next
    /// writer removes. The caller makes sure no kept version needs them.
    pub fn retire(&mut self, versions: &[u64], part_of: Option<u32>) -> Result<()> {
        if versions.is_empty() {
            return Ok(());
        }
        if self.view.manifest.versions.iter().any(|e| versions.contains(&e.version)) {
            let mut next = self.view.manifest.clone();
            next.versions.retain(|e| !versions.contains(&e.version));
            self.write_manifest(&next)?;
            self.view.manifest = next;
        }
        let remove = |rel: &Path| match self.view.storage.remove(rel) {
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        };
        if let Some(rank) = part_of {
            for &v in versions {
                remove(&commits::part_rel(v, rank))?;
            }
            self.view.storage.barrier(Path::new(commits::COMMITS_DIR))?;
        }
        for &v in versions {
            remove(&self.diff_rel(v))?;
        }
        self.view.storage.barrier(&self.view.rel)
    }

    fn write_manifest(&self, m: &Manifest) -> Result<()> {
        storage::write_bytes(self.view.storage.as_ref(), &self.view.rel.join("MANIFEST"), &m.encode())?;
        crate::failpoint::hit("store.manifest_written");
        self.view.storage.barrier(&self.view.rel)
    }
}
