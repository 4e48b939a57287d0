//! What a job of N ranks left for a job of any other size: each rank's table
//! of the regions it protected under a checkpoint name (written with the
//! name's first checkpoint, on every tier), and reads of any old rank's
//! region, or a byte range of it, at any committed version. No MPI needed:
//! a restart on M ≠ N ranks, or a serial post-processing tool, reads what
//! it needs from the tier directory.
//!
//! ```text
//! <tier>/<name>/regions/rank-00003.json   dckpt-regions 1 <BLAKE3 of the body>
//!                                         {"rank":3,"regions":[{"id":0,"len":4096,"offset":0,"device":false},…]}
//! ```
//!
//! A table is checked before it is used: its checksum (tables written
//! before the checksum are read as plain JSON), its rank against its file
//! name, and its regions, which must follow each other without gaps in id
//! order; where the rank's store is at hand, their total must be its
//! buffer's length. A damaged table is an error, never a wrong read.

use crate::error::{Error, Result};
use crate::store::commits::CommitLog;
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

/// The region tables' tag and format ([`crate::format::checked_json`]).
const TAG: &str = "dckpt-regions";
const FORMAT: u32 = 1;
const FORMAT_TEXT: &str = "1";

fn table_path(root: &Path, rank: u32) -> PathBuf {
    root.join("regions").join(format!("rank-{rank:05}.json"))
}

impl RegionTable {
    /// Writes this table under the tier root `root` (durably; once per
    /// name and rank: an identical table already there is left as it is).
    pub fn write(&self, root: &Path) -> Result<()> {
        let path = table_path(root, self.rank);
        let bytes = crate::format::checked_json::encode(TAG, FORMAT, self, false);
        if crate::storage::fsio::read_regular(&path).is_ok_and(|old| old == bytes) {
            return Ok(());
        }
        let dir = root.join("regions");
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        crate::storage::fsio::write_atomic(&path, &bytes)?;
        crate::storage::fsio::sync_dir(&dir)
    }

    /// The bytes of the rank's buffer its regions cover.
    pub fn total(&self) -> u64 {
        self.regions.iter().map(|e| e.len).sum()
    }

    /// Refuses a table whose regions do not follow each other in id order
    /// from offset 0, or whose rank is not `rank` (the file's).
    fn check(&self, rank: u32, path: &Path) -> Result<()> {
        if self.rank != rank {
            return Err(Error::corrupt(path, format!("region table of rank {} in rank {rank}'s file", self.rank)));
        }
        let mut at = 0u64;
        for (i, e) in self.regions.iter().enumerate() {
            if i > 0 && self.regions[i - 1].id >= e.id {
                return Err(Error::corrupt(
                    path,
                    format!("region {} listed after region {}", e.id, self.regions[i - 1].id),
                ));
            }
            if e.offset != at {
                return Err(Error::corrupt(path, format!("region {} starts at {}, not at {at}", e.id, e.offset)));
            }
            at = at.checked_add(e.len).ok_or_else(|| Error::corrupt(path, "region lengths overflow"))?;
        }
        Ok(())
    }

    /// Reads and checks the table in `path`, the file of `rank`.
    fn read(path: &Path, rank: u32) -> Result<Self> {
        let bytes = crate::storage::fsio::read_regular(path)?;
        let table: RegionTable = if bytes.starts_with(TAG.as_bytes()) {
            crate::format::checked_json::decode(&bytes, path, TAG, &[FORMAT_TEXT], "region table")?
        } else {
            // Written before tables carried a checksum: still read, still checked.
            serde_json::from_slice(&bytes).map_err(|e| Error::corrupt(path, format!("region table: {e}")))?
        };
        table.check(rank, path)?;
        Ok(table)
    }

    /// The region `id`, if the rank protected it.
    pub fn get(&self, id: u32) -> Option<&TableEntry> {
        self.regions.iter().find(|e| e.id == id)
    }
}

