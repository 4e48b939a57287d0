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

use crate::format::manifest::VersionEntry;
use crate::storage::{self, Posix, Storage};
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The directory of commit records, relative to the store root.
pub const COMMITS_DIR: &str = "commits";

const TAG: &str = "dckpt-commit";

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
        for entry in storage.list(Path::new(COMMITS_DIR))? {
            let Some(v) = parse_record_name(&entry.name) else { continue };
            let rel = record_rel(v);
            let path = storage.locate(&rel);
            // Not being able to read a record (EIO, EACCES) is fatal; only
            // bytes that do not decode are damage.
            // A record removed since the listing (set aside by a repair) is gone.
            let Some(bytes) = storage.read(&rel)? else { continue };
            let record = Ok(bytes).and_then(|b: Vec<u8>| {
                let r = CommitRecord::decode(&b, &path)?;
                if r.version != v {
                    return Err(Error::corrupt(&path, format!("holds version {}", r.version)));
                }
                Ok(r)
            });
            match record {
                Ok(r) => {
                    log.records.insert(v, r);
                }
                Err(e) => {
                    log.damaged.push((path, e.to_string()));
                    log.damaged_versions.push(v);
                }
            }
        }
        Ok(log)
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
