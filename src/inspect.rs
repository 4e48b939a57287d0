//! Per-version statistics of a store, for `dckpt inspect`.

use crate::error::{Error, Result};
use crate::restore::Catalog;
use crate::store::list_ranks;
use serde::Serialize;
use std::path::Path;

/// Statistics of one version of one rank.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VersionStats {
    /// Rank.
    pub rank: u32,
    /// Version.
    pub version: u64,
    /// Whether it is a baseline.
    pub baseline: bool,
    /// Whether it was stored whole because most chunks changed.
    pub dense: bool,
    /// Method.
    pub method: String,
    /// Bytes of the protected buffer.
    pub logical_bytes: u64,
    /// Bytes of the diff file.
    pub stored_bytes: u64,
    /// Bytes of the file that are not FIRST data.
    pub metadata_bytes: u64,
    /// Chunks stored in this version.
    pub first_chunks: u64,
    /// Chunks referencing bytes stored elsewhere.
    pub shift_chunks: u64,
    /// Chunks unchanged since the previous version.
    pub fixed_chunks: u64,
    /// FIRST table entries.
    pub first_regions: usize,
    /// SHIFT table entries.
    pub shift_regions: usize,
    /// Bytes of FIRST data (stored_bytes minus metadata).
    pub data_bytes: u64,
    /// SHIFT chunks whose bytes live on another rank.
    pub cross_rank_chunks: u64,
    /// Collective cross-rank references (regions another rank stores for this one).
    pub cross_rank_references: usize,
    /// logical / stored.
    pub ratio: f64,
}

/// Totals of one rank over its versions.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RankStats {
    /// Rank.
    pub rank: u32,
    /// Complete versions.
    pub versions: usize,
    /// Bytes of all its diff files.
    pub stored_bytes: u64,
    /// FIRST data bytes among them.
    pub data_bytes: u64,
    /// Collective cross-rank references in its files.
    pub cross_rank_references: usize,
    /// Every byte of every file in the rank's directory (manifest, lock,
    /// leftovers included): what the rank costs on disk.
    pub bytes_on_disk: u64,
    /// SHIFT chunks pointing at other ranks' bytes.
    pub cross_rank_chunks: u64,
}

/// What `dckpt inspect --json` prints: every version, per-rank totals, and
/// the balance of stored bytes over ranks.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StoreStats {
    /// Per version of each rank.
    pub versions: Vec<VersionStats>,
    /// Per rank.
    pub ranks: Vec<RankStats>,
    /// Sum of the ranks' stored bytes.
    pub total_stored_bytes: u64,
    /// Sum of cross-rank references.
    pub total_cross_rank_references: usize,
    /// Largest rank's stored bytes over the mean (1.0 = perfectly even).
    pub max_over_mean: f64,
    /// Every byte of every file under the root (diff files, manifests,
    /// locks, commit records, leftovers): what the store costs on disk.
    pub bytes_on_disk: u64,
    /// Bytes on disk that are not committed diff files (the overhead over `total_stored_bytes`).
    pub overhead_bytes: u64,
    /// The copies this node-local directory holds for other nodes' ranks
    /// (issue #31): the redundancy level its versions have here.
    pub copies: Copies,
}

/// The node-local tier's copies for other nodes under a root.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Copies {
    /// Partner copies: (rank copied, versions held).
    pub partner: Vec<(u32, Vec<u64>)>,
    /// Parity segments: (holding rank, versions held).
    pub parity: Vec<(u32, Vec<u64>)>,
    /// Their bytes.
    pub bytes: u64,
}

impl Copies {
    /// The copies under `root` (`redundancy/partner/rank-R/vV.bundle`,
    /// `redundancy/xor/rank-R/vV.parity`), by name only.
    pub fn under(root: &Path) -> Copies {
        let mut out = Copies::default();
        for (kind, ext) in [("partner", ".bundle"), ("xor", ".parity")] {
            let dir = root.join(crate::redundancy::REDUNDANCY_DIR).join(kind);
            let Ok(ranks) = std::fs::read_dir(&dir) else { continue };
            let mut found: Vec<(u32, Vec<u64>)> = ranks
                .flatten()
                .filter_map(|e| {
                    let rank: u32 = e.file_name().to_str()?.strip_prefix("rank-")?.parse().ok()?;
                    let mut versions: Vec<u64> = std::fs::read_dir(e.path())
                        .ok()?
                        .flatten()
                        .filter_map(|f| f.file_name().to_str()?.strip_prefix('v')?.strip_suffix(ext)?.parse().ok())
                        .collect();
                    versions.sort_unstable();
                    Some((rank, versions))
                })
                .collect();
            found.sort();
            out.bytes += bytes_on_disk(&dir);
            if kind == "partner" { out.partner = found } else { out.parity = found }
        }
        out
    }
}

