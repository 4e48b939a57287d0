//! `dckpt repair`: puts a store back into a state every command accepts,
//! removing only what no committed version needs and saying what it did.
//!
//! Per rank (taking the writer lock, so never under a running job):
//! - temporary files of unfinished writes, diff files of versions that were
//!   never committed, and the record segments (`*.rec`) older dckpt wrote
//!   (the record is now rebuilt from the latest version) are removed;
//! - a missing MANIFEST is rebuilt from the diff files that verify (a
//!   version with cross-rank references only if its commit record exists);
//! - committed versions that no longer restore (damaged or missing files,
//!   or a chain through such a version) are delisted, and their files are
//!   renamed `*.damaged` so nothing is lost without a person deciding.
//!
//! Damaged commit records are renamed `*.damaged` too.

use crate::format::diff_file::DiffReader;
use crate::format::manifest::{Manifest, VersionEntry};
use crate::restore::Catalog;
use crate::store::commits::{CommitLog, commits_dir, parse_record_name};
use crate::store::{self, diff_files_present, hex, list_ranks, rank_dir, sync_dir, write_atomic};
use crate::{Error, Result};
use std::fs;
use std::path::{Path, PathBuf};

/// One action taken (or, in a dry run, that would be taken).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Action {
    /// The file concerned.
    pub path: PathBuf,
    /// What was done and why.
    pub what: String,
}

/// What [`repair_store`] did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RepairReport {
    /// Ranks examined.
    pub ranks: usize,
    /// Actions, in order.
    pub actions: Vec<Action>,
    /// Bytes removed from disk.
    pub bytes_removed: u64,
}

impl RepairReport {
    fn act(&mut self, path: &Path, what: impl Into<String>) {
        self.actions.push(Action { path: path.to_path_buf(), what: what.into() });
    }
}

/// Repairs every rank's store under `root`; with `dry_run`, only reports.
pub fn repair_store(root: &Path, dry_run: bool) -> Result<RepairReport> {
    let mut report = RepairReport::default();
    let cdir = commits_dir(root);
    if let Ok(entries) = fs::read_dir(&cdir) {
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if store::fsio::is_temp_name(&name) {
                remove(&mut report, &path, "temporary file of an unfinished commit record", dry_run)?;
            } else if parse_record_name(&name).is_some() {
                let ok = fs::read(&path)
                    .map_err(|e| Error::io(&path, e))
                    .and_then(|b| store::commits::CommitRecord::decode(&b, &path));
                if let Err(err) = ok {
                    set_aside(&mut report, &path, &format!("damaged commit record ({err})"), dry_run)?;
                }
            }
        }
    }
    let log = if dry_run { CommitLog::load(root).unwrap_or_default() } else { CommitLog::load(root)? };
    for rank in list_ranks(root)? {
        report.ranks += 1;
        repair_rank(root, rank, &log, dry_run, &mut report)?;
    }
    Ok(report)
}

fn remove(report: &mut RepairReport, path: &Path, why: &str, dry_run: bool) -> Result<()> {
    let len = fs::symlink_metadata(path).map(|m| m.len()).unwrap_or(0);
    if !dry_run {
        fs::remove_file(path).map_err(|e| Error::io(path, e))?;
    }
    report.bytes_removed += len;
    report.act(path, format!("removed: {why}"));
    Ok(())
}

fn set_aside(report: &mut RepairReport, path: &Path, why: &str, dry_run: bool) -> Result<()> {
    let mut to = path.as_os_str().to_owned();
    to.push(".damaged");
    if !dry_run {
        fs::rename(path, &to).map_err(|e| Error::io(path, e))?;
    }
    report.act(path, format!("renamed to *.damaged: {why}"));
    Ok(())
}

