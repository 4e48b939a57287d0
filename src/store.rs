//! A rank's checkpoint directory and its atomic commit protocol.
//!
//! ```text
//! <root>/rank-00003/MANIFEST                 parameters + complete versions
//! <root>/rank-00003/v000000000007.dckpt      diff file of version 7
//! <root>/rank-00003/v000000000007.rec        record entries version 7 added
//! ```
//!
//! A commit writes each file to `*.tmp`, fsyncs it, renames it into place and
//! fsyncs the directory; only then is the manifest rewritten the same way. A
//! crash at any point leaves the previous manifest, so a version is visible
//! only once complete, and the previous complete version stays restorable.

use crate::format::manifest::{Manifest, VersionEntry};
use crate::layout::Layout;
use crate::{Error, HashAlgo, Method, Result};
use serde::{Deserialize, Serialize};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Parameters of a store, fixed at its first checkpoint (the last two are
/// policies that may change between runs). Serde-able for TOML configs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreOptions {
    /// Chunk size in bytes (32 B – 64 KiB).
    pub chunk_size: u32,
    /// Checkpointing method.
    pub method: Method,
    /// Digest algorithm.
    pub hash: HashAlgo,
    /// Re-baseline once a chain holds this many versions (baseline included).
    pub max_chain: Option<u64>,
    /// Re-baseline once the record holds more entries than this.
    pub max_record_entries: Option<u64>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            chunk_size: 128,
            method: Method::Tree,
            hash: HashAlgo::Murmur3,
            max_chain: None,
            max_record_entries: None,
        }
    }
}

/// One rank's directory.
#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    dir: PathBuf,
    manifest: Manifest,
}

/// The directory of `rank` under `root`.
pub fn rank_dir(root: &Path, rank: u32) -> PathBuf {
    root.join(format!("rank-{rank:05}"))
}

/// Ranks that have a store under `root`, sorted.
pub fn list_ranks(root: &Path) -> Result<Vec<u32>> {
    let mut ranks = Vec::new();
    for entry in fs::read_dir(root).map_err(|e| Error::io(root, e))? {
        let entry = entry.map_err(|e| Error::io(root, e))?;
        let name = entry.file_name();
        if let Some(r) = name.to_str().and_then(|n| n.strip_prefix("rank-")).and_then(|n| n.parse::<u32>().ok()) {
            ranks.push(r);
        }
    }
    ranks.sort_unstable();
    Ok(ranks)
}

impl Store {
    /// Opens an existing store.
    pub fn open(root: &Path, rank: u32) -> Result<Self> {
        let dir = rank_dir(root, rank);
        let path = dir.join("MANIFEST");
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NoStore { dir: root.to_path_buf(), rank });
            }
            Err(e) => return Err(Error::io(&path, e)),
        };
        let manifest = Manifest::decode(&bytes, &path)?;
        if manifest.rank != rank {
            return Err(Error::corrupt(&path, format!("manifest is for rank {}", manifest.rank)));
        }
        Layout::new(manifest.data_len, manifest.chunk_size).map_err(|e| Error::corrupt(&path, e.to_string()))?;
        Ok(Store { root: root.to_path_buf(), dir, manifest })
    }

    /// Opens the store, or prepares a new one; checks that the parameters agree.
    pub fn open_or_create(root: &Path, rank: u32, data_len: u64, opts: &StoreOptions) -> Result<Self> {
        Layout::new(data_len, opts.chunk_size)?;
        match Store::open(root, rank) {
            Ok(store) => {
                store.check_params(data_len, opts)?;
                Ok(store)
            }
            Err(Error::NoStore { .. }) => {
                let dir = rank_dir(root, rank);
                fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
                let manifest = Manifest {
                    rank,
                    data_len,
                    chunk_size: opts.chunk_size,
                    method: opts.method,
                    hash: opts.hash,
                    versions: Vec::new(),
                };
                Ok(Store { root: root.to_path_buf(), dir, manifest })
            }
            Err(e) => Err(e),
        }
    }

    fn check_params(&self, data_len: u64, opts: &StoreOptions) -> Result<()> {
        let m = &self.manifest;
        let mismatch = |what, existing: String, requested: String| {
            Err(Error::Mismatch { what, dir: self.dir.clone(), existing, requested })
        };
        if m.data_len != data_len {
            return mismatch("data length", format!("{} bytes", m.data_len), format!("{data_len} bytes"));
        }
        if m.chunk_size != opts.chunk_size {
            return mismatch("chunk size", m.chunk_size.to_string(), opts.chunk_size.to_string());
        }
        if m.method != opts.method {
            return mismatch("method", m.method.to_string(), opts.method.to_string());
        }
        if m.hash != opts.hash {
            return mismatch("hash", m.hash.to_string(), opts.hash.to_string());
        }
        Ok(())
    }

    /// The store's root directory (all ranks).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// This rank's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The manifest as last committed.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The chunk layout.
    pub fn layout(&self) -> Result<Layout> {
        Layout::new(self.manifest.data_len, self.manifest.chunk_size)
    }

    /// Path of a version's diff file.
    pub fn diff_path(&self, version: u64) -> PathBuf {
        self.dir.join(format!("v{version:012}.dckpt"))
    }

    /// Path of a version's record segment.
    pub fn record_path(&self, version: u64) -> PathBuf {
        self.dir.join(format!("v{version:012}.rec"))
    }

    /// Durably writes a version's files, then lists it in the manifest.
    pub fn commit(
        &mut self,
        version: u64,
        baseline: bool,
        diff: &[u8],
        record: &[u8],
        record_entries: u64,
    ) -> Result<()> {
        let entry = self.write_files(version, baseline, diff, record, record_entries)?;
        self.publish(entry)
    }

    /// Step 1 of a commit: durably writes a version's diff file and record
    /// segment. They stay invisible (a restore, a reopen and `verify` ignore
    /// them) until [`Store::publish`] lists the returned entry; the next
    /// attempt at the version overwrites them. A collective checkpoint
    /// publishes only once every rank has written its files.
    pub fn write_files(
        &self,
        version: u64,
        baseline: bool,
        diff: &[u8],
        record: &[u8],
        record_entries: u64,
    ) -> Result<VersionEntry> {
        if let Some(latest) = self.manifest.latest()
            && latest.version >= version
        {
            return Err(Error::VersionNotNewer { latest: latest.version, requested: version });
        }
        if diff.len() < 32 {
            return Err(Error::InvalidOption("diff buffer is too short to hold a trailer".into()));
        }
        write_atomic(&self.diff_path(version), diff)?;
        write_atomic(&self.record_path(version), record)?;
        sync_dir(&self.dir)?;
        Ok(VersionEntry {
            version,
            baseline,
            file_len: diff.len() as u64,
            trailer: hex(&diff[diff.len() - 32..]),
            record_entries,
        })
    }

    /// Step 2 of a commit: lists a written version in the manifest (atomic).
    pub fn publish(&mut self, entry: VersionEntry) -> Result<()> {
        if let Some(latest) = self.manifest.latest()
            && latest.version >= entry.version
        {
            return Err(Error::VersionNotNewer { latest: latest.version, requested: entry.version });
        }
        let mut next = self.manifest.clone();
        next.versions.push(entry);
        write_atomic(&self.dir.join("MANIFEST"), &next.encode())?;
        sync_dir(&self.dir)?;
        self.manifest = next;
        Ok(())
    }
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `bytes` to `path` through a fsynced temporary file and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let result = (|| {
        let mut f = OpenOptions::new().write(true).create(true).truncate(true).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    result.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        Error::io(path, e)
    })
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io(dir, e))
}
