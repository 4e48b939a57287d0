//! How one version's file is written and listed on one tier: from cached
//! bytes (rewritten where regions were given away, runs folded, sealed,
//! compressed) or as a copy of an earlier tier's durable file, then listed
//! in the manifest or as a commit part. The flush workers and the agent
//! (which finishes a dead rank's flushes from its journal) both write
//! through here, so a finished flush is the file the rank would have made.

use super::cache::Cached;
use super::listing::Listing;
use crate::error::{Error, Result};
use crate::format::Compression;
use crate::format::manifest::VersionEntry;
use crate::regions::Rewrite;
use crate::store::StoreWriter;
use crate::store::commits::{CommitPart, RankEntry};
use std::sync::Mutex;

/// A cached diff file's bytes: the host cache's ([`Cached`]), or a dead
/// rank's cache segments mapped again by the agent.
pub(crate) trait FileBytes: Sync {
    /// The file's length.
    fn len(&self) -> usize;
    /// Copies bytes `offset..offset + buf.len()` into `buf`; `None` past the end.
    fn read_at(&self, offset: usize, buf: &mut [u8]) -> Option<()>;
    /// The file's bytes, in consecutive pieces.
    fn pieces(&self) -> Vec<&[u8]>;
}

impl FileBytes for Cached {
    fn len(&self) -> usize {
        Cached::len(self)
    }

    fn read_at(&self, offset: usize, buf: &mut [u8]) -> Option<()> {
        Cached::read_at(self, offset, buf)
    }

    fn pieces(&self) -> Vec<&[u8]> {
        Cached::pieces(self).collect()
    }
}

/// How a cached file becomes the file written: the rewrite it still needs
/// (regions given away), whether it carries its trailer, and the compression.
pub(crate) struct CacheWrite<'a> {
    /// Regions given away by the collective step, if any.
    pub rewrite: Option<&'a Rewrite>,
    /// Whether the cached file is sealed (see [`Job::sealed`]).
    pub sealed: bool,
    /// Compression of the file written, if any.
    pub compression: Option<Compression>,
}

/// Writes version `version` of `store` from cached bytes `c`, rewritten,
/// sealed and compressed as `how` says; its entry, and the bytes written
/// where `retain` wants them for the restore cache.
pub(crate) fn write_cached(
    store: &StoreWriter,
    version: u64,
    baseline: bool,
    c: &dyn FileBytes,
    how: &CacheWrite<'_>,
    retain: &dyn Fn(u64) -> bool,
) -> Result<(VersionEntry, Option<Vec<u8>>)> {
    let mut retained = None;
    // A device-made file handed over unsealed with no rewrite
    // may still hold runs to fold (`Rewrite::folding`).
    let folding = match (how.rewrite, how.sealed) {
        (None, false) => folding_of(c)?,
        _ => None,
    };
    // The file to write: the cached bytes, rewritten where regions
    // were given away or runs fold (a sealed file), then
    // compressed if asked.
    let rewritten = match how.rewrite.or(folding.as_ref()) {
        // The kept bytes read from the cache straight into the new file.
        Some(rewrite) => {
            let _span = crate::profile::Span::new("flush-rewrite", version);
            Some(rewrite.apply_with(&|at, buf: &mut [u8]| c.read_at(at, buf))?)
        }
        None => None,
    };
    let (pieces, sealed): (Vec<&[u8]>, bool) = match &rewritten {
        Some(file) => (vec![file.as_slice()], true),
        None => (c.pieces(), how.sealed),
    };
    let len = pieces.iter().map(|p| p.len() as u64).sum::<u64>();
    let invalid = |e: String| {
        let path = store.diff_path(version);
        Error::corrupt(&path, format!("the backend handed over an invalid diff: {e}"))
    };
    let entry = if let Some(compression) = how.compression {
        let file = crate::format::compress_file(&pieces, len, compression).map_err(invalid)?;
        let trailer = file.len().checked_sub(32).map(|at| &file[at..]);
        let entry =
            store.write_diff_with(version, baseline, file.len() as u64, trailer, &mut |w| w.write_all(&file))?;
        if retain(file.len() as u64) {
            retained = Some(file);
        }
        entry
    } else {
        let trailer = if sealed {
            last_32(&pieces).ok_or_else(|| invalid("shorter than a trailer".into()))?
        } else {
            crate::format::seal(&pieces, len).map_err(invalid)?
        };
        let entry = store
            .write_diff_with(version, baseline, len, Some(&trailer), &mut |w| write_sealed(&pieces, &trailer, w))?;
        if retain(len) {
            let mut copy = Vec::with_capacity(len as usize);
            write_sealed(&pieces, &trailer, &mut copy).map_err(|e| Error::Internal(e.to_string()))?;
            retained = Some(copy);
        }
        entry
    };
    Ok((entry, retained))
}

