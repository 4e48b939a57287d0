//! Collective commit records: the one file that makes a collective version
//! visible on every rank at once.
//!
//! ```text
//! <root>/commits/v000000000007.commit     written by rank 0 once every rank's files are durable
//! ```
//!
//! A collective version is committed exactly when its commit record exists:
//! rank 0 writes it (exclusive temporary file, fsync, rename, directory
//! fsync) only after every rank reported its diff file durable, with each
//! rank's file length and trailer. Each rank's manifest is rolled forward
//! from the records afterwards (and again whenever a writer opens the
//! store), so a crash at any point leaves the version invisible everywhere
//! (no record) or visible everywhere (record), never half. Text form like the
//! manifest: a line `dckpt-commit 1 <blake3-256 hex of the rest>`, then JSON.
//!
//! The asynchronous tiers (`crate::tiers`) commit without a rendezvous:
//!
//! ```text
//! <root>/commits/v000000000007.r000003.part   written by rank 3 once its own file is durable here
//! ```
//!
//! Each rank's flush worker writes its own [`CommitPart`] (same protocol)
//! after its diff file is durable on that tier. A version is committed on a
//! tier when its parts from every rank are there **and** every rank's part
//! is a baseline or continues a version that is itself committed there
//! ([`CommitLog`] applies this rule oldest first). So a restore never follows
//! a reference, or a chain, to a file that is not durable on the tier it
//! reads; a version one rank failed to flush is simply never committed
//! there, and neither is anything built on it. Parts of a version that was
//! never committed are removed by their own rank's next writer
//! ([`CommitLog::stray_parts`]). A full record and parts may both exist for
//! one version: the record wins.

use crate::error::{Error, Result};
use crate::format::manifest::VersionEntry;
use crate::storage::{self, Posix, Storage};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The directory of commit records, relative to the store root.
pub const COMMITS_DIR: &str = "commits";

const TAG: &str = "dckpt-commit";
const PART_TAG: &str = "dckpt-commit-part";

/// One committed collective version: each rank's diff file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommitRecord {
    /// The version.
    pub version: u64,
    /// Ranks taking part.
    pub ranks: u32,
    /// Every rank's entry, by rank.
    pub entries: Vec<RankEntry>,
}

/// One rank's file of a committed version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankEntry {
    /// The rank.
    pub rank: u32,
    /// Whether its file is a baseline.
    pub baseline: bool,
    /// Length of its diff file.
    pub file_len: u64,
    /// Hex of its trailer.
    pub trailer: String,
}

/// One rank's share of a collective version on one tier, written by that
/// rank alone once its file is durable there (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommitPart {
    /// The version.
    pub version: u64,
    /// Ranks taking part.
    pub ranks: u32,
    /// The version this rank's file continues (`None` for a baseline).
    pub prev: Option<u64>,
    /// This rank's file.
    pub entry: RankEntry,
}

impl CommitPart {
    /// Text form with its checksum line.
    pub fn encode(&self) -> Vec<u8> {
        crate::format::checked_json::encode(PART_TAG, 1, self, false)
    }

    /// Parses and checks the text form.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Self> {
        let p: CommitPart = crate::format::checked_json::decode(bytes, path, PART_TAG, &["1"], "commit part")?;
        if p.entry.rank >= p.ranks || p.entry.baseline != p.prev.is_none() || p.prev.is_some_and(|v| v >= p.version) {
            return Err(Error::corrupt(path, "commit part is inconsistent (rank, baseline or previous version)"));
        }
        Ok(p)
    }

    /// Writes the part durably (file, rename, directory).
    pub fn write_to(&self, storage: &dyn Storage) -> Result<()> {
        let dir = Path::new(COMMITS_DIR);
        storage.create_dir(dir)?;
        storage::write_bytes(storage, &part_rel(self.version, self.entry.rank), &self.encode())?;
        storage.barrier(dir)
    }
}

/// The commit part of `rank` for `version`, relative to the store root.
pub fn part_rel(version: u64, rank: u32) -> PathBuf {
    Path::new(COMMITS_DIR).join(format!("v{version:012}.r{rank:06}.part"))
}

