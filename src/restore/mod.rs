//! Restore: resolve every chunk of a version to the one stored region that
//! holds its bytes, then read each needed block once.
//!
//! Walking back from the requested version to its baseline, each version's
//! FIRST and SHIFT runs claim the chunks still unresolved (a FIXED chunk
//! falls through to an older version). FIRST runs resolve to the version's
//! own data; SHIFT runs resolve in one hop to the FIRST data they point at.
//! Reads are then grouped per file, sorted, merged at block granularity, and
//! each block is read and verified once. Each file is opened at most once.

mod catalog;
pub(crate) mod maps;
mod resolve;

#[cfg(test)]
use maps::*;

pub use catalog::*;
pub use resolve::*;

mod copies;

use crate::error::{Error, Result};
use crate::format::diff_file::DiffReader;
use crate::hash::{Digest, subtree_digest};
use crate::layout::Layout;
use crate::storage::{Posix, Storage};
use crate::store::Store;
use crate::store::commits::CommitLog;
use copies::{fill, plan_copies};
use rayon::prelude::*;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Counters of one restore, with where its time went.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct RestoreStats {
    /// Diff files opened.
    pub files_opened: usize,
    /// Data bytes read from them (whole verified blocks).
    pub bytes_read: u64,
    /// Bytes restored.
    pub data_len: u64,
    /// Pieces the version resolved to (runs of chunks from one file).
    pub pieces: u64,
    /// Seconds walking the chain (resolution).
    pub resolve_seconds: f64,
    /// Seconds mapping pieces to byte copies per file.
    pub plan_seconds: f64,
    /// Seconds reading blocks from their files (or decompressing them; none
    /// for files in memory, whose blocks are used where they are).
    pub read_seconds: f64,
    /// Seconds verifying each block and copying its pieces into place (one
    /// pass per block).
    pub copy_seconds: f64,
}

/// Most diff files a [`Catalog`] keeps open at once (older ones are closed
/// and reopened on demand), so restores and `verify` work under small
/// `ulimit -n` on stores of thousands of files.
pub const MAX_OPEN_FILES: usize = 32;

/// Opens stores and diff files on demand, parsing each at most once and
/// keeping at most [`MAX_OPEN_FILES`] file handles open.
pub struct Catalog {
    root: PathBuf,
    storage: Arc<dyn Storage>,
    commits: Option<CommitLog>,
    stores: HashMap<u32, Store>,
    readers: HashMap<(u32, u64), DiffReader>,
    /// Readers holding an open file, least recently used first.
    open: VecDeque<(u32, u64)>,
}

/// Where each chunk of a restored version is stored: what a rebuild needs
/// beside the restored bytes.
#[derive(Clone, Debug, Default)]
pub struct StoredMap {
    /// Its chunks mapped to stored chunks, coalesced, sorted by destination.
    pub runs: Vec<Source>,
    /// The layout of every rank holding some of its bytes.
    pub layouts: HashMap<u32, Layout>,
}

/// A restore's resolution before its [`StoredMap`] is made: the sources
/// and the layout of every rank they name. Coalescing the sources is the
/// costly part (tens of milliseconds for millions of sources), so a caller
/// may do it beside other work ([`PendingMap::make`]) or not at all.
#[derive(Debug)]
pub struct PendingMap {
    sources: Vec<Source>,
    layouts: HashMap<u32, Layout>,
}

/// A diff file's reader to open, with what it must match.
struct ReaderOpening {
    storage: Arc<dyn Storage>,
    rel: PathBuf,
    path: PathBuf,
    rank: u32,
    version: u64,
    layout: Layout,
    hash: crate::hash::HashAlgo,
    method: crate::method::Method,
    entry: crate::format::manifest::VersionEntry,
}