/// Sum of the sizes of every regular file below `dir` (links not followed).
pub fn bytes_on_disk(dir: &Path) -> u64 {
    bytes_below(&crate::storage::Posix::at(dir), Path::new(""))
}

/// Sum of the sizes of every regular file below directory `rel` of
/// `storage` (links not followed; what cannot be listed counts 0).
pub fn bytes_below(storage: &dyn crate::storage::Storage, rel: &Path) -> u64 {
    let Ok(entries) = storage.list(rel) else { return 0 };
    entries
        .iter()
        .map(|e| match e {
            e if e.is_symlink => 0,
            e if e.is_dir => bytes_below(storage, &rel.join(&e.name)),
            e => e.len,
        })
        .sum()
}

/// Versions, per-rank totals and balance of the store under `root`.
pub fn store_stats(root: &Path) -> Result<StoreStats> {
    let versions = inspect_store(root)?;
    let mut ranks: Vec<RankStats> = Vec::new();
    for v in &versions {
        if ranks.last().is_none_or(|r| r.rank != v.rank) {
            ranks.push(RankStats { rank: v.rank, ..RankStats::default() });
        }
        if let Some(r) = ranks.last_mut() {
            r.versions += 1;
            r.stored_bytes += v.stored_bytes;
            r.data_bytes += v.data_bytes;
            r.cross_rank_references += v.cross_rank_references;
            r.cross_rank_chunks += v.cross_rank_chunks;
        }
    }
    for r in &mut ranks {
        r.bytes_on_disk = bytes_on_disk(&crate::store::rank_dir(root, r.rank));
    }
    let total: u64 = ranks.iter().map(|r| r.stored_bytes).sum();
    let on_disk = bytes_on_disk(root);
    let max = ranks.iter().map(|r| r.stored_bytes).max().unwrap_or(0);
    let mean = total as f64 / ranks.len().max(1) as f64;
    Ok(StoreStats {
        total_cross_rank_references: ranks.iter().map(|r| r.cross_rank_references).sum(),
        total_stored_bytes: total,
        max_over_mean: if mean > 0.0 { max as f64 / mean } else { 1.0 },
        bytes_on_disk: on_disk,
        overhead_bytes: on_disk.saturating_sub(total),
        copies: Copies::under(root),
        versions,
        ranks,
    })
}

/// Statistics of every version of every rank under `root` (metadata only:
/// no data block is read), sorted by rank then version.
pub fn inspect_store(root: &Path) -> Result<Vec<VersionStats>> {
    let ranks = list_ranks(root)?;
    if ranks.is_empty() {
        return Err(Error::NoStore { dir: root.to_path_buf(), rank: 0 });
    }
    let mut catalog = Catalog::new(root);
    let mut out = Vec::new();
    for rank in ranks {
        let versions: Vec<u64> = match catalog.store(rank) {
            Ok(s) => s.manifest().versions.iter().map(|v| v.version).collect(),
            // A directory a killed first checkpoint left: no versions.
            Err(Error::NoStore { .. })
                if crate::store::diff_files_present(&crate::store::rank_dir(root, rank))
                    .is_ok_and(|v| v.is_empty()) =>
            {
                continue;
            }
            Err(e) => return Err(e),
        };
        for v in versions {
            let r = catalog.reader(rank, v)?;
            let d = &r.diff;
            let counts = d.counts();
            let logical = d.layout.data_len();
            out.push(VersionStats {
                rank,
                version: v,
                baseline: d.baseline,
                dense: d.dense,
                method: d.method.to_string(),
                logical_bytes: logical,
                stored_bytes: r.file_len(),
                metadata_bytes: r.metadata_bytes(),
                first_chunks: counts.first,
                shift_chunks: counts.shift,
                fixed_chunks: counts.fixed,
                first_regions: d.first.len(),
                shift_regions: r.header.shift_count as usize,
                data_bytes: r.file_len() - r.metadata_bytes(),
                cross_rank_chunks: d.shift.iter().filter(|s| s.src_rank != rank).map(|s| s.count).sum(),
                cross_rank_references: d.shift.iter().filter(|s| s.reference.is_some()).count(),
                ratio: logical as f64 / r.file_len() as f64,
            });
        }
    }
    Ok(out)
}
