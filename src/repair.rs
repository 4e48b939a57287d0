//! `dckpt repair`: puts a store back into a state every command accepts,
//! removing only what no committed version needs and saying what it did.
//!
//! It first takes the writer lock of every rank (so never under a running
//! job: a held lock stops it before anything changes), then:
//! - temporary files of unfinished writes, diff files of versions that were
//!   never committed, and the record segments (`*.rec`) older dckpt wrote
//!   (the record is now rebuilt from the latest version) are removed;
//! - a missing or unreadable MANIFEST is rebuilt from the diff files that
//!   verify (a version with cross-rank references only if its commit record
//!   exists);
//! - committed versions that no longer restore because of damage (a damaged,
//!   foreign or missing file, a broken reference, through a damaged older
//!   version) are delisted and their files renamed `*.damaged`, so nothing is
//!   lost without a person deciding; a collective version delisted anywhere
//!   has its commit record set aside too (`*.damaged`), so it is not rolled
//!   forward again;
//! - damaged commit records are set aside; the files of the versions they
//!   named are set aside, not removed.
//!
//! Errors that are not damage of one version (too many open files, an I/O
//! error, a rank directory that is a link to another) stop the repair with
//! that error instead of delisting anything.

use crate::format::diff_file::DiffReader;
use crate::format::manifest::{Manifest, VersionEntry};
use crate::restore::Catalog;
use crate::store::commits::{CommitLog, commits_dir, record_path};
use crate::store::{self, diff_files_present, hex, list_ranks, rank_dir, roll_forward, sync_dir, write_atomic};
use crate::{Error, Result};
use std::collections::BTreeSet;
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

/// Whether `e`, met while checking one version, is damage of the store (as
/// opposed to a condition of this machine that must stop the repair).
fn is_damage(e: &Error) -> bool {
    match e {
        Error::Corrupt { .. }
        | Error::BrokenReference { .. }
        | Error::OwnerUnavailable { .. }
        | Error::MissingVersion { .. }
        | Error::NoStore { .. } => true,
        Error::Io { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
        _ => false,
    }
}

/// Repairs every rank's store under `root`; with `dry_run`, only reports.
pub fn repair_store(root: &Path, dry_run: bool) -> Result<RepairReport> {
    let mut report = RepairReport::default();
    let log = CommitLog::load(root)?;
    let mut ranks: BTreeSet<u32> = list_ranks(root)?.into_iter().collect();
    for r in log.records() {
        ranks.extend(r.entries.iter().map(|e| e.rank));
    }
    // Every rank's lock first: nothing changes while any writer runs.
    let mut locks = Vec::new();
    for &rank in &ranks {
        let dir = rank_dir(root, rank);
        if fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink()) {
            report.act(&dir, "left alone: the rank directory is a symbolic link");
            continue;
        }
        if dir.is_dir() && !dry_run {
            locks.push(store::lock_rank_dir(&dir)?);
        }
    }
    // Commit records: temporary files go, damaged records are set aside.
    let mut set_aside_versions: BTreeSet<u64> = log.damaged_versions().into_iter().collect();
    let cdir = commits_dir(root);
    if let Ok(entries) = fs::read_dir(&cdir) {
        let mut names: Vec<(String, PathBuf)> =
            entries.flatten().map(|e| (e.file_name().to_string_lossy().into_owned(), e.path())).collect();
        names.sort();
        for (name, path) in names {
            if store::fsio::is_temp_name(&name) && path.is_file() {
                remove(&mut report, &path, "temporary file of an unfinished commit record", dry_run)?;
            }
        }
    }
    for (path, why) in log.damaged() {
        set_aside(&mut report, path, &format!("damaged commit record ({why})"), dry_run)?;
    }
    // Ranks a readable commit record names but whose directory is gone.
    for r in log.records() {
        let missing: Vec<u32> = r.entries.iter().map(|e| e.rank).filter(|&k| !rank_dir(root, k).is_dir()).collect();
        if !missing.is_empty() {
            set_aside_versions.insert(r.version);
            let why = format!("commit record naming rank(s) {missing:?}, whose directory is missing");
            set_aside(&mut report, &record_path(root, r.version), &why, dry_run)?;
        }
    }
    let mut delisted: BTreeSet<u64> = BTreeSet::new();
    for &rank in &ranks {
        let dir = rank_dir(root, rank);
        if !dir.is_dir() || fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink()) {
            continue;
        }
        report.ranks += 1;
        delisted.extend(repair_rank(root, rank, &log, &set_aside_versions, dry_run, &mut report)?);
    }
    // A collective version delisted on any rank is committed nowhere any more.
    for r in log.records() {
        if delisted.contains(&r.version) && !set_aside_versions.contains(&r.version) {
            let path = record_path(root, r.version);
            set_aside(&mut report, &path, "commit record of a version delisted on some rank", dry_run)?;
        }
    }
    drop(locks);
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