/// A resolved piece: `count` chunks starting at `dst` come from chunks
/// starting at `src` of `(rank, version)`'s FIRST data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Source {
    /// First destination chunk.
    pub dst: u64,
    /// Number of chunks.
    pub count: u64,
    /// Rank of the file holding the bytes.
    pub rank: u32,
    /// Version of the file holding the bytes.
    pub version: u64,
    /// First source chunk (in that rank's numbering).
    pub src: u64,
}

/// A cross-rank reference a restore followed: the owner's chunks
/// `src..src + count` must hash to `digest` (the region's Merkle digest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsedReference {
    /// First destination chunk of the reference.
    pub dst: u64,
    /// Chunks it covers.
    pub count: u64,
    /// The owner.
    pub owner: u32,
    /// The owner's version.
    pub version: u64,
    /// First chunk in the owner's numbering.
    pub src: u64,
    /// The region digest the reference carries.
    pub digest: Digest,
    /// Whether every chunk of it was restored from it (then the restored
    /// bytes are hashed; otherwise the owner's bytes are read again).
    pub whole: bool,
    /// The file holding the reference (shared by its file's references).
    pub path: std::sync::Arc<Path>,
}

/// A run of a diff as the walk sees it.
#[derive(Clone, Copy)]
struct Run {
    start: u64,
    count: u64,
    /// `(rank, version, source start)` for SHIFT runs.
    src: Option<(u32, u64, u64)>,
    /// The region digest of a cross-rank reference.
    reference: Option<Digest>,
}

/// Every chunk of a version resolved to its stored bytes, and the
/// cross-rank references that were followed.
#[derive(Clone, Debug)]
pub struct Resolution {
    /// The version's layout.
    pub layout: Layout,
    /// Pieces sorted by destination chunk.
    pub sources: Vec<Source>,
    /// Cross-rank references followed.
    pub references: Vec<UsedReference>,
}

/// Restores `(rank, version)` into a new buffer.
pub fn restore_version(root: &Path, rank: u32, version: u64) -> Result<Vec<u8>> {
    restore_with_stats(root, rank, version).map(|(d, _)| d)
}

/// Restores `(rank, version)` and reports what it read.
pub fn restore_with_stats(root: &Path, rank: u32, version: u64) -> Result<(Vec<u8>, RestoreStats)> {
    let mut catalog = Catalog::new(root);
    restore_in(&mut catalog, rank, version).map(|(out, stats, _)| (out, stats))
}

/// Restores bytes `bytes` of `(rank, version)` alone: of the data, only the
/// chunks holding them are read (each block once, verified), and the whole
/// regions of the cross-rank references they follow (to check them against
/// their digests); the chain's tables are resolved as for a whole restore. What restarting on another rank count reads
/// of an old rank's region ([`crate::runtime::Runtime::read_region`]).
pub fn restore_range(root: &Path, rank: u32, version: u64, bytes: Range<u64>) -> Result<Vec<u8>> {
    let mut catalog = Catalog::new(root);
    let res = resolve_all(&mut catalog, rank, version)?;
    let layout = res.layout;
    if bytes.start > bytes.end || bytes.end > layout.data_len() {
        return Err(Error::InvalidOption(format!(
            "bytes {bytes:?} of rank {rank} version {version}: it holds {} bytes",
            layout.data_len()
        )));
    }
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let cs = u64::from(layout.chunk_size());
    let chunks = bytes.start / cs..(bytes.end - 1) / cs + 1;
    let span = layout.chunk_bytes(chunks.clone());
    let sources: Vec<Source> = res.sources.iter().filter_map(|s| clip_source(s, &chunks)).collect();
    let len = usize::try_from(span.end - span.start)
        .map_err(|_| Error::too_large("a restored range", span.end - span.start))?;
    let mut out = vec![0u8; len];
    let plan = plan_copies(&mut catalog, rank, &layout, &sources, span.start)?;
    fill(&mut catalog, plan, &mut out)?;
    let refs: Vec<UsedReference> =
        res.references.into_iter().filter(|r| r.dst < chunks.end && r.dst + r.count > chunks.start).collect();
    check_references(&mut catalog, rank, &layout, &refs, None)?;
    out.truncate((bytes.end - span.start) as usize);
    out.drain(..(bytes.start - span.start) as usize);
    Ok(out)
}