/// Every rank's table under the tier root `root` (rank order), each
/// checked; an error if there is none.
pub fn tables(root: &Path) -> Result<Vec<RegionTable>> {
    let dir = root.join("regions");
    let entries = std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))?;
    let mut out = Vec::new();
    for e in entries {
        let e = e.map_err(|e| Error::io(&dir, e))?;
        let name = e.file_name();
        let Some(rank) = name.to_str().and_then(parse_table_name) else { continue };
        out.push(RegionTable::read(&e.path(), rank)?);
    }
    out.sort_by_key(|t| t.rank);
    Ok(out)
}

/// As [`tables`], but no table directory at all is none (a name not
/// checkpointed yet).
pub fn tables_if_any(root: &Path) -> Result<Vec<RegionTable>> {
    match tables(root) {
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        other => other,
    }
}

/// Every rank's table of a name kept on several tiers (`roots`, fastest
/// first), rank order: each rank's from the first tier whose copy reads
/// and checks. A copy that is damaged, or missing where another tier has
/// one, is written again from the good one (the tables of a name are the
/// same on every tier), so one damaged copy never stops a restart. A rank
/// whose every copy is damaged is an error when it is `need` (or `need` is
/// `None`: every rank's is needed); another rank's is left out, its copies
/// set aside (`*.damaged`: the next sharing of the tables brings a good one
/// from the rank's own node).
pub fn tables_of_tiers(roots: &[PathBuf], need: Option<u32>) -> Result<Vec<RegionTable>> {
    let mut found: std::collections::BTreeMap<u32, RegionTable> = std::collections::BTreeMap::new();
    // Per tier, each rank's copy: read and checked, or why not.
    let mut copies: Vec<std::collections::BTreeMap<u32, Result<RegionTable>>> = Vec::new();
    for root in roots {
        let dir = root.join("regions");
        let mut here = std::collections::BTreeMap::new();
        match std::fs::read_dir(&dir) {
            Ok(entries) => {
                for e in entries {
                    let e = e.map_err(|e| Error::io(&dir, e))?;
                    let name = e.file_name();
                    let Some(rank) = name.to_str().and_then(parse_table_name) else { continue };
                    here.insert(rank, RegionTable::read(&e.path(), rank));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&dir, e)),
        }
        copies.push(here);
    }
    let ranks: std::collections::BTreeSet<u32> = copies.iter().flat_map(|c| c.keys().copied()).collect();
    for rank in ranks {
        let good = copies.iter().find_map(|c| c.get(&rank).and_then(|t| t.as_ref().ok())).cloned();
        let Some(good) = good else {
            // Every copy damaged: the first one's error.
            let first = copies.iter_mut().find_map(|c| c.remove(&rank)).and_then(Result::err);
            let e = first.unwrap_or_else(|| Error::Internal(format!("region table of rank {rank}")));
            if need.is_none_or(|n| n == rank) {
                return Err(e);
            }
            set_aside_table(roots, rank, &e);
            continue;
        };
        for (root, c) in roots.iter().zip(&copies) {
            if !matches!(c.get(&rank), Some(Ok(_))) {
                match good.write(root) {
                    Ok(()) => tracing::warn!(
                        "{}: region table of rank {rank} {} here; written again from another tier's copy",
                        root.display(),
                        if c.contains_key(&rank) { "damaged" } else { "missing" }
                    ),
                    Err(e) => tracing::warn!("{}: region table of rank {rank} not written again: {e}", root.display()),
                }
            }
        }
        found.insert(rank, good);
    }
    Ok(found.into_values().collect())
}

/// Sets `rank`'s table copies under `roots` aside (`*.json.damaged`),
/// saying why (`e`): a damaged table is never read again, and the next
/// sharing of the tables, or the rank's next checkpoint, writes a good one.
pub fn set_aside_table(roots: &[PathBuf], rank: u32, e: &Error) {
    for root in roots {
        let path = table_path(root, rank);
        if path.exists() {
            let aside = path.with_extension("json.damaged");
            match std::fs::rename(&path, &aside) {
                Ok(()) => tracing::warn!("{e}; set aside as {}", aside.display()),
                Err(err) => tracing::warn!("{e}; not set aside: {err}"),
            }
        }
    }
}