/// Writes version `version` of `store` as a copy of the durable file `path`
/// of `len` bytes (an earlier tier's).
pub(crate) fn write_copied(
    store: &StoreWriter,
    version: u64,
    baseline: bool,
    path: &std::path::Path,
    len: u64,
) -> Result<VersionEntry> {
    let trailer = read_trailer(path, len)?;
    let src = Mutex::new(crate::storage::fsio::open_regular(path).map_err(|e| Error::io(path, e))?);
    store.write_diff_with(version, baseline, len, Some(&trailer), &mut |w| {
        let mut f = crate::sync::lock(&src);
        let copied = std::io::copy(&mut *f, w)?;
        if copied == len {
            Ok(())
        } else {
            Err(std::io::Error::other(format!("the source changed: {copied} of {len} bytes")))
        }
    })
}

/// Lists a durable version as `listing` says: in the manifest, or as this
/// rank's commit part.
pub(crate) fn list_written(
    store: &mut StoreWriter,
    listing: Listing,
    version: u64,
    baseline: bool,
    prev: Option<u64>,
    entry: VersionEntry,
) -> Result<()> {
    match listing {
        Listing::Manifest => store.publish(entry),
        Listing::Part { rank, ranks } => {
            let part = CommitPart {
                version,
                ranks,
                prev: prev.filter(|_| !baseline),
                entry: RankEntry { rank, baseline, file_len: entry.file_len, trailer: entry.trailer },
            };
            part.write_to(store.storage().as_ref())
        }
    }
}

/// The last 32 bytes of a file given as consecutive `pieces`.
fn last_32(pieces: &[&[u8]]) -> Option<[u8; 32]> {
    let mut t = [0u8; 32];
    let mut need = 32;
    for p in pieces.iter().rev() {
        let n = need.min(p.len());
        t[need - n..need].copy_from_slice(&p[p.len() - n..]);
        need -= n;
        if need == 0 {
            return Some(t);
        }
    }
    None
}

/// Writes the file given as `pieces` with its last 32 bytes replaced by
/// `trailer` (which seals a file the GPU handed over unsealed).
fn write_sealed(pieces: &[&[u8]], trailer: &[u8; 32], out: &mut dyn std::io::Write) -> std::io::Result<()> {
    let mut left = pieces.iter().map(|p| p.len()).sum::<usize>().saturating_sub(32);
    for p in pieces {
        let n = left.min(p.len());
        out.write_all(&p[..n])?;
        left -= n;
    }
    out.write_all(trailer)
}

/// The last 32 bytes of a file of `len` bytes.
fn read_trailer(path: &std::path::Path, len: u64) -> Result<[u8; 32]> {
    use std::os::unix::fs::FileExt;
    let f = crate::storage::fsio::open_regular(path).map_err(|e| Error::io(path, e))?;
    let mut t = [0u8; 32];
    let at = len.checked_sub(32).ok_or_else(|| Error::corrupt(path, "shorter than a trailer"))?;
    f.read_exact_at(&mut t, at).map_err(|e| Error::io(path, e))?;
    Ok(t)
}

/// The rewrite folding the repeated runs of cached file `c`, if it holds any
/// (read from its header and tables alone).
fn folding_of(c: &dyn FileBytes) -> Result<Option<Rewrite>> {
    use crate::format::diff_file::{DiffHeader, HEADER_LEN};
    let short = || Error::Internal("a cached diff file shorter than its tables".into());
    let invalid = |e: String| Error::Internal(format!("a cached diff file: {e}"));
    let mut head = [0u8; HEADER_LEN as usize];
    c.read_at(0, &mut head).ok_or_else(short)?;
    let header = DiffHeader::decode(&head).map_err(invalid)?;
    if header.compressed.is_some() || header.shift_count < 2 {
        return Ok(None);
    }
    let data_start = crate::format::data_start_of(&head, FileBytes::len(c) as u64).map_err(invalid)?;
    let mut meta = vec![0u8; usize::try_from(data_start).map_err(|_| short())?];
    c.read_at(0, &mut meta).ok_or_else(short)?;
    Rewrite::folding(&meta)
}