/// The part of `s` that restores chunks `chunks` (sources map chunks one to one).
fn clip_source(s: &Source, chunks: &Range<u64>) -> Option<Source> {
    let (start, end) = (s.dst.max(chunks.start), (s.dst + s.count).min(chunks.end));
    (start < end).then(|| Source { dst: start, count: end - start, src: s.src + (start - s.dst), ..*s })
}

/// Restores `(rank, version)` into the file `out`, safely: never through a
/// symbolic link, onto a device node other than a character device, or onto
/// a file of the store itself ([`crate::store::write_output`]).
pub fn restore_to_file(root: &Path, rank: u32, version: u64, out: &Path) -> Result<RestoreStats> {
    let (data, stats) = restore_with_stats(root, rank, version)?;
    crate::store::write_output(out, &data, root)?;
    Ok(stats)
}

/// Restores `(rank, version)` through `catalog`; also returns the resolution
/// (what a reopening writer rebuilds its record from).
pub fn restore_in(catalog: &mut Catalog, rank: u32, version: u64) -> Result<(Vec<u8>, RestoreStats, Resolution)> {
    let mut out = Vec::new();
    let (stats, res) = restore_with(catalog, rank, version, |len| {
        out = vec![0u8; len];
        // Touch every page in parallel (a fresh allocation faults on first write).
        out.par_chunks_mut(1 << 20).for_each(|c| c.fill(0));
        Ok(&mut out[..])
    })?;
    Ok((out, stats, res))
}

/// Restores `(rank, version)` through `catalog` into `out`, which must be
/// the version's length. Every byte of `out` is written; on an error its
/// content is unspecified (what was verified before the error).
pub fn restore_in_place(catalog: &mut Catalog, rank: u32, version: u64, out: &mut [u8]) -> Result<RestoreStats> {
    restore_in_place_resolved(catalog, rank, version, out).map(|(stats, _)| stats)
}

/// As [`restore_in_place`], also returning where each chunk was read from.
pub fn restore_in_place_resolved(
    catalog: &mut Catalog,
    rank: u32,
    version: u64,
    out: &mut [u8],
) -> Result<(RestoreStats, Resolution)> {
    let want = out.len();
    restore_with(catalog, rank, version, |len| {
        if len == want {
            Ok(out)
        } else {
            Err(Error::InvalidOption(format!("the buffer holds {want} bytes, version {version} holds {len}")))
        }
    })
}

/// The restore: resolves, asks `output` for the buffer of the version's
/// length (after the resolution: a caller may ready it meanwhile), fills it
/// and checks the references.
pub fn restore_with<'o>(
    catalog: &mut Catalog,
    rank: u32,
    version: u64,
    output: impl FnOnce(usize) -> Result<&'o mut [u8]>,
) -> Result<(RestoreStats, Resolution)> {
    restore_beside(catalog, rank, version, output, |_| Ok(()))
}