/// [`tables_of_tiers`], every rank's: an error when a rank the commit
/// records name ([`written_rank_count`]) has no table on any tier (what a
/// restart on another rank count reads).
pub fn all_tables_of_tiers(roots: &[PathBuf]) -> Result<Vec<RegionTable>> {
    let found = tables_of_tiers(roots, None)?;
    let written = written_rank_count(roots)?;
    if let Some(missing) = (0..written).find(|&r| found.get(r as usize).is_none_or(|t| t.rank != r)) {
        return Err(Error::MissingRegion {
            rank: missing,
            what: format!(
                "no region table on any tier ({}), though the commit records name {written} ranks: \
                 the checkpoint cannot be read on another rank count; `dckpt verify --dir DIR` lists what is left",
                roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ")
            ),
        });
    }
    Ok(found)
}

/// The ranks of the job that wrote the name under `roots`: the most any
/// commit record or part names (the records are written with every
/// version), and at least one more than the highest rank with a region
/// table. 0 for a name never checkpointed.
pub fn written_rank_count(roots: &[PathBuf]) -> Result<u32> {
    let mut written = 0u32;
    for root in roots {
        let log = CommitLog::load(root)?;
        written = written.max(log.records().map(|r| r.ranks).max().unwrap_or(0));
        written = written.max(log.stray_ranks().max().map_or(0, |r| r + 1));
        let dir = root.join("regions");
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                if let Some(rank) = e.file_name().to_str().and_then(parse_table_name) {
                    written = written.max(rank + 1);
                }
            }
        }
    }
    Ok(written)
}

/// The rank of a table file name `rank-NNNNN.json`.
fn parse_table_name(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("rank-")?.strip_suffix(".json")?;
    (digits.len() == 5 && digits.bytes().all(|b| b.is_ascii_digit())).then(|| digits.parse().ok()).flatten()
}

/// The problems of the region tables under the tier root `root`: each
/// table checked, and its regions' total against its rank's buffer.
pub fn check_tables(root: &Path) -> Vec<(PathBuf, String)> {
    let dir = root.join("regions");
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let mut problems = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rank) = name.to_str().and_then(parse_table_name) else { continue };
        let path = e.path();
        match RegionTable::read(&path, rank).and_then(|t| check_total(root, &t, &path)) {
            Ok(()) => {}
            Err(e) => problems.push((path, e.to_string())),
        }
    }
    problems
}

