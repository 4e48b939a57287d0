//! Restores of versions still in flight: a version whose file is in the host
//! cache, queued for the first disk tier, is restored from the cache's
//! segments at once instead of after its flush (HPDC'23's *write complete*
//! state serves reads). The restore reads through an *overlay* on the first
//! tier: its manifest with the in-flight versions of the chain appended, and
//! those versions' files served from memory (sealed on the way: the GPU
//! hands its files over without a trailer). Every byte is verified as from
//! disk.
//!
//! A version qualifies only if its chain, followed back through the
//! in-flight versions' predecessors, reaches a baseline in flight or the
//! newest version listed on the first tier: a chain whose predecessor failed
//! on that tier is never stitched over a hole (the restore then takes the
//! tiers' path, and its error). Single-rank tiers only: a collective
//! version is restorable once every rank's part is committed.

use super::cache::Cached;
use crate::error::{Error, Result};
use crate::format::manifest::VersionEntry;
use crate::memory::parallel_copy;
use crate::storage::ReadAt;
use crate::store::{Store, diff_file_name, rank_rel};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A version queued for the first tier, with its cached file.
#[derive(Clone, Debug)]
pub(crate) struct InFlight {
    /// The file, shared with its flush job (its segments go back once both
    /// are done with it).
    pub cached: Arc<Cached>,
    /// Whether it is a baseline.
    pub baseline: bool,
    /// The version before it in its chain.
    pub prev: Option<u64>,
    /// Whether the cached file carries its trailer.
    pub sealed: bool,
}

/// The versions in flight, by version.
pub(crate) type InFlightMap = Mutex<BTreeMap<u64, InFlight>>;

/// What a restore of an in-flight version reads instead of the first tier.
#[derive(Debug)]
pub(crate) struct Overlay {
    /// The rank's manifest path and its overlaid bytes.
    manifest: (PathBuf, Vec<u8>),
    /// In-flight diff files by path.
    files: HashMap<PathBuf, Held>,
}

impl Overlay {
    /// The overlay of a restore of `version` of `rank` over the first tier
    /// at `root`, if `version` is in flight and its chain qualifies.
    pub fn of(inflight: &InFlightMap, root: &Path, rank: u32, version: u64) -> Result<Option<Overlay>> {
        // In-flight versions first: one that lands meanwhile is listed on
        // the tier before it leaves the map, so it is in one or the other.
        // Only the chain's files are held (clones of their `Arc`s): holding
        // others would keep their segments from the flusher.
        let mut chain = Vec::new();
        let landed = {
            let map = crate::sync::lock(inflight);
            if !map.contains_key(&version) {
                return Ok(None);
            }
            // The chain back through the versions in flight.
            let mut at = Some(version);
            loop {
                let Some(v) = at else { break None };
                let Some(f) = map.get(&v) else { break Some(v) };
                chain.push((v, f.clone()));
                if f.baseline {
                    break None;
                }
                at = f.prev;
            }
        };
        let mut manifest = Store::open(root, rank)?.manifest().clone();
        match landed {
            // It must be the newest listed version, so the chain has no hole.
            Some(v) if manifest.latest().map(|e| e.version) != Some(v) => return Ok(None),
            Some(_) => {}
            None => manifest.versions.clear(), // the chain starts in flight
        }
        let rel = rank_rel(rank);
        let mut files = HashMap::new();
        for (v, f) in chain.into_iter().rev() {
            let (held, trailer) = held_file(v, &f)?;
            manifest.versions.push(VersionEntry {
                version: v,
                baseline: f.baseline,
                file_len: f.cached.len() as u64,
                trailer: hex::encode(trailer),
            });
            files.insert(rel.join(diff_file_name(v)), held);
        }
        Ok(Some(Overlay { manifest: (rel.join("MANIFEST"), manifest.encode()), files }))
    }

    /// How many of its files were read out of the GPU cache tier.
    pub fn peeked(&self) -> usize {
        self.files.values().filter(|h| matches!(h, Held::Peeked(_))).count()
    }

    /// The overlaid bytes of `rel`, if it is the manifest.
    pub fn read(&self, rel: &Path) -> Option<Vec<u8>> {
        (rel == self.manifest.0).then(|| self.manifest.1.clone())
    }

