//! The tiers' restore path: a read-only storage over every tier that reads
//! a version's metadata from its *home* tier (the one whose manifest or
//! commit log lists it) and each diff file of its chain from the fastest
//! place holding it: the restore cache ([`super::prefetch`]), then the disk
//! tiers fastest first (a miss reads only what the restore needs, and is
//! not admitted: a chain's older files are read mostly for their tables). The copies of a file are the same bytes on every
//! tier (later tiers copy the first tier's file), and the catalog checks
//! each file against the home tier's committed entry and each block against
//! its digest, so a file read from another tier is as verified as one read
//! from home. A chain whose old files retention deleted from the local tier
//! reads them from the shared tier, and its new ones locally.

use super::prefetch::{FileKey, ReadCounters, RestoreCache};
use super::writeback::{InMemory, Overlay};
use crate::error::{Error, Result};
use crate::restore::Catalog;
use crate::restore::PendingMap;
use crate::storage::{Entry, Fill, LockGuard, Posix, ReadAt, Storage};
use crate::store::parse_diff_name;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// How a restore may read the tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reach {
    /// Each diff file from the cache or the fastest tier holding it.
    Fastest,
    /// Every file from the home tier (the fallback when a mixed read failed).
    HomeOnly,
}

/// Files of other nodes' ranks a restore reads in memory (their manifests
/// and the owners' diff files its references name), by path relative to a
/// tier root: fetched over MPI when the node-local tier of another node
/// holds them (`crate::redundancy::recover`).
pub type RemoteFiles = std::collections::HashMap<PathBuf, Arc<Vec<u8>>>;

/// The tiers a restore reads.
pub(crate) struct At<'a> {
    /// Every disk tier's root, fastest first.
    pub roots: &'a [PathBuf],
    /// The tier listing the version (or, with an overlay, the first).
    pub home: usize,
    /// The versions still in the host cache, over the home tier.
    pub overlay: Option<Arc<Overlay>>,
    /// Other nodes' files, over every tier.
    pub remote: Option<Arc<RemoteFiles>>,
}

/// Restores `version` of `rank`, listed on `roots[home]`, reading as
/// `reach` says (through `cache` if given), into `out` (of the version's
/// length; after an error its content is unspecified). On failure the files the cache served are forgotten, so
/// that a damaged copy is not served again; in every case the cache learns
/// the version was restored. Returns where each of its chunks is stored
/// (the map still to be made: [`PendingMap::make`]).
pub(crate) fn restore(
    at: At<'_>,
    rank: u32,
    version: u64,
    reach: Reach,
    cache: Option<&RestoreCache>,
    out: &mut [u8],
) -> Result<PendingMap> {
    let want = out.len();
    restore_with(
        at,
        rank,
        version,
        reach,
        cache,
        |len| match len == want {
            true => Ok(out),
            false => Err(Error::InvalidOption(format!("the buffer holds {want} bytes, version {version} holds {len}"))),
        },
        |_| Ok(()),
    )
}

/// As [`restore`], asking `output` for the buffer once the version is
/// resolved (the caller may ready it meanwhile), and running `beside` on
/// the filled buffer while its references are checked
/// ([`crate::restore::restore_beside`]).
pub(crate) fn restore_with<'o>(
    at: At<'_>,
    rank: u32,
    version: u64,
    reach: Reach,
    cache: Option<&RestoreCache>,
    output: impl FnOnce(usize) -> Result<&'o mut [u8]>,
    beside: impl FnOnce(&[u8]) -> Result<()>,
) -> Result<PendingMap> {
    let tiers: Vec<Posix> = at.roots.iter().map(|r| Posix::at(r)).collect();
    let reader = Arc::new(TierReader {
        home: at.home,
        tiers,
        reach,
        cache: cache.cloned(),
        overlay: at.overlay,
        remote: at.remote,
        touched: Mutex::new(Vec::new()),
    });
    let mut catalog = Catalog::on(Arc::clone(&reader) as Arc<dyn Storage>);
    let result = crate::restore::restore_beside(&mut catalog, rank, version, output, beside)
        .and_then(|(_, res)| PendingMap::of(&mut catalog, res.sources));
    if let Some(cache) = cache {
        if result.is_err() {
            cache.forget(&crate::sync::lock(&reader.touched));
        }
        cache.restored(version);
    }
    result
}

/// Where a counted file's bytes come from.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// The restore cache (a hit).
    Cache,
    /// A disk tier (a miss).
    Disk,
    /// The host cache (a version in flight).
    InFlight,
}

/// A file whose reads are counted.
struct Counted(Box<dyn ReadAt>, Arc<ReadCounters>, Source);

impl std::fmt::Debug for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Counted({:?})", self.2)
    }
}

impl ReadAt for Counted {
    fn len(&self) -> u64 {
        self.0.len()
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.0.read_exact_at(buf, offset)?;
        self.count(buf.len());
        Ok(())
    }