fn repair_rank(root: &Path, rank: u32, log: &CommitLog, dry_run: bool, report: &mut RepairReport) -> Result<()> {
    let dir = rank_dir(root, rank);
    let _lock = store::lock_rank_dir(&dir)?;
    let mpath = dir.join("MANIFEST");
    let manifest = match fs::read(&mpath) {
        Ok(b) => Manifest::decode(&b, &mpath).map(Some).unwrap_or_else(|e| {
            report.act(&mpath, format!("damaged ({e}); rebuilt from the diff files"));
            None
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io(&mpath, e)),
    };
    let on_disk = manifest.is_some();
    let mut manifest = match manifest {
        Some(m) => m,
        None => match manifest_from_files(&dir, rank, log)? {
            Some(m) => {
                report.act(&mpath, format!("rebuilt from {} diff file(s) that verify", m.versions.len()));
                m
            }
            None => {
                // Nothing to rebuild from: leftovers of a first checkpoint.
                clean_files(&dir, &|_| false, dry_run, report)?;
                return Ok(());
            }
        },
    };
    for e in log.entries_of(rank) {
        if manifest.get(e.version).is_none() {
            manifest.versions.push(e);
        }
    }
    manifest.versions.sort_by_key(|v| v.version);
    // The restore check reads the manifest from disk: write the rebuilt one first.
    if !dry_run {
        write_atomic(&mpath, &manifest.encode())?;
        sync_dir(&dir)?;
    }
    let bad = if dry_run && !on_disk { Vec::new() } else { unrestorable(root, rank, &manifest) };
    for &v in &bad {
        let path = dir.join(store::diff_file_name(v));
        if path.exists() {
            set_aside(report, &path, "committed version that no longer restores; delisted", dry_run)?;
        } else {
            report.act(&path, "committed version whose file is missing; delisted");
        }
    }
    manifest.versions.retain(|e| !bad.contains(&e.version));
    if manifest.versions.first().is_some_and(|e| !e.baseline) {
        // Keep the manifest's rule: the oldest listed version is a baseline.
        let first_baseline = manifest.versions.iter().position(|e| e.baseline).unwrap_or(manifest.versions.len());
        for e in manifest.versions.drain(..first_baseline) {
            report.act(&dir.join(store::diff_file_name(e.version)), "delisted: its baseline no longer restores");
        }
    }
    if !dry_run {
        write_atomic(&mpath, &manifest.encode())?;
        sync_dir(&dir)?;
    }
    let listed = |v: u64| manifest.get(v).is_some();
    clean_files(&dir, &listed, dry_run, report)
}

/// Removes temporary files, record segments and unlisted diff files.
fn clean_files(dir: &Path, listed: &dyn Fn(u64) -> bool, dry_run: bool, report: &mut RepairReport) -> Result<()> {
    let mut names: Vec<(String, PathBuf)> = fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .collect();
    names.sort();
    for (name, path) in names {
        if store::fsio::is_temp_name(&name) {
            remove(report, &path, "temporary file of an unfinished write", dry_run)?;
        } else if name.ends_with(".rec") && name.starts_with('v') {
            remove(report, &path, "record segment of an older dckpt (the record is rebuilt on open)", dry_run)?;
        } else if let Some(v) = store::parse_diff_name(&name)
            && !listed(v)
        {
            remove(report, &path, "diff file of a version that was never committed", dry_run)?;
        }
    }
    if !dry_run {
        sync_dir(dir)?;
    }
    Ok(())
}

/// A manifest listing the diff files of `dir` that verify, or `None` when there are none.
fn manifest_from_files(dir: &Path, rank: u32, log: &CommitLog) -> Result<Option<Manifest>> {
    let mut m: Option<Manifest> = None;
    for v in diff_files_present(dir)? {
        let path = dir.join(store::diff_file_name(v));
        let Ok(r) = DiffReader::open(&path) else { continue };
        let h = &r.header;
        let committed = log.entries_of(rank).any(|e| e.version == v && e.trailer == hex(&r.trailer()));
        let refs = r.diff.shift.iter().any(|s| s.reference.is_some());
        if h.rank != rank || h.version != v || r.verify_data().is_err() || (refs && !committed) {
            continue;
        }
        let entry =
            VersionEntry { version: v, baseline: r.diff.baseline, file_len: r.file_len(), trailer: hex(&r.trailer()) };
        let layout = r.diff.layout;
        let manifest = m.get_or_insert_with(|| Manifest {
            rank,
            data_len: layout.data_len(),
            chunk_size: layout.chunk_size(),
            method: h.method,
            hash: h.hash,
            versions: Vec::new(),
        });
        if manifest.data_len == layout.data_len()
            && manifest.chunk_size == layout.chunk_size()
            && manifest.hash == h.hash
            && manifest.method == h.method
        {
            manifest.versions.push(entry);
        }
    }
    Ok(m)
}

/// Versions of `manifest` that do not restore (checked with full reads).
fn unrestorable(root: &Path, rank: u32, manifest: &Manifest) -> Vec<u64> {
    let mut catalog = Catalog::new(root);
    let mut bad = Vec::new();
    for e in &manifest.versions {
        let ok = catalog.reader(rank, e.version).and_then(|r| r.verify_data()).and_then(|()| {
            let (layout, sources) = crate::restore::resolve(&mut catalog, rank, e.version)?;
            crate::restore::check_sources(&mut catalog, rank, &layout, &sources)
        });
        if ok.is_err() {
            bad.push(e.version);
        }
    }
    bad
}