/// The version and rank of a commit part's file name `vNNNNNNNNNNNN.rNNNNNN.part`.
pub fn parse_part_name(name: &str) -> Option<(u64, u32)> {
    let (v, r) = name.strip_prefix('v')?.strip_suffix(".part")?.split_once(".r")?;
    let (v, r): (u64, u32) = (v.parse().ok()?, r.parse().ok()?);
    (name == format!("v{v:012}.r{r:06}.part")).then_some((v, r))
}

/// The directory holding the commit records of `root`.
pub fn commits_dir(root: &Path) -> PathBuf {
    root.join(COMMITS_DIR)
}

/// The commit record of `version`, relative to the store root.
pub fn record_rel(version: u64) -> PathBuf {
    Path::new(COMMITS_DIR).join(format!("v{version:012}.commit"))
}

/// Path of the commit record of `version`.
pub fn record_path(root: &Path, version: u64) -> PathBuf {
    root.join(record_rel(version))
}

impl CommitRecord {
    /// Text form with its checksum line.
    pub fn encode(&self) -> Vec<u8> {
        crate::format::checked_json::encode(TAG, 1, self, false)
    }

    /// Parses and checks the text form.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Self> {
        let corrupt = |r: &str| Error::corrupt(path, r.to_string());
        let r: CommitRecord = crate::format::checked_json::decode(bytes, path, TAG, &["1"], "commit record")?;
        let ranks_ok =
            r.entries.len() == r.ranks as usize && r.entries.iter().enumerate().all(|(i, e)| e.rank as usize == i);
        if !ranks_ok {
            return Err(corrupt("commit record does not list every rank once, in order"));
        }
        Ok(r)
    }

    /// The manifest entry of `rank`, if it took part.
    pub fn entry(&self, rank: u32) -> Option<VersionEntry> {
        self.entries.get(rank as usize).map(|e| VersionEntry {
            version: self.version,
            baseline: e.baseline,
            file_len: e.file_len,
            trailer: e.trailer.clone(),
        })
    }

    /// Writes the record durably: after this returns the version is committed.
    pub fn write(&self, root: &Path) -> Result<()> {
        self.write_to(&Posix::at(root))
    }

    /// As [`CommitRecord::write`], on any storage.
    pub fn write_to(&self, storage: &dyn Storage) -> Result<()> {
        let dir = Path::new(COMMITS_DIR);
        storage.create_dir(dir)?;
        let rel = record_rel(self.version);
        storage::write_bytes(storage, &rel, &self.encode())?;
        storage.barrier(dir).inspect_err(|_| {
            // Not known durable: take it back, so that a failure reported to
            // every rank is a version committed nowhere.
            let _ = storage.remove(&rel);
            let _ = storage.barrier(dir);
        })
    }
}

/// Every commit record under a root, by version.
#[derive(Clone, Debug, Default)]
pub struct CommitLog {
    records: BTreeMap<u64, CommitRecord>,
    /// The files (relative to the root) each committed version is recorded in.
    files: BTreeMap<u64, Vec<PathBuf>>,
    /// Parts of versions not committed: version, rank, file.
    stray: Vec<(u64, u32, PathBuf)>,
    /// Records that could not be read: path, version (from the name), reason.
    damaged: Vec<(PathBuf, String)>,
    damaged_versions: Vec<u64>,
}

impl CommitLog {
    /// Reads `<root>/commits/` (empty when absent). A record that cannot be
    /// read is set apart ([`CommitLog::damaged`]), never fatal: the versions
    /// it alone commits stay invisible until `dckpt repair` decides, and
    /// every other version reads as usual.
    pub fn load(root: &Path) -> Result<Self> {
        Self::load_from(&Posix::at(root))
    }