/// Refuses a table whose regions do not cover its rank's buffer exactly.
fn check_total(root: &Path, table: &RegionTable, path: &Path) -> Result<()> {
    let len = match crate::store::Store::open(root, table.rank) {
        Ok(store) => store.layout()?.data_len(),
        Err(Error::NoStore { .. }) => return Ok(()), // no checkpoint of the rank yet
        Err(e) => return Err(e),
    };
    if table.total() != len {
        return Err(Error::corrupt(
            path,
            format!("regions of {} bytes in all, but rank {}'s checkpoints hold {len}", table.total(), table.rank),
        ));
    }
    Ok(())
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
        .ok_or_else(|| Error::MissingRegion { rank, what: format!("no region table in {}", path.display()) })?;
    let entry = table
        .get(id)
        .ok_or_else(|| Error::MissingRegion { rank, what: format!("no region {id} in {}", path.display()) })?;
    if range.start > range.end {
        return Err(Error::InvalidOption(format!("bytes {range:?}: the range ends before it starts")));
    }
    if range.end > entry.len {
        return Err(Error::size_mismatch(
            format!("bytes {range:?} of region {id} of rank {rank} (the region's length)"),
            entry.len,
            range.end,
        ));
    }
    let (from, to) = (entry.offset + range.start, entry.offset + range.end);
    check_total(root, &table, &path)?;
    // Only the chunks holding the range are read.
    crate::restore::restore_range(root, rank, version, from..to)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(rank: u32) -> RegionTable {
        RegionTable {
            rank,
            regions: vec![
                TableEntry { id: 0, len: 100, offset: 0, device: false },
                TableEntry { id: 3, len: 28, offset: 100, device: true },
            ],
        }
    }

    #[test]
    fn a_table_is_checked_before_it_is_used() {
        let dir = tempfile::tempdir().expect("tempdir");
        table(2).write(dir.path()).expect("write");
        assert_eq!(tables(dir.path()).expect("read"), vec![table(2)]);
        let path = table_path(dir.path(), 2);
        let good = std::fs::read(&path).expect("read");
        // Any changed byte of the body (an offset, a length, an id) fails the checksum.
        let at = good.iter().position(|&b| b == b'{').expect("body");
        for i in at..good.len() - 1 {
            let mut bad = good.clone();
            bad[i] ^= 1;
            std::fs::write(&path, &bad).expect("write");
            assert!(matches!(tables(dir.path()), Err(Error::Corrupt { .. })), "byte {i} changed unnoticed");
        }
        // A table written before the checksum is still read, and still checked.
        let legacy = |t: &RegionTable| serde_json::to_vec(t).expect("json");
        std::fs::write(&path, legacy(&table(2))).expect("write");
        assert_eq!(tables(dir.path()).expect("legacy"), vec![table(2)]);
        let mut gap = table(2);
        gap.regions[1].offset = 101;
        std::fs::write(&path, legacy(&gap)).expect("write");
        let e = tables(dir.path()).expect_err("a gap between regions");
        assert!(e.to_string().contains("starts at 101"), "{e}");
        std::fs::write(&path, legacy(&table(5))).expect("write");
        assert!(tables(dir.path()).is_err(), "rank 5's table in rank 2's file");
    }

    #[test]
    fn a_table_damaged_or_lost_on_one_tier_is_written_again_from_another() {
        let (a, b) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
        let roots = vec![a.path().to_path_buf(), b.path().to_path_buf()];
        for root in &roots {
            table(0).write(root).expect("write");
        }
        table(1).write(b.path()).expect("write");
        let flip = |path: &Path| {
            let mut bytes = std::fs::read(path).expect("read");
            let last = bytes.len() - 3;
            bytes[last] ^= 1;
            std::fs::write(path, bytes).expect("write");
        };
        flip(&table_path(a.path(), 0));
        assert_eq!(tables_of_tiers(&roots, None).expect("from the good copies"), vec![table(0), table(1)]);
        // Both written again where they were damaged or missing.
        assert_eq!(tables(a.path()).expect("healed"), vec![table(0), table(1)]);
        // Damaged on every tier: an error, never "none".
        flip(&table_path(a.path(), 1));
        flip(&table_path(b.path(), 1));
        assert!(matches!(tables_of_tiers(&roots, Some(1)), Err(Error::Corrupt { .. })));
        // Not the one needed: left out, set aside.
        assert_eq!(tables_of_tiers(&roots, Some(0)).expect("rank 0's"), vec![table(0)]);
        assert!(table_path(b.path(), 1).with_extension("json.damaged").exists());
        // A rank with no table anywhere, below the ranks counted: missing.
        table(2).write(b.path()).expect("write");
        assert_eq!(written_rank_count(&roots).expect("count"), 3);
        let e = all_tables_of_tiers(&roots).expect_err("rank 1's table is gone");
        assert!(matches!(e, Error::MissingRegion { rank: 1, .. }), "{e}");
    }

    #[test]
    fn regions_must_cover_the_rank_s_buffer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let opts = crate::store::StoreOptions { chunk_size: 32, ..Default::default() };
        let mut e = crate::engine::Engine::open_or_create(dir.path(), 2, 128, &opts).expect("open");
        e.checkpoint(1, &vec![7u8; 128]).expect("checkpoint");
        drop(e);
        table(2).write(dir.path()).expect("write");
        assert!(check_tables(dir.path()).is_empty());
        assert_eq!(read_region(dir.path(), 2, 3, 1, 0..28).expect("read"), vec![7u8; 28]);
        let mut short = table(2);
        short.regions[1].len = 20;
        std::fs::remove_file(table_path(dir.path(), 2)).expect("remove");
        short.write(dir.path()).expect("write");
        let problems = check_tables(dir.path());
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(read_region(dir.path(), 2, 3, 1, 0..20).is_err(), "a table short of the buffer is not used");
    }
}
