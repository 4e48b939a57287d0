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

use crate::error::{Error, Result};
use crate::format::diff_file::DiffReader;
use crate::format::manifest::{Manifest, VersionEntry};
use crate::restore::Catalog;
use crate::store::commits::{CommitLog, commits_dir};
use crate::store::{self, diff_files_present, list_ranks, rank_dir, roll_forward, sync_dir, write_atomic};
use std::collections::{BTreeMap, BTreeSet};
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
/// opposed to a condition of this machine that must stop the repair). An
/// error agreed over ranks ([`Error::OnRanks`]) by its kind.
pub fn is_damage(e: &Error) -> bool {
    use crate::error::ErrorKind as K;
    match e {
        Error::Corrupt { .. }
        | Error::BrokenReference { .. }
        | Error::OwnerUnavailable { .. }
        | Error::MissingVersion { .. }
        | Error::NoStore { .. } => true,
        Error::OnRanks { kind, .. } => {
            matches!(kind, K::Corrupt | K::BrokenReference | K::OwnerUnavailable | K::MissingVersion | K::NoStore)
        }
        // Missing, or a FIFO, device or link in a file's place (refused
        // before any read could block: `fsio::open_regular`).
        Error::Io { source, .. } => {
            matches!(source.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::InvalidInput)
        }
        _ => false,
    }
}

/// Whether `e` is a store in use by another writer (on this rank or, agreed,
/// on another): a condition of the moment, never a sign of damage, so a
/// restart neither falls back past it nor sets anything aside.
pub fn is_in_use(e: &Error) -> bool {
    match e {
        Error::Locked { .. } => true,
        Error::OnRanks { kind, .. } => *kind == crate::error::ErrorKind::Locked,
        _ => false,
    }
}

/// Sets aside every version of `rank` newer than `keep_through` under the
/// store root `root`, for a restart that fell back past them (damaged on
/// some rank of every tier): their commit records and this rank's commit
/// parts first, then the manifest lists nothing newer, then their diff
/// files are renamed `*.damaged` (nothing is deleted). Every rank calls it
/// for itself before any reopens the store (a record left behind would roll
/// a version forward again); a file another rank set aside already is
/// skipped. Takes the rank's writer lock. Returns the versions set aside.
pub fn set_aside_newer(root: &Path, rank: u32, keep_through: u64) -> Result<Vec<u64>> {
    let dir = rank_dir(root, rank);
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let _lock = store::lock_rank_dir(&dir)?;
    let aside = |path: &Path| {
        let mut to = path.as_os_str().to_owned();
        to.push(".damaged");
        match fs::rename(path, &to) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(path, e)),
            _ => Ok(()),
        }
    };
    let mut newer = BTreeSet::new();
    let cdir = commits_dir(root);
    if let Ok(entries) = fs::read_dir(&cdir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let version = match (
                crate::store::commits::parse_record_name(&name),
                crate::store::commits::parse_part_name(&name),
            ) {
                (Some(v), _) => Some(v),
                // This rank's parts, and those of ranks stored elsewhere (a
                // node-local directory holds every rank's parts, issue #31):
                // no writer here sets those aside.
                (None, Some((v, r))) if r == rank || !rank_dir(root, r).is_dir() => Some(v),
                _ => None,
            };
            if let Some(v) = version.filter(|&v| v > keep_through) {
                aside(&e.path())?;
                newer.insert(v);
            }
        }
        store::sync_dir(&cdir)?;
    }
    let mpath = dir.join("MANIFEST");
    let bytes = match crate::storage::fsio::read_regular(&mpath) {
        Ok(bytes) => Some(bytes),
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    // (No manifest: a rank that never committed; its files only.)
    if let Some(bytes) = bytes {
        let mut manifest = Manifest::decode(&bytes, &mpath)?;
        if manifest.versions.iter().any(|e| e.version > keep_through) {
            newer.extend(manifest.versions.iter().map(|e| e.version).filter(|&v| v > keep_through));
            manifest.versions.retain(|e| e.version <= keep_through);
            write_manifest(&dir, &manifest)?;
        }
    }
    for e in fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(v) = store::parse_diff_name(&name).filter(|&v| v > keep_through) {
            aside(&e.path())?;
            newer.insert(v);
        }
    }
    store::sync_dir(&dir)?;
    Ok(newer.into_iter().collect())
}

/// Repairs every rank's store under `root`; with `dry_run`, only reports.
pub fn repair_store(root: &Path, dry_run: bool) -> Result<RepairReport> {
    repair_store_with(root, &RepairOptions { dry_run, ranks_lost: false })
}