    /// As [`CommitLog::load`], on any storage.
    pub fn load_from(storage: &dyn Storage) -> Result<Self> {
        let mut log = CommitLog::default();
        let mut parts: BTreeMap<u64, Vec<(CommitPart, PathBuf)>> = BTreeMap::new();
        for entry in storage.list(Path::new(COMMITS_DIR))? {
            let (v, rel, part) = if let Some(v) = parse_record_name(&entry.name) {
                (v, record_rel(v), None)
            } else if let Some((v, r)) = parse_part_name(&entry.name) {
                (v, part_rel(v, r), Some(r))
            } else {
                continue;
            };
            let path = storage.locate(&rel);
            // Not being able to read a record (EIO, EACCES) is fatal; only
            // bytes that do not decode are damage.
            // A record removed since the listing (set aside by a repair) is gone.
            let Some(bytes) = storage.read(&rel)? else { continue };
            let decoded = match part {
                None => CommitRecord::decode(&bytes, &path).and_then(|r| {
                    if r.version != v {
                        return Err(Error::corrupt(&path, format!("holds version {}", r.version)));
                    }
                    log.records.insert(v, r);
                    log.files.entry(v).or_default().push(rel);
                    Ok(())
                }),
                Some(rank) => CommitPart::decode(&bytes, &path).and_then(|p| {
                    if p.version != v || p.entry.rank != rank {
                        return Err(Error::corrupt(
                            &path,
                            format!("holds rank {} version {}", p.entry.rank, p.version),
                        ));
                    }
                    parts.entry(v).or_default().push((p, rel));
                    Ok(())
                }),
            };
            if let Err(e) = decoded {
                log.damaged.push((path, e.to_string()));
                log.damaged_versions.push(v);
            }
        }
        log.commit_parts(parts);
        Ok(log)
    }

    /// Applies the parts' rule, oldest version first: a version is committed
    /// when every rank's part is there and each continues a committed
    /// version (or is a baseline). A full record for the version wins.
    fn commit_parts(&mut self, parts: BTreeMap<u64, Vec<(CommitPart, PathBuf)>>) {
        for (v, mut ps) in parts {
            if self.records.contains_key(&v) {
                // Already committed by a full record: the parts are spare copies.
                self.files.entry(v).or_default().extend(ps.into_iter().map(|(_, rel)| rel));
                continue;
            }
            ps.sort_by_key(|(p, _)| p.entry.rank);
            let ranks = ps.first().map_or(0, |(p, _)| p.ranks);
            let complete = ps.len() == ranks as usize
                && ps.iter().enumerate().all(|(i, (p, _))| p.ranks == ranks && p.entry.rank as usize == i)
                && !self.damaged_versions.contains(&v)
                && ps.iter().all(|(p, _)| {
                    p.prev.is_none_or(|prev| self.records.get(&prev).is_some_and(|r| r.entry(p.entry.rank).is_some()))
                });
            if complete {
                let entries = ps.iter().map(|(p, _)| p.entry.clone()).collect();
                self.records.insert(v, CommitRecord { version: v, ranks, entries });
                self.files.insert(v, ps.into_iter().map(|(_, rel)| rel).collect());
            } else {
                self.stray.extend(ps.into_iter().map(|(p, rel)| (v, p.entry.rank, rel)));
            }
        }
    }

    /// The files (relative to the store root) that record committed
    /// `version`: its commit record, or its parts.
    pub fn files_of(&self, version: u64) -> &[PathBuf] {
        self.files.get(&version).map_or(&[], Vec::as_slice)
    }

    /// Parts of `rank` whose version is not committed (yet, or ever): the
    /// version and the file relative to the root. Its next writer removes them.
    pub fn stray_parts(&self, rank: u32) -> impl Iterator<Item = (u64, &Path)> + '_ {
        self.stray.iter().filter(move |(_, r, _)| *r == rank).map(|(v, _, rel)| (*v, rel.as_path()))
    }

    /// The ranks of parts whose version is not committed.
    pub fn stray_ranks(&self) -> impl Iterator<Item = u32> + '_ {
        self.stray.iter().map(|(_, r, _)| *r)
    }

    /// Whether `version` is committed.
    pub fn is_committed(&self, version: u64) -> bool {
        self.records.contains_key(&version)
    }

    /// Records that could not be read, with the reason.
    pub fn damaged(&self) -> &[(PathBuf, String)] {
        &self.damaged
    }

    /// Versions whose record could not be read.
    pub fn damaged_versions(&self) -> Vec<u64> {
        self.damaged_versions.clone()
    }

    /// Every readable record, oldest first.
    pub fn records(&self) -> impl Iterator<Item = &CommitRecord> {
        self.records.values()
    }

    /// The committed entries of `rank`, oldest first.
    pub fn entries_of(&self, rank: u32) -> impl Iterator<Item = VersionEntry> + '_ {
        self.records.values().filter_map(move |r| r.entry(rank))
    }

    /// Whether any record exists.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.records.len()
    }
}