/// [`restore_with`], running `beside` on the filled buffer while the
/// references are checked (on a thread of their own): a restore into
/// device memory uploads the bytes meanwhile. An error of either is the
/// restore's (the check's first); `beside` has then seen bytes that are
/// not all verified.
pub fn restore_beside<'o>(
    catalog: &mut Catalog,
    rank: u32,
    version: u64,
    output: impl FnOnce(usize) -> Result<&'o mut [u8]>,
    beside: impl FnOnce(&[u8]) -> Result<()>,
) -> Result<(RestoreStats, Resolution)> {
    let t0 = std::time::Instant::now();
    let res = {
        let _span = crate::profile::Span::new("restore-resolve", version);
        resolve_all(catalog, rank, version)?
    };
    let resolve_seconds = t0.elapsed().as_secs_f64();
    let layout = res.layout;
    let len =
        usize::try_from(layout.data_len()).map_err(|_| Error::too_large("a restored version", layout.data_len()))?;
    let out = output(len)?;
    let t1 = std::time::Instant::now();
    let plan = {
        let _span = crate::profile::Span::new("restore-plan", version);
        plan_copies(catalog, rank, &layout, &res.sources, 0)?
    };
    let plan_seconds = t1.elapsed().as_secs_f64();
    let io = {
        let _span = crate::profile::Span::new("restore-fill", version);
        fill(catalog, plan, out)?
    };
    crate::profile::record("restore-fill-cut", version, std::time::Duration::from_secs_f64(io.cut));
    let out: &[u8] = out;
    let (checked, done) = std::thread::scope(|s| {
        let (references, catalog) = (&res.references, &mut *catalog);
        if references.is_empty() {
            return (Ok(()), beside(out));
        }
        let check = std::thread::Builder::new().name("dckpt-restore-check".into()).spawn_scoped(s, move || {
            let _span = crate::profile::Span::new("restore-references", version);
            check_references(catalog, rank, &layout, references, Some(out))
        });
        let done = beside(out);
        let checked = match check {
            Ok(check) => check.join().unwrap_or_else(|_| Err(Error::Internal("the reference check panicked".into()))),
            Err(e) => Err(Error::no_thread("the reference check", e)),
        };
        (checked, done)
    });
    checked?;
    done?;
    let stats = RestoreStats {
        files_opened: catalog.files_opened(),
        bytes_read: io.bytes,
        data_len: layout.data_len(),
        pieces: res.sources.len() as u64,
        resolve_seconds,
        plan_seconds,
        read_seconds: io.read,
        copy_seconds: io.copy,
    };
    Ok((stats, res))
}

/// Checks that every source points at stored bytes of the right length and
/// maps it to byte copies per file.
pub fn check_sources(catalog: &mut Catalog, rank: u32, layout: &Layout, sources: &[Source]) -> Result<()> {
    plan_copies(catalog, rank, layout, sources, 0).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalescing_in_parts_matches_coalescing_in_one_pass() {
        // Runs of continuing pieces across the parts' seams, a part that
        // merges whole into the one before, and pieces of other files.
        let n = 3 * COALESCE_PART + 77;
        let sources: Vec<Source> = (0..n as u64)
            .map(|i| {
                let file = if i % 1000 == 999 || (i / 50_000) % 2 == 1 && i % 7 == 0 { 2 } else { 1 };
                Source { dst: i, count: 1, rank: 0, version: file, src: if file == 1 { i } else { i * 3 } }
            })
            .collect();
        let expected = coalesce_slice(&sources);
        assert!(expected.len() > 10 && expected.len() < n / 2);
        assert_eq!(coalesce(sources.clone()), expected);
        // Everything one run: every part merges into the first.
        let one: Vec<Source> =
            (0..n as u64).map(|i| Source { dst: i, count: 1, rank: 0, version: 1, src: i }).collect();
        assert_eq!(coalesce(one), vec![Source { dst: 0, count: n as u64, rank: 0, version: 1, src: 0 }]);
    }

    #[test]
    fn a_parallel_concatenation_keeps_every_item_in_order() {
        // Empty parts among full ones, first and last included, and more
        // items than one task takes.
        let lens = [0usize, 5, 0, 0, 40_000, 1, 0, 70_000, 0];
        let mut next = 0u64;
        let parts: Vec<Vec<u64>> = lens
            .iter()
            .map(|&n| {
                let part = (next..next + n as u64).map(|x| x * 3 + 1).collect();
                next += n as u64;
                part
            })
            .collect();
        let joined = concat_parallel(&parts, |p| p.as_slice());
        assert_eq!(joined, parts.concat());
        assert!(concat_parallel(&Vec::<Vec<u64>>::new(), |p| p.as_slice()).is_empty());
    }
}