    fn borrow_at(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let bytes = self.0.borrow_at(offset, len)?;
        self.count(len);
        Some(bytes)
    }
}

impl Counted {
    /// Counts `bytes` read where they came from.
    fn count(&self, bytes: usize) {
        let counter = match self.2 {
            Source::Cache => &self.1.hit,
            Source::Disk => &self.1.miss,
            Source::InFlight => &self.1.inflight,
        };
        counter.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// The restore's storage decorator over the tiers (see the module
/// documentation). Read-only.
#[derive(Debug)]
struct TierReader {
    /// The tier listing the version: metadata comes from here.
    home: usize,
    /// Every disk tier, fastest first.
    tiers: Vec<Posix>,
    reach: Reach,
    cache: Option<RestoreCache>,
    overlay: Option<Arc<Overlay>>,
    remote: Option<Arc<RemoteFiles>>,
    /// Diff files served from or admitted to the cache.
    touched: Mutex<Vec<FileKey>>,
}

/// `(rank, version)` of a path `rank-R/vV.dckpt`.
fn diff_key(rel: &Path) -> Option<FileKey> {
    let mut parts = rel.iter();
    let dir = parts.next()?.to_str()?;
    let name = parts.next()?.to_str()?;
    if parts.next().is_some() {
        return None;
    }
    let rank: u32 = dir.strip_prefix("rank-")?.parse().ok()?;
    Some((rank, parse_diff_name(name)?))
}

impl TierReader {
    fn home(&self) -> &Posix {
        &self.tiers[self.home]
    }

    fn touched(&self, key: FileKey) {
        crate::sync::lock(&self.touched).push(key);
    }

    /// Opens a diff file from the fastest tier holding it (home last among
    /// equals: it is tried in its place in the order).
    fn open_fastest(&self, rel: &Path) -> Result<Box<dyn ReadAt>> {
        let mut home_error = None;
        for (i, tier) in self.tiers.iter().enumerate() {
            match tier.open(rel) {
                Ok(f) => return Ok(f),
                Err(e) if i == self.home => home_error = Some(e),
                Err(_) => {} // not on this tier
            }
        }
        Err(home_error.unwrap_or_else(|| Error::Internal("no home tier".into())))
    }
}

impl Storage for TierReader {
    fn locate(&self, rel: &Path) -> PathBuf {
        self.home().locate(rel)
    }

    fn create_dir(&self, _: &Path) -> Result<()> {
        Err(read_only())
    }

    fn read(&self, rel: &Path) -> Result<Option<Vec<u8>>> {
        if let Some(bytes) = self.overlay.as_ref().and_then(|o| o.read(rel)) {
            return Ok(Some(bytes));
        }
        // Other nodes' files only where the home tier has none.
        match (self.home().read(rel)?, self.remote.as_ref().and_then(|r| r.get(rel))) {
            (None, Some(bytes)) => Ok(Some(bytes.to_vec())),
            (here, _) => Ok(here),
        }
    }

    fn open(&self, rel: &Path) -> Result<Box<dyn ReadAt>> {
        if let Some(file) = self.overlay.as_ref().and_then(|o| o.open(rel)) {
            return Ok(match &self.cache {
                Some(cache) => Box::new(Counted(file, cache.counters(), Source::InFlight)),
                None => file,
            });
        }
        // Other nodes' files only where no tier here has one.
        if let Some(bytes) = self.remote.as_ref().and_then(|r| r.get(rel))
            && self.tiers.iter().all(|t| !t.locate(rel).exists())
        {
            return Ok(Box::new(InMemory(Arc::clone(bytes))));
        }
        let key = diff_key(rel);
        let (Some(key), Reach::Fastest) = (key, self.reach) else { return self.home().open(rel) };
        let Some(cache) = &self.cache else { return self.open_fastest(rel) };
        if let Some(bytes) = cache.lookup(key) {
            self.touched(key);
            return Ok(Box::new(Counted(Box::new(InMemory(bytes)), cache.counters(), Source::Cache)));
        }
        // A miss: read from disk only what the restore needs (a chain's
        // older files are mostly read for their tables); what the cache
        // holds is what the flush left and what the prefetch loaded.
        Ok(Box::new(Counted(self.open_fastest(rel)?, cache.counters(), Source::Disk)))
    }

    fn list(&self, rel: &Path) -> Result<Vec<Entry>> {
        self.home().list(rel)
    }

    fn write_atomic(&self, _: &Path, _: Fill<'_>) -> Result<()> {
        Err(read_only())
    }

    fn remove(&self, _: &Path) -> Result<()> {
        Err(read_only())
    }

    fn rename(&self, _: &Path, _: &Path) -> Result<()> {
        Err(read_only())
    }

    fn barrier(&self, _: &Path) -> Result<()> {
        Err(read_only())
    }

    fn lock(&self, _: &Path) -> Result<Box<dyn LockGuard>> {
        Err(read_only())
    }
}

fn read_only() -> Error {
    Error::Internal("the tiers' restore storage is read-only".into())
}