/// How [`repair_store_with`] may act.
#[derive(Clone, Copy, Debug, Default)]
pub struct RepairOptions {
    /// Only report what would be done.
    pub dry_run: bool,
    /// The ranks the commit records name but whose directories are not
    /// under the root are lost for good: the versions that need them are
    /// delisted. Without it such a store is refused unchanged: it is most
    /// likely one node's directory of a store spread over nodes (a
    /// node-local tier), where the other ranks live on the other nodes.
    pub ranks_lost: bool,
}

/// Mends one rank's damaged or lost manifest under the store root `root`
/// (its bytes unreadable, a FIFO, device or link in its place, or gone
/// while diff files are there) as [`repair_store`] would, and nothing else:
/// rebuilt from the diff files that verify and the commit records, under
/// the rank's lock. What a job does for its own rank before listing its
/// versions, so that a damaged manifest never stops every later run.
/// `None` when there was nothing to mend (a readable manifest, or no file
/// of the rank at all).
pub fn mend_manifest(root: &Path, rank: u32) -> Result<Option<RepairReport>> {
    let mpath = rank_dir(root, rank).join("MANIFEST");
    let mut bytes = Vec::new();
    let read =
        crate::storage::fsio::open_regular(&mpath).and_then(|mut f| std::io::Read::read_to_end(&mut f, &mut bytes));
    match read {
        Ok(_) if Manifest::decode(&bytes, &mpath).is_ok() => return Ok(None),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let dir = rank_dir(root, rank);
            if !dir.is_dir() || diff_files_present(&dir)?.is_empty() {
                return Ok(None);
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {}
        Err(e) => return Err(Error::io(&mpath, e)),
    }
    let _lock = store::lock_rank_dir(&rank_dir(root, rank))?;
    let log = CommitLog::load(root)?;
    let aside: BTreeSet<u64> = log.damaged_versions().into_iter().collect();
    let mut report = RepairReport { ranks: 1, ..Default::default() };
    settle_manifest(root, rank, &log, &aside, false, &mut report)?;
    Ok(Some(report))
}

/// [`repair_store`] with its options.
pub fn repair_store_with(root: &Path, opts: &RepairOptions) -> Result<RepairReport> {
    let dry_run = opts.dry_run;
    let mut report = RepairReport::default();
    let log = CommitLog::load(root)?;
    let present: BTreeSet<u32> = list_ranks(root)?.into_iter().collect();
    let mut ranks = present.clone();
    for r in log.records() {
        ranks.extend(r.entries.iter().map(|e| e.rank));
    }
    if ranks.is_empty() {
        // No rank directory and no commit record: not a store (or the wrong level of one).
        return Err(Error::NoStore { dir: root.to_path_buf(), rank: 0 });
    }
    let absent: Vec<u32> = ranks.difference(&present).copied().collect();
    if !absent.is_empty() && !present.is_empty() && !opts.ranks_lost {
        return Err(Error::InvalidOption(format!(
            "{}: the commit records name rank(s) {absent:?}, whose directories are not here (rank(s) {:?} are). \
             A store spread over nodes (a node-local tier) is repaired with every node's directory in place, \
             never one node's alone; a lost node's ranks are rebuilt from their copies by the job's next \
             restart. Nothing was changed. If those ranks are lost for good, `dckpt repair --dir {} \
             --ranks-lost` delists every version that needs them",
            root.display(),
            present.iter().collect::<Vec<_>>(),
            root.display()
        )));
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
            for rel in log.files_of(r.version) {
                set_aside(&mut report, &root.join(rel), &why, dry_run)?;
            }
        }
    }
    // Phase 1: every rank's manifest readable, rolled forward, starting at a baseline.
    let mut manifests: BTreeMap<u32, Manifest> = BTreeMap::new();
    for &rank in &ranks {
        let dir = rank_dir(root, rank);
        if !dir.is_dir() || fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink()) {
            continue;
        }
        report.ranks += 1;
        if let Some((m, unchanged)) = settle_manifest(root, rank, &log, &set_aside_versions, dry_run, &mut report)? {
            if dry_run && !unchanged {
                report
                    .act(&rank_dir(root, rank), "dry run: its manifest would change, so its versions are not checked");
                continue;
            }
            manifests.insert(rank, m);
        }
    }
    // Phase 2: delist what does not restore (a full verified restore, every
    // reference checked), until nothing changes: a version whose chain ran
    // through a delisted one fails in the next pass and goes too.
    let mut delisted: BTreeMap<u32, BTreeSet<u64>> = BTreeMap::new();
    let collective: BTreeSet<u64> = log.records().map(|r| r.version).collect();
    loop {
        let mut catalog = Catalog::new(root);
        let mut bad: Vec<(u32, u64)> = Vec::new();
        for (&rank, m) in &manifests {
            for e in &m.versions {
                match crate::restore::restore_in(&mut catalog, rank, e.version) {
                    Ok(_) => {}
                    Err(err) if is_damage(&err) => bad.push((rank, e.version)),
                    Err(err) => return Err(err),
                }
            }
        }
        // A version the job committed together (a commit record names it)
        // is one version: where it no longer restores on one rank, or went
        // there with its chain, it goes on every rank still listing it, or
        // the others would list a version the job cannot restart and refuse
        // its next checkpoints as not newer.
        let gone_from: BTreeMap<u64, u32> = bad
            .iter()
            .map(|&(r, v)| (v, r))
            .chain(delisted.iter().flat_map(|(&r, vs)| vs.iter().map(move |&v| (v, r))))
            .filter(|(v, _)| collective.contains(v))
            .collect();
        let spread: Vec<(u32, u64, u32)> = gone_from
            .iter()
            .flat_map(|(&v, &from)| {
                manifests
                    .iter()
                    .filter(move |(r, m)| **r != from && m.get(v).is_some())
                    .map(move |(&r, _)| (r, v, from))
            })
            .filter(|(r, v, _)| !bad.contains(&(*r, *v)))
            .collect();
        if bad.is_empty() && spread.is_empty() {
            break;
        }
        let causes: Vec<(u32, u64, Option<u32>)> = bad
            .iter()
            .map(|&(r, v)| (r, v, None))
            .chain(spread.iter().map(|&(r, v, from)| (r, v, Some(from))))
            .collect();
        for (rank, v, from) in causes {
            let dir = rank_dir(root, rank);
            if delisted.get(&rank).is_some_and(|gone| gone.contains(&v)) {
                continue;
            }
            match from {
                None => report
                    .act(&dir.join(store::diff_file_name(v)), "committed version that no longer restores: delisted"),
                Some(k) => report.act(
                    &dir.join(store::diff_file_name(v)),
                    format!("delisted: the job's version {v} no longer restores on rank {k}"),
                ),
            }
            // Every later version up to the next baseline goes too: its
            // unchanged chunks would otherwise resolve to an older version
            // (wrong bytes that no checksum catches).
            let gone = delisted.entry(rank).or_default();
            gone.insert(v);
            if let Some(m) = manifests.get(&rank) {
                for e in m.versions.iter().filter(|e| e.version > v) {
                    if e.baseline {
                        break;
                    }
                    if gone.insert(e.version) {
                        report.act(
                            &dir.join(store::diff_file_name(e.version)),
                            "delisted: its chain runs through a delisted version",
                        );
                    }
                }
            }
        }
        for (&rank, m) in manifests.iter_mut() {
            let gone = delisted.get(&rank).cloned().unwrap_or_default();
            m.versions.retain(|e| !gone.contains(&e.version));
            trim_to_baseline(m, &rank_dir(root, rank), &mut report, delisted.entry(rank).or_default());
            if !dry_run {
                write_manifest(&rank_dir(root, rank), m)?;
            }
        }
        if dry_run {
            break; // later passes read the manifests from disk
        }
    }
    // Phase 3: files of delisted versions set aside, leftovers removed, and
    // the commit records of versions delisted anywhere set aside.
    let mut any_delisted: BTreeSet<u64> = BTreeSet::new();
    for (&rank, m) in &manifests {
        let dir = rank_dir(root, rank);
        let gone = delisted.get(&rank).cloned().unwrap_or_default();
        any_delisted.extend(gone.iter().copied());
        let committed_elsewhere: BTreeSet<u64> = log.entries_of(rank).map(|e| e.version).collect();
        let listed = |v: u64| m.get(v).is_some();
        let keep = |v: u64| gone.contains(&v) || set_aside_versions.contains(&v) || committed_elsewhere.contains(&v);
        clean_files(&dir, &listed, &keep, dry_run, &mut report)?;
    }
    for r in log.records() {
        if any_delisted.contains(&r.version) && !set_aside_versions.contains(&r.version) {
            for rel in log.files_of(r.version) {
                set_aside(&mut report, &root.join(rel), "commit record of a version delisted on some rank", dry_run)?;
            }
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

fn write_manifest(dir: &Path, m: &Manifest) -> Result<()> {
    write_atomic(&dir.join("MANIFEST"), &m.encode())?;
    sync_dir(dir)
}

/// Keeps the manifest's rule: the oldest listed version is a baseline.
fn trim_to_baseline(m: &mut Manifest, dir: &Path, report: &mut RepairReport, delisted: &mut BTreeSet<u64>) {
    let first_baseline = m.versions.iter().position(|e| e.baseline).unwrap_or(m.versions.len());
    for e in m.versions.drain(..first_baseline) {
        report.act(&dir.join(store::diff_file_name(e.version)), "delisted: no baseline before it restores");
        delisted.insert(e.version);
    }
}

/// Phase 1 for one rank: its manifest as read, or rebuilt from the files
/// that verify, rolled forward, starting at a baseline, and written; with
/// whether it equals the one on disk. `None` when the rank has no manifest
/// and nothing to rebuild one from.
fn settle_manifest(
    root: &Path,
    rank: u32,
    log: &CommitLog,
    set_aside_versions: &BTreeSet<u64>,
    dry_run: bool,
    report: &mut RepairReport,
) -> Result<Option<(Manifest, bool)>> {
    let dir = rank_dir(root, rank);
    let mpath = dir.join("MANIFEST");
    let mut bytes = Vec::new();
    let read =
        crate::storage::fsio::open_regular(&mpath).and_then(|mut f| std::io::Read::read_to_end(&mut f, &mut bytes));
    let decoded = match read {
        Ok(_) => Some(Manifest::decode(&bytes, &mpath)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        // A FIFO, device or link in its place: a damaged manifest (set aside below).
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => Some(Err(Error::io(&mpath, e))),
        Err(e) => return Err(Error::io(&mpath, e)),
    };
    let mut damaged_manifest = false;
    let original = match decoded {
        Some(Ok(m)) if m.rank != rank => {
            report.act(&mpath, format!("left alone: the manifest is rank {}'s, not rank {rank}'s", m.rank));
            return Ok(None);
        }
        Some(Ok(m)) => Some(m),
        Some(Err(e)) => {
            report.act(&mpath, format!("damaged: {e}"));
            damaged_manifest = true;
            None
        }
        None => None,
    };
    let mut manifest = match original.clone() {
        Some(m) => m,
        None => match manifest_from_files(&dir, rank, log)? {
            Some(m) => {
                report.act(&mpath, format!("rebuilt from {} diff file(s) that verify", m.versions.len()));
                m
            }
            None => {
                // Nothing to rebuild from: leftovers of a first checkpoint
                // (and a damaged manifest set aside, so the rank starts anew).
                if damaged_manifest {
                    set_aside(report, &mpath, "no diff file verifies to rebuild the manifest from", dry_run)?;
                }
                clean_files(&dir, &|_| false, &|v| set_aside_versions.contains(&v), dry_run, report)?;
                return Ok(None);
            }
        },
    };
    let mut rolled = manifest.clone();
    roll_forward(&mut rolled, log);
    rolled.versions.retain(|e| manifest.get(e.version).is_some() || !set_aside_versions.contains(&e.version));
    manifest = rolled;
    trim_to_baseline(&mut manifest, &dir, report, &mut BTreeSet::new());
    let unchanged = original.as_ref() == Some(&manifest);
    if !dry_run && !unchanged {
        write_manifest(&dir, &manifest)?;
    }
    Ok(Some((manifest, unchanged)))
}

/// Removes temporary files, record segments and unlisted diff files; an
/// unlisted diff file for which `keep` holds (a delisted version, one whose
/// commit record was set aside or that a record still names) is set aside
/// instead, never deleted.
fn clean_files(
    dir: &Path,
    listed: &dyn Fn(u64) -> bool,
    keep: &dyn Fn(u64) -> bool,
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
            if keep(v) {
                set_aside(report, &path, "diff file of a version no manifest lists any more", dry_run)?;
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
        let committed = log.entries_of(rank).any(|e| e.version == v && e.trailer == hex::encode(r.trailer()));
        let refs = r.diff.shift.iter().any(|s| s.reference.is_some());
        match r.verify_data() {
            Ok(()) => {}
            Err(e) if is_damage(&e) => continue,
            Err(e) => return Err(e),
        }
        // In a collective store only committed versions count (a version
        // abandoned before its record has no place in any chain).
        let collective = refs || !log.is_empty();
        if h.rank != rank || h.version != v || (collective && !committed) {
            continue;
        }
        let entry = VersionEntry {
            version: v,
            baseline: r.diff.baseline,
            file_len: r.file_len(),
            trailer: hex::encode(r.trailer()),
        };
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