/// Repairs one rank; returns the versions it delisted.
fn repair_rank(
    root: &Path,
    rank: u32,
    log: &CommitLog,
    set_aside_versions: &BTreeSet<u64>,
    dry_run: bool,
    report: &mut RepairReport,
) -> Result<Vec<u64>> {
    let dir = rank_dir(root, rank);
    let mpath = dir.join("MANIFEST");
    let decoded = match fs::read(&mpath) {
        Ok(b) => Some(Manifest::decode(&b, &mpath)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io(&mpath, e)),
    };
    let (original, on_disk) = match decoded {
        Some(Ok(m)) if m.rank != rank => {
            report.act(&mpath, format!("left alone: the manifest is rank {}'s, not rank {rank}'s", m.rank));
            return Ok(Vec::new());
        }
        Some(Ok(m)) => (Some(m), true),
        Some(Err(e)) => {
            report.act(&mpath, format!("damaged ({e}); rebuilt from the diff files"));
            (None, false)
        }
        None => (None, false),
    };
    let mut manifest = match original.clone() {
        Some(m) => m,
        None => match manifest_from_files(&dir, rank, log)? {
            Some(m) => {
                report.act(&mpath, format!("rebuilt from {} diff file(s) that verify", m.versions.len()));
                m
            }
            None => {
                // Nothing to rebuild from: leftovers of a first checkpoint.
                clean_files(&dir, &|_| false, set_aside_versions, dry_run, report)?;
                return Ok(Vec::new());
            }
        },
    };
    roll_forward(&mut manifest, log);
    manifest.versions.retain(|e| {
        !set_aside_versions.contains(&e.version) || original.as_ref().is_some_and(|o| o.get(e.version).is_some())
    });
    // The restore check reads the manifest from disk: write the rebuilt one first.
    let mut written = original.clone();
    if !dry_run && written.as_ref() != Some(&manifest) {
        write_atomic(&mpath, &manifest.encode())?;
        sync_dir(&dir)?;
        written = Some(manifest.clone());
    }
    let bad = if dry_run && !on_disk { Vec::new() } else { unrestorable(root, rank, &manifest)? };
    for &v in &bad {
        let path = dir.join(store::diff_file_name(v));
        if path.is_file() {
            set_aside(report, &path, "committed version that no longer restores; delisted", dry_run)?;
        } else {
            report.act(&path, "committed version whose file is missing; delisted");
        }
    }
    manifest.versions.retain(|e| !bad.contains(&e.version));
    let mut delisted = bad;
    if manifest.versions.first().is_some_and(|e| !e.baseline) {
        // Keep the manifest's rule: the oldest listed version is a baseline.
        let first_baseline = manifest.versions.iter().position(|e| e.baseline).unwrap_or(manifest.versions.len());
        for e in manifest.versions.drain(..first_baseline) {
            report.act(&dir.join(store::diff_file_name(e.version)), "delisted: its baseline no longer restores");
            delisted.push(e.version);
        }
    }
    if !dry_run && written.as_ref() != Some(&manifest) {
        write_atomic(&mpath, &manifest.encode())?;
        sync_dir(&dir)?;
    }
    let listed = |v: u64| manifest.get(v).is_some();
    clean_files(&dir, &listed, set_aside_versions, dry_run, report)?;
    Ok(delisted)
}

/// Removes temporary files, record segments and unlisted diff files (those
/// of a version whose commit record was damaged are set aside instead).
fn clean_files(
    dir: &Path,
    listed: &dyn Fn(u64) -> bool,
    set_aside_versions: &BTreeSet<u64>,
    dry_run: bool,
    report: &mut RepairReport,
) -> Result<()> {
    let mut names: Vec<(String, PathBuf)> = fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
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
            if set_aside_versions.contains(&v) {
                set_aside(report, &path, "diff file of a version whose commit record was set aside", dry_run)?;
            } else {
                remove(report, &path, "diff file of a version that was never committed", dry_run)?;
            }
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
        let r = match DiffReader::open(&path) {
            Ok(r) => r,
            Err(e) if is_damage(&e) => continue,
            Err(e) => return Err(e),
        };
        let h = &r.header;
        let committed = log.entries_of(rank).any(|e| e.version == v && e.trailer == hex(&r.trailer()));
        let refs = r.diff.shift.iter().any(|s| s.reference.is_some());
        match r.verify_data() {
            Ok(()) => {}
            Err(e) if is_damage(&e) => continue,
            Err(e) => return Err(e),
        }
        if h.rank != rank || h.version != v || (refs && !committed) {
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
        let same = manifest.data_len == layout.data_len()
            && manifest.chunk_size == layout.chunk_size()
            && manifest.hash == h.hash
            && manifest.method == h.method;
        if same {
            manifest.versions.push(entry);
        }
    }
    Ok(m)
}

/// Versions of `manifest` that do not restore because of damage (checked
/// with full reads); any other error stops the repair.
fn unrestorable(root: &Path, rank: u32, manifest: &Manifest) -> Result<Vec<u64>> {
    let mut catalog = Catalog::new(root);
    let mut bad = Vec::new();
    for e in &manifest.versions {
        let ok = catalog.reader(rank, e.version).and_then(|r| r.verify_data()).and_then(|()| {
            let (layout, sources) = crate::restore::resolve(&mut catalog, rank, e.version)?;
            crate::restore::check_sources(&mut catalog, rank, &layout, &sources)
        });
        match ok {
            Ok(()) => {}
            Err(err) if is_damage(&err) => bad.push(e.version),
            Err(err) => return Err(err),
        }
    }
    Ok(bad)
}