/// The version of a commit record's file name `vNNNNNNNNNNNN.commit`.
pub fn parse_record_name(name: &str) -> Option<u64> {
    let v: u64 = name.strip_prefix('v')?.strip_suffix(".commit")?.parse().ok()?;
    (name == format!("v{v:012}.commit")).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes rank `rank`'s part of `version` (continuing `prev`) of a job of `ranks`.
    fn part(root: &Path, version: u64, rank: u32, ranks: u32, prev: Option<u64>) {
        let entry = RankEntry { rank, baseline: prev.is_none(), file_len: 100 + version, trailer: "ab".into() };
        CommitPart { version, ranks, prev, entry }.write_to(&Posix::at(root)).expect("write part");
    }

    fn committed(root: &Path) -> Vec<u64> {
        CommitLog::load(root).expect("load").records().map(|r| r.version).collect()
    }

    #[test]
    fn part_names_round_trip_and_reject_other_spellings() {
        assert_eq!(parse_part_name("v000000000007.r000003.part"), Some((7, 3)));
        let rel = part_rel(12, 1_234_567);
        let name = rel.file_name().and_then(|n| n.to_str()).expect("name");
        assert_eq!(parse_part_name(name), Some((12, 1_234_567)));
        for bad in ["v7.r3.part", "v000000000007.r000003.part.tmp", "v000000000007.commit", "v000000000007.r00003.part"]
        {
            assert_eq!(parse_part_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_version_is_committed_once_every_rank_s_part_is_there() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        part(root, 1, 1, 3, None);
        part(root, 1, 0, 3, None);
        assert_eq!(committed(root), Vec::<u64>::new(), "two parts of three");
        part(root, 1, 2, 3, None);
        assert_eq!(committed(root), vec![1]);
        let log = CommitLog::load(root).expect("load");
        let r = log.records().next().expect("record");
        assert_eq!((r.ranks, r.entries.len(), r.entries[2].file_len), (3, 3, 101));
        assert_eq!(log.files_of(1).len(), 3);
        assert_eq!(log.stray_parts(0).count(), 0);
    }

    #[test]
    fn nothing_built_on_an_uncommitted_version_is_committed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        // Version 1 everywhere; version 2 misses rank 1's part (its flush
        // failed); version 3 is complete but rank 0 continues version 2.
        for r in 0..2 {
            part(root, 1, r, 2, None);
        }
        part(root, 2, 0, 2, Some(1));
        part(root, 3, 0, 2, Some(2));
        part(root, 3, 1, 2, None);
        // Version 4 continues version 1 on both ranks: committed.
        part(root, 4, 0, 2, Some(1));
        part(root, 4, 1, 2, Some(1));
        assert_eq!(committed(root), vec![1, 4]);
        let log = CommitLog::load(root).expect("load");
        let stray0: Vec<u64> = log.stray_parts(0).map(|(v, _)| v).collect();
        let stray1: Vec<u64> = log.stray_parts(1).map(|(v, _)| v).collect();
        assert_eq!((stray0, stray1), (vec![2, 3], vec![3]));
    }

    #[test]
    fn a_record_wins_over_parts_and_a_damaged_part_commits_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        part(root, 5, 0, 2, None);
        let entries =
            (0..2).map(|rank| RankEntry { rank, baseline: true, file_len: 9, trailer: "cd".into() }).collect();
        CommitRecord { version: 5, ranks: 2, entries }.write(root).expect("record");
        let log = CommitLog::load(root).expect("load");
        assert_eq!(log.records().next().map(|r| r.entries[0].file_len), Some(9));
        assert_eq!(log.files_of(5).len(), 2, "the record and the spare part");
        // Version 6: both parts, one damaged.
        part(root, 6, 0, 2, None);
        part(root, 6, 1, 2, None);
        let p = root.join(part_rel(6, 1));
        let mut bytes = std::fs::read(&p).expect("read");
        let last = bytes.len() - 3;
        bytes[last] ^= 1;
        std::fs::write(&p, bytes).expect("write");
        let log = CommitLog::load(root).expect("load");
        assert!(!log.is_committed(6));
        assert_eq!(log.damaged_versions(), vec![6]);
    }
}