    /// The in-flight file at `rel`, if it is one.
    pub fn open(&self, rel: &Path) -> Option<Box<dyn ReadAt>> {
        Some(match self.files.get(rel)? {
            Held::Cached(cached, trailer) => Box::new(CachedFile { cached: Arc::clone(cached), trailer: *trailer }),
            Held::Peeked(bytes) => Box::new(InMemory(Arc::clone(bytes))),
        })
    }
}

/// Where the overlay reads an in-flight file from.
#[derive(Debug)]
enum Held {
    /// The host cache's segments, and the file's trailer.
    Cached(Arc<Cached>, [u8; 32]),
    /// A copy read from the GPU cache tier, where the file still waits for
    /// room in the host cache (sealed: its trailer in place).
    Peeked(Arc<Vec<u8>>),
}

/// In-flight `version`'s file as the overlay reads it, and its trailer (computed if
/// it was handed over unsealed). A file still held by the GPU cache tier is
/// copied from there ([`Cached::peek`]): the restore neither takes host
/// segments (which the chain's other files, held by this restore, might be
/// keeping from it) nor waits for the flush.
fn held_file(version: u64, f: &InFlight) -> Result<(Held, [u8; 32])> {
    let invalid = |e: String| Error::Internal(format!("the backend handed over an invalid diff: {e}"));
    let peeked = {
        let _span = crate::profile::Span::new("restore-peek", version);
        f.cached.peek()?
    };
    if let Some(mut bytes) = peeked {
        crate::profile::count("restore-peek-bytes", version, bytes.len() as u64);
        let body = bytes.len().checked_sub(32).ok_or_else(|| invalid("shorter than its trailer".into()))?;
        if !f.sealed {
            let trailer = crate::format::seal(&[&bytes[..]], bytes.len() as u64).map_err(invalid)?;
            bytes[body..].copy_from_slice(&trailer);
        }
        let mut trailer = [0u8; 32];
        trailer.copy_from_slice(&bytes[body..]);
        return Ok((Held::Peeked(Arc::new(bytes)), trailer));
    }
    // A device may still be copying the file in; every read of it from the
    // overlay comes after this.
    f.cached.ready()?;
    let trailer = if f.sealed {
        f.cached.trailer().ok_or_else(|| Error::Internal("a cached file shorter than its trailer".into()))?
    } else {
        let pieces: Vec<&[u8]> = f.cached.pieces().collect();
        crate::format::seal(&pieces, f.cached.len() as u64).map_err(invalid)?
    };
    Ok((Held::Cached(Arc::clone(&f.cached), trailer), trailer))
}

/// An in-flight file read from the host cache, its trailer in place.
#[derive(Debug)]
struct CachedFile {
    cached: Arc<Cached>,
    trailer: [u8; 32],
}

impl ReadAt for CachedFile {
    fn len(&self) -> u64 {
        self.cached.len() as u64
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let len = self.cached.len();
        let at = usize::try_from(offset).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        let end = at.checked_add(buf.len()).filter(|&e| e <= len).ok_or(std::io::ErrorKind::UnexpectedEof)?;
        let body = len.saturating_sub(32);
        // The bytes before the trailer from the segments, then the trailer.
        let split = end.min(body).max(at) - at;
        self.cached.read_at(at, &mut buf[..split]).ok_or(std::io::ErrorKind::UnexpectedEof)?;
        for (k, b) in buf[split..].iter_mut().enumerate() {
            *b = self.trailer[at + split + k - body];
        }
        Ok(())
    }
}
/// A file held in memory (the restore cache's, or one copied out of the GPU
/// cache tier); it lends its bytes to a restore.
#[derive(Debug)]
pub(crate) struct InMemory(pub Arc<Vec<u8>>);

impl ReadAt for InMemory {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let src = self.borrow_at(offset, buf.len()).ok_or(std::io::ErrorKind::UnexpectedEof)?;
        parallel_copy(buf, src);
        Ok(())
    }

    fn borrow_at(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let at = usize::try_from(offset).ok()?;
        self.0.get(at..at.checked_add(len)?)
    }
}
