//! Per-version statistics of a store, for `dckpt inspect`.

use crate::restore::Catalog;
use crate::store::list_ranks;
use crate::{Error, Result};
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
    /// SHIFT chunks whose bytes live on another rank.
    pub cross_rank_chunks: u64,
    /// logical / stored.
    pub ratio: f64,
}

/// Statistics of every version of every rank under `root` (metadata only:
/// no data block is read).
pub fn inspect_store(root: &Path) -> Result<Vec<VersionStats>> {
    let ranks = list_ranks(root)?;
    if ranks.is_empty() {
        return Err(Error::NoStore { dir: root.to_path_buf(), rank: 0 });
    }
    let mut catalog = Catalog::new(root);
    let mut out = Vec::new();
    for rank in ranks {
        let versions: Vec<u64> = catalog.store(rank)?.manifest().versions.iter().map(|v| v.version).collect();
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
                shift_regions: d.shift.len(),
                cross_rank_chunks: d.shift.iter().filter(|s| s.src_rank != rank).map(|s| s.count).sum(),
                ratio: logical as f64 / r.file_len() as f64,
            });
        }
    }
    Ok(out)
}
