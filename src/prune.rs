//! `dckpt prune`: deletes the versions that no kept version needs.
//!
//! The kept versions are the newest `keep` version numbers of the store, on
//! every rank that lists them (a collective version stays whole), and the
//! newest `keep` versions of each rank.
//! What they need is found by the restore's own resolution, to a fixpoint:
//! each kept version needs its chain (baseline to it), every file its bytes
//! are read from, and the owners' files of the cross-rank references it
//! follows; each of those is kept in turn with everything *it* needs, so
//! every version still listed afterwards restores. Everything else goes.
//!
//! Crash-safe in this order, every rank's lock held throughout: each rank's
//! manifest is rewritten without the deleted versions (they are no longer
//! committed), then their diff files are removed, then the commit records
//! whose every rank's version was deleted. A crash in between leaves diff
//! files of uncommitted versions, which the next writer removes, or commit
//! records older than every manifest's latest version, which never list a
//! version again (roll-forward only appends newer versions). A crash between
//! two ranks' manifest rewrites can leave a rank listing versions being
//! deleted whose owners' files are already gone: running `prune` again
//! finishes the deletion.

use crate::error::{Error, Result};
use crate::format::manifest::Manifest;
use crate::restore::{Catalog, resolve_all};
use crate::storage::{self, LockGuard, Posix, Storage};
use crate::store::commits::{COMMITS_DIR, CommitLog};
use crate::store::{Store, diff_file_name, list_ranks, rank_rel};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What [`prune_store`] did (or, in a dry run, would do).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PruneReport {
    /// Ranks examined.
    pub ranks: usize,
    /// `(rank, version)` kept.
    pub kept: Vec<(u32, u64)>,
    /// `(rank, version)` deleted.
    pub deleted: Vec<(u32, u64)>,
    /// Commit records removed (their version was deleted on every rank).
    pub records_removed: Vec<u64>,
    /// Bytes of the files removed.
    pub bytes_removed: u64,
}

/// Deletes every version of every rank under `root` that the last `keep`
/// versions of each rank do not need (see the module documentation). With
/// `dry_run`, only reports. Takes every rank's writer lock (a running writer
/// makes it fail with [`Error::Locked`]).
pub fn prune_store(root: &Path, keep: u64, dry_run: bool) -> Result<PruneReport> {
    if keep == 0 {
        return Err(Error::InvalidOption("prune keeps at least one version per rank (--keep 1 or more)".into()));
    }
    let storage: Arc<dyn Storage> = Arc::new(Posix::at(root));
    let ranks = list_ranks(root)?;
    if ranks.is_empty() {
        // Not a store (or the wrong level of one): say so rather than prune nothing.
        return Err(Error::NoStore { dir: root.to_path_buf(), rank: 0 });
    }
    let mut locks: Vec<Box<dyn LockGuard>> = Vec::new();
    if !dry_run {
        for &rank in &ranks {
            locks.push(storage.lock(&rank_rel(rank).join("LOCK"))?);
        }
    }
    let log = CommitLog::load_from(storage.as_ref())?;
    let mut manifests: BTreeMap<u32, Manifest> = BTreeMap::new();
    for &rank in &ranks {
        manifests.insert(rank, Store::open_in(storage.clone(), rank, &log)?.manifest().clone());
    }
    let needed = needed_versions(&storage, &manifests, keep)?;
    let mut report = PruneReport { ranks: ranks.len(), ..PruneReport::default() };
    // 1. Manifests without the deleted versions: they are no longer committed.
    let mut doomed: Vec<(u32, u64, PathBuf)> = Vec::new();
    for (&rank, m) in &manifests {
        let (kept, gone): (Vec<_>, Vec<_>) =
            m.versions.iter().cloned().partition(|e| needed.contains(&(rank, e.version)));
        report.kept.extend(kept.iter().map(|e| (rank, e.version)));
        if gone.is_empty() {
            continue;
        }
        let dir = rank_rel(rank);
        for e in &gone {
            report.deleted.push((rank, e.version));
            report.bytes_removed += e.file_len;
            doomed.push((rank, e.version, dir.join(diff_file_name(e.version))));
        }
        if !dry_run {
            let next = Manifest { versions: kept, ..m.clone() };
            storage::write_bytes(storage.as_ref(), &dir.join("MANIFEST"), &next.encode())?;
            storage.barrier(&dir)?;
        }
    }
    // 2. Their files.
    if !dry_run {
        let mut dirs = BTreeSet::new();
        for (rank, _, rel) in &doomed {
            match storage.remove(rel) {
                Ok(()) => {}
                Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            dirs.insert(*rank);
        }
        for rank in dirs {
            storage.barrier(&rank_rel(rank))?;
        }
    }
    // 3. Commit records whose version is gone from every rank it lists.
    let deleted: BTreeSet<(u32, u64)> = report.deleted.iter().copied().collect();
    for r in log.records() {
        if r.entries.iter().all(|e| deleted.contains(&(e.rank, r.version))) {
            report.records_removed.push(r.version);
            if !dry_run {
                for rel in log.files_of(r.version) {
                    storage.remove(rel)?;
                }
            }
        }
    }
    if !dry_run && !report.records_removed.is_empty() {
        storage.barrier(Path::new(COMMITS_DIR))?;
    }
    drop(locks);
    Ok(report)
}

/// The `(rank, version)` pairs the last `keep` versions of each rank need,
/// closed under "needs" (chains, files read, owners referenced).
fn needed_versions(
    storage: &Arc<dyn Storage>,
    manifests: &BTreeMap<u32, Manifest>,
    keep: u64,
) -> Result<BTreeSet<(u32, u64)>> {
    let mut needed: BTreeSet<(u32, u64)> = BTreeSet::new();
    // The newest `keep` version numbers of the whole store, kept on every
    // rank that lists them (a collective version stays whole), and each
    // rank's own newest `keep`.
    let keep = usize::try_from(keep).unwrap_or(usize::MAX);
    let all: BTreeSet<u64> = manifests.values().flat_map(|m| m.versions.iter().map(|e| e.version)).collect();
    let newest: BTreeSet<u64> = all.iter().rev().take(keep).copied().collect();
    let mut work: Vec<(u32, u64)> = Vec::new();
    for (&rank, m) in manifests {
        let own = m.versions.len().saturating_sub(keep);
        work.extend(m.versions[own..].iter().map(|e| (rank, e.version)));
        work.extend(m.versions.iter().filter(|e| newest.contains(&e.version)).map(|e| (rank, e.version)));
    }
    let mut catalog = Catalog::on(storage.clone());
    while let Some((rank, version)) = work.pop() {
        if !needed.insert((rank, version)) {
            continue;
        }
        let chain = manifests.get(&rank).and_then(|m| m.chain(version)).ok_or_else(|| Error::MissingVersion {
            dir: storage.locate(Path::new("")),
            rank,
            version,
        })?;
        work.extend(chain.iter().map(|e| (rank, e.version)));
        let res = resolve_all(&mut catalog, rank, version)?;
        work.extend(res.sources.iter().map(|s| (s.rank, s.version)));
        work.extend(res.references.iter().map(|r| (r.owner, r.version)));
    }
    Ok(needed)
}
