//! What a job of N ranks left for a job of any other size: each rank's table
//! of the regions it protected under a checkpoint name (written with the
//! name's first checkpoint, on every tier), and reads of any old rank's
//! region, or a byte range of it, at any committed version. No MPI needed:
//! a restart on M ≠ N ranks, or a serial post-processing tool, reads what
//! it needs from the tier directory.
//!
//! ```text
//! <tier>/<name>/regions/rank-00003.json   {"rank":3,"regions":[{"id":0,"len":4096,"offset":0,"device":false},…]}
//! ```

use crate::store::commits::CommitLog;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// One region in a rank's gathered buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableEntry {
    /// The id the application protected it under.
    pub id: u32,
    /// Its length in bytes.
    pub len: u64,
    /// Where it starts in the rank's checkpointed buffer.
    pub offset: u64,
    /// Whether it was device memory.
    pub device: bool,
}

/// The regions one rank protected under a name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegionTable {
    /// The rank.
    pub rank: u32,
    /// Its regions, in id order.
    pub regions: Vec<TableEntry>,
}

fn table_path(root: &Path, rank: u32) -> PathBuf {
    root.join("regions").join(format!("rank-{rank:05}.json"))
}

impl RegionTable {
    /// Writes this table under the tier root `root` (durably; once per
    /// name and rank: an identical table already there is left as it is).
    pub fn write(&self, root: &Path) -> Result<()> {
        let path = table_path(root, self.rank);
        let bytes = serde_json::to_vec(self).map_err(|e| Error::Internal(e.to_string()))?;
        if std::fs::read(&path).is_ok_and(|old| old == bytes) {
            return Ok(());
        }
        let dir = root.join("regions");
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        crate::storage::fsio::write_atomic(&path, &bytes)?;
        crate::storage::fsio::sync_dir(&dir)
    }

    /// The region `id`, if the rank protected it.
    pub fn get(&self, id: u32) -> Option<&TableEntry> {
        self.regions.iter().find(|e| e.id == id)
    }
}

/// Every rank's table under the tier root `root` (rank order).
pub fn tables(root: &Path) -> Result<Vec<RegionTable>> {
    let dir = root.join("regions");
    let entries = std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))?;
    let mut out = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_some_and(|x| x == "json") {
            let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
            let table: RegionTable =
                serde_json::from_slice(&bytes).map_err(|e| Error::corrupt(&path, format!("region table: {e}")))?;
            out.push(table);
        }
    }
    out.sort_by_key(|t| t.rank);
    Ok(out)
}

/// The versions committed under the tier root `root` (every rank's files
/// durable there), oldest first.
pub fn committed_versions(root: &Path) -> Result<Vec<u64>> {
    let log = CommitLog::load_from(&crate::storage::Posix::at(root))?;
    Ok(log.records().map(|r| r.version).collect())
}

/// Bytes `range` of region `id` of old rank `rank` at `version`, from the
/// tier root `root`, every byte verified; only the chunks holding the
/// range are read ([`crate::restore::restore_range`]).
pub fn read_region(root: &Path, rank: u32, id: u32, version: u64, range: Range<u64>) -> Result<Vec<u8>> {
    let path = table_path(root, rank);
    let table = tables(root)?
        .into_iter()
        .find(|t| t.rank == rank)
        .ok_or_else(|| Error::InvalidOption(format!("rank {rank} left no region table ({})", path.display())))?;
    let entry = table.get(id).ok_or_else(|| Error::InvalidOption(format!("rank {rank} protected no region {id}")))?;
    if range.start > range.end || range.end > entry.len {
        return Err(Error::InvalidOption(format!(
            "bytes {range:?} of region {id} of rank {rank}: the region holds {} bytes",
            entry.len
        )));
    }
    let (from, to) = (entry.offset + range.start, entry.offset + range.end);
    let len = crate::restore::Catalog::new(root).store(rank)?.layout()?.data_len();
    if to > len {
        return Err(Error::corrupt(&path, format!("region {id} passes the end of rank {rank}'s buffer")));
    }
    // Only the chunks holding the range are read.
    crate::restore::restore_range(root, rank, version, from..to)
}
