//! Whole-store verification: every file's checksums, every table, every
//! reference of every chain, for every rank under a root.

use crate::diff::ShiftRun;
use crate::error::{Error, Result};
use crate::hash::subtree_digest;
use crate::restore::{Catalog, check_sources, owner_reader, resolve};
use crate::store::list_ranks;
use std::path::{Path, PathBuf};

/// One problem found, naming the file concerned.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    /// The damaged or inconsistent file.
    pub path: PathBuf,
    /// What is wrong (the path not repeated).
    pub message: String,
    /// The error code of what is wrong ([`Error::code`]; a damaged file
    /// that no read reported is `Corrupt`'s).
    pub code: i32,
}

impl Problem {
    /// A damaged or inconsistent file that no [`Error`] reported.
    pub fn corrupt(path: PathBuf, message: String) -> Problem {
        Problem { path, message, code: crate::error::ErrorKind::Corrupt as i32 }
    }
}

/// The outcome of [`verify_store`].
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct VerifyReport {
    /// Ranks found.
    pub ranks: usize,
    /// Versions checked.
    pub versions: usize,
    /// Problems found (empty when the store is sound).
    pub problems: Vec<Problem>,
}

fn problem(e: Error, fallback: &Path) -> Problem {
    let path = match &e {
        Error::Io { path, .. } | Error::Corrupt { path, .. } | Error::BrokenReference { path, .. } => path.clone(),
        _ => fallback.to_path_buf(),
    };
    let text = e.to_string();
    let prefix = format!("{}: ", path.display());
    let message = text.strip_prefix(&prefix).map_or_else(|| text.clone(), str::to_string);
    Problem { path, message, code: e.code() }
}

/// Rehashes the owner's copy of every cross-rank reference of `(rank,
/// version)` and compares it with the digest the reference carries.
fn check_references(catalog: &mut Catalog, rank: u32, version: u64) -> Result<()> {
    let reader = catalog.reader(rank, version)?;
    let (path, hash, chunk_size) = (reader.path().to_path_buf(), reader.diff.hash, reader.diff.layout.chunk_size());
    let refs: Vec<ShiftRun> = reader.diff.shift.iter().filter(|s| s.reference.is_some()).copied().collect();
    for s in refs {
        let owner = owner_reader(catalog, rank, s.src_rank, s.src_version)?;
        let bytes = owner.read_chunks(s.src_start..s.src_start + s.count)?;
        if Some(subtree_digest(hash, chunk_size, &bytes)) != s.reference {
            return Err(Error::BrokenReference {
                path,
                reason: format!(
                    "chunks {}..+{} reference bytes of rank {} that do not match the region's digest",
                    s.start, s.count, s.src_rank
                ),
            });
        }
    }
    Ok(())
}

/// What is wrong with one version: its file, else its chain and its
/// cross-rank references.
fn check_version(catalog: &mut Catalog, rank: u32, v: u64) -> Vec<Error> {
    if let Err(e) = catalog.reader(rank, v).and_then(|r| r.verify_data()) {
        return vec![e];
    }
    let chain = resolve(catalog, rank, v).and_then(|(layout, sources)| check_sources(catalog, rank, &layout, &sources));
    [chain.err(), check_references(catalog, rank, v).err()].into_iter().flatten().collect()
}

/// How far [`verify_store_with`] has come: the bytes of diff files checked
/// of all the diff files' bytes its manifests list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerifyProgress {
    /// Bytes of the diff files checked so far.
    pub done_bytes: u64,
    /// Bytes of every diff file to check.
    pub total_bytes: u64,
}

/// Checks every rank's store under `root`. Fails only if `root` cannot be
/// listed or holds no store; everything else is reported as a [`Problem`].
pub fn verify_store(root: &Path) -> Result<VerifyReport> {
    verify_store_with(root, &mut |_| {})
}

/// [`verify_store`], telling `progress` after each diff file how far it has
/// come (a command's progress bar).
pub fn verify_store_with(root: &Path, progress: &mut dyn FnMut(VerifyProgress)) -> Result<VerifyReport> {
    let ranks = list_ranks(root)?;
    if ranks.is_empty() {
        return Err(Error::NoStore { dir: root.to_path_buf(), rank: 0 });
    }
    let mut report = VerifyReport { ranks: ranks.len(), ..VerifyReport::default() };
    let log = crate::store::commits::CommitLog::load(root)?;
    for (path, why) in log.damaged() {
        report.problems.push(Problem::corrupt(path.clone(), format!("damaged commit record: {why}")));
    }
    for r in log.records() {
        for e in &r.entries {
            if !ranks.contains(&e.rank) {
                report.problems.push(Problem::corrupt(
                    crate::store::rank_dir(root, e.rank),
                    format!("rank {} of committed version {} has no directory", e.rank, r.version),
                ));
            }
        }
    }
    let mut catalog = Catalog::new(root);
    // First every rank's versions (so the total is known), then their checks.
    let mut plan = Vec::new();
    for rank in ranks {
        let store = match catalog.store(rank) {
            Ok(s) => s,
            // A rank directory with neither a manifest nor a diff file holds
            // no checkpoint (a first checkpoint killed early): nothing to check.
            Err(Error::NoStore { .. })
                if crate::store::diff_files_present(&crate::store::rank_dir(root, rank))
                    .is_ok_and(|v| v.is_empty()) =>
            {
                report.ranks -= 1;
                continue;
            }
            Err(e) => {
                report.problems.push(problem(e, &crate::store::rank_dir(root, rank).join("MANIFEST")));
                continue;
            }
        };
        let versions: Vec<(u64, PathBuf, u64)> =
            store.manifest().versions.iter().map(|v| (v.version, store.diff_path(v.version), v.file_len)).collect();
        plan.push((rank, versions));
    }
    let mut at =
        VerifyProgress { done_bytes: 0, total_bytes: plan.iter().flat_map(|(_, vs)| vs.iter().map(|v| v.2)).sum() };
    progress(at);
    for (rank, versions) in plan {
        for (v, diff_path, file_len) in versions {
            report.versions += 1;
            for e in check_version(&mut catalog, rank, v) {
                report.problems.push(problem(e, &diff_path));
            }
            at.done_bytes += file_len;
            progress(at);
        }
    }
    report.problems.extend(check_copies(root));
    report.problems.dedup();
    Ok(report)
}

/// The node-local tier's copies for other nodes (partner bundles and
/// parity segments, issue #31): each must read back whole (its checksum,
/// its names, its group's lengths).
fn check_copies(root: &Path) -> Vec<Problem> {
    use crate::redundancy::{REDUNDANCY_DIR, bundle, parity};
    let mut problems = Vec::new();
    for (kind, ext) in [("partner", "bundle"), ("xor", "parity")] {
        let dir = root.join(REDUNDANCY_DIR).join(kind);
        let Ok(holders) = std::fs::read_dir(&dir) else { continue };
        let mut files: Vec<PathBuf> = holders
            .flatten()
            .filter_map(|h| std::fs::read_dir(h.path()).ok())
            .flat_map(|d| d.flatten().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == ext))
            .collect();
        files.sort();
        for path in files {
            let checked = std::fs::read(&path).map_err(|e| Error::io(&path, e)).and_then(|b| match kind {
                "partner" => bundle::check(&b, &path).map(drop),
                _ => parity::decode(&b, &path).map(drop),
            });
            if let Err(e) = checked {
                let what = if kind == "partner" { "partner copy" } else { "parity segment" };
                problems.push(Problem::corrupt(path.clone(), format!("damaged {what}: {e}")));
            }
        }
    }
    problems
}
