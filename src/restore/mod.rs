//! Restore: resolve every chunk of a version to the one stored region that
//! holds its bytes, then read each needed block once.
//!
//! Walking back from the requested version to its baseline, each version's
//! FIRST and SHIFT runs claim the chunks still unresolved (a FIXED chunk
//! falls through to an older version). FIRST runs resolve to the version's
//! own data; SHIFT runs resolve in one hop to the FIRST data they point at.
//! Reads are then grouped per file, sorted, merged at block granularity, and
//! each block is read and verified once. Each file is opened at most once.

mod copies;

use crate::format::diff_file::DiffReader;
use crate::hash::{Digest, subtree_digest};
use crate::layout::Layout;
use crate::storage::{Posix, Storage};
use crate::store::commits::CommitLog;
use crate::store::{Store, hex};
use crate::{Error, Result};
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

impl Catalog {
    /// A catalog over the store root `root` (a POSIX directory).
    pub fn new(root: &Path) -> Self {
        Self::on(Arc::new(Posix::at(root)))
    }

    /// A catalog over a store on any storage.
    pub fn on(storage: Arc<dyn Storage>) -> Self {
        Catalog {
            root: storage.locate(Path::new("")),
            storage,
            commits: None,
            stores: HashMap::new(),
            readers: HashMap::new(),
            open: VecDeque::new(),
        }
    }

    /// The store root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The store of `rank` (its manifest rolled forward from the commit records).
    pub fn store(&mut self, rank: u32) -> Result<&Store> {
        if self.commits.is_none() {
            self.commits = Some(CommitLog::load_from(self.storage.as_ref())?);
        }
        let log = self.commits.as_ref().ok_or_else(|| Error::Internal("commit log".into()))?;
        match self.stores.entry(rank) {
            Entry::Occupied(o) => Ok(o.into_mut()),
            Entry::Vacant(v) => Ok(v.insert(Store::open_in(self.storage.clone(), rank, log)?)),
        }
    }

    /// The verified-metadata reader of `(rank, version)`; the version must be
    /// committed for that rank and its file must match the committed entry.
    pub fn reader(&mut self, rank: u32, version: u64) -> Result<&DiffReader> {
        let key = (rank, version);
        if !self.readers.contains_key(&key) {
            let reader = self.opening(rank, version)?.open()?;
            self.readers.insert(key, reader);
        }
        self.touch(key);
        self.readers.get(&key).ok_or_else(|| Error::Internal("reader cache".into()))
    }

    /// The reader of `(rank, version)` if it is open already
    /// ([`Catalog::preload`]).
    pub fn loaded(&self, rank: u32, version: u64) -> Option<&DiffReader> {
        self.readers.get(&(rank, version))
    }

    /// Opens the readers of `versions` of `rank` not open yet, in parallel
    /// (each parses and checks a file's tables: a chain's files are
    /// independent). The first error, if any.
    pub fn preload(&mut self, rank: u32, versions: &[u64]) -> Result<()> {
        let missing: Vec<u64> = versions.iter().copied().filter(|&v| !self.readers.contains_key(&(rank, v))).collect();
        let wanted: Vec<ReaderOpening> = missing.into_iter().map(|v| self.opening(rank, v)).collect::<Result<_>>()?;
        let opened: Vec<DiffReader> = wanted.into_par_iter().map(ReaderOpening::open).collect::<Result<_>>()?;
        for reader in opened {
            let key = (rank, reader.header.version);
            self.readers.insert(key, reader);
            self.touch(key);
        }
        Ok(())
    }

    /// What opening the reader of `(rank, version)` needs from its store.
    fn opening(&mut self, rank: u32, version: u64) -> Result<ReaderOpening> {
        let store = self.store(rank)?;
        let entry = store.manifest().get(version).cloned().ok_or_else(|| Error::MissingVersion {
            dir: store.root().to_path_buf(),
            rank,
            version,
        })?;
        Ok(ReaderOpening {
            storage: store.storage().clone(),
            rel: store.diff_rel(version),
            path: store.diff_path(version),
            rank,
            version,
            layout: store.layout()?,
            hash: store.manifest().hash,
            method: store.manifest().method,
            entry,
        })
    }

    /// Marks `key` most recently used; closes the files of the least
    /// recently used readers beyond [`MAX_OPEN_FILES`].
    fn touch(&mut self, key: (u32, u64)) {
        if self.open.back() == Some(&key) {
            return;
        }
        if let Some(i) = self.open.iter().position(|k| *k == key) {
            self.open.remove(i);
        }
        self.open.push_back(key);
        while self.open.len() > MAX_OPEN_FILES {
            if let Some(old) = self.open.pop_front()
                && let Some(r) = self.readers.get(&old)
            {
                r.release_file();
            }
        }
    }

    /// Number of diff files opened so far.
    pub fn files_opened(&self) -> usize {
        self.readers.len()
    }
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

impl StoredMap {
    /// The map of a restore's resolution, each rank's layout read through
    /// `catalog` (which the restore opened them in).
    pub fn of(catalog: &mut Catalog, sources: Vec<Source>) -> Result<Self> {
        PendingMap::of(catalog, sources).map(PendingMap::make)
    }
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

impl PendingMap {
    /// `sources` with their ranks' layouts, read through `catalog` (which
    /// the restore opened them in).
    pub fn of(catalog: &mut Catalog, sources: Vec<Source>) -> Result<Self> {
        // The ranks, found by every core (sources come in long stretches of
        // one rank: look up only changes).
        let ranks = sources
            .par_chunks(COALESCE_PART)
            .map(|part| {
                let (mut ranks, mut last) = (std::collections::HashSet::new(), None);
                for s in part {
                    if last != Some(s.rank) {
                        ranks.insert(s.rank);
                        last = Some(s.rank);
                    }
                }
                ranks
            })
            .reduce(std::collections::HashSet::new, |mut a, b| {
                a.extend(b);
                a
            });
        let mut layouts = HashMap::new();
        for rank in ranks {
            layouts.insert(rank, catalog.store(rank)?.layout()?);
        }
        Ok(PendingMap { sources, layouts })
    }

    /// The map: the sources coalesced.
    pub fn make(self) -> StoredMap {
        StoredMap { runs: coalesce(self.sources), layouts: self.layouts }
    }

    /// Lets the sources go without making the map (freed on another
    /// thread: they may take hundreds of megabytes).
    pub fn discard(self) {
        crate::memory::drop_later(self.sources);
    }
}

/// Sources one task of [`coalesce`] (and of [`StoredMap::of`]) handles.
const COALESCE_PART: usize = 1 << 16;

/// Whether `next` continues `last` in the same file.
fn continues(last: &Source, next: &Source) -> bool {
    last.rank == next.rank
        && last.version == next.version
        && last.dst + last.count == next.dst
        && last.src + last.count == next.src
}

/// `sources` with neighbours that continue each other merged.
fn coalesce_slice(sources: &[Source]) -> Vec<Source> {
    let mut out: Vec<Source> = Vec::with_capacity(sources.len());
    for s in sources {
        match out.last_mut() {
            Some(last) if continues(last, s) => last.count += s.count,
            _ => out.push(*s),
        }
    }
    out
}

/// Merges neighbouring pieces that continue each other in the same file:
/// parts of the list merged by every core, then the seams between them.
pub(crate) fn coalesce(sources: Vec<Source>) -> Vec<Source> {
    if sources.len() <= COALESCE_PART {
        return coalesce_slice(&sources);
    }
    let mut parts: Vec<Vec<Source>> = sources.par_chunks(COALESCE_PART).map(coalesce_slice).collect();
    crate::memory::drop_later(sources);
    // A part's first source may continue the last one kept before it (a
    // part merged whole into the one before leaves that one the last).
    let mut skip = vec![0usize; parts.len()];
    let mut last: Option<(usize, usize)> = None;
    for p in 0..parts.len() {
        if let (Some((lp, li)), Some(&first)) = (last, parts[p].first()) {
            let kept = &mut parts[lp][li];
            if continues(kept, &first) {
                kept.count += first.count;
                skip[p] = 1;
            }
        }
        if parts[p].len() > skip[p] {
            last = Some((p, parts[p].len() - 1));
        }
    }
    let views: Vec<&[Source]> = parts.iter().zip(&skip).map(|(p, &k)| &p[k..]).collect();
    let out = concat_parallel(&views, |v| v);
    crate::memory::drop_later(parts);
    out
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
    method: crate::dedup::Method,
    entry: crate::format::manifest::VersionEntry,
}

impl ReaderOpening {
    /// Opens and checks the reader: the file's rank, version and
    /// parameters, its length and checksum against the committed entry.
    fn open(self) -> Result<DiffReader> {
        let path = &self.path;
        let reader = DiffReader::open_in(self.storage, &self.rel)?;
        let h = &reader.header;
        if h.rank != self.rank || h.version != self.version {
            return Err(Error::corrupt(path, format!("file holds rank {} version {}", h.rank, h.version)));
        }
        if reader.diff.layout != self.layout || h.hash != self.hash || h.method != self.method {
            return Err(Error::corrupt(path, "parameters differ from the manifest's"));
        }
        if reader.file_len() != self.entry.file_len || hex(&reader.trailer()) != self.entry.trailer {
            return Err(Error::corrupt(path, "length or checksum differs from the committed entry's"));
        }
        Ok(reader)
    }
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
    /// The file holding the reference.
    pub path: PathBuf,
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

/// Resolves every chunk of `(rank, version)` to the stored bytes that hold it.
pub fn resolve(catalog: &mut Catalog, rank: u32, version: u64) -> Result<(Layout, Vec<Source>)> {
    resolve_all(catalog, rank, version).map(|r| (r.layout, r.sources))
}

/// [`resolve`], also listing the cross-rank references followed. The chunk
/// range is cut into segments that walk the chain in parallel (each claims
/// only its own chunks), so the walk scales with the cores.
pub fn resolve_all(catalog: &mut Catalog, rank: u32, version: u64) -> Result<Resolution> {
    let store = catalog.store(rank)?;
    let layout = store.layout()?;
    let chain: Vec<u64> = store
        .manifest()
        .chain(version)
        .ok_or_else(|| Error::MissingVersion { dir: store.root().to_path_buf(), rank, version })?
        .iter()
        .map(|v| v.version)
        .collect();
    {
        let _span = crate::profile::Span::new("resolve-open", version);
        catalog.preload(rank, &chain)?;
    }
    let runs_span = crate::profile::Span::new("resolve-runs", version);
    // Each version's runs, newest first, sorted by start (the files'
    // tables merged in parallel).
    let readers: Vec<&DiffReader> = chain
        .iter()
        .rev()
        .map(|&v| catalog.loaded(rank, v).ok_or_else(|| Error::Internal(format!("reader of version {v}"))))
        .collect::<Result<_>>()?;
    let walk_order: Vec<VersionRuns> = readers
        .par_iter()
        .map(|reader| {
            let diff = &reader.diff;
            // FIRST and SHIFT runs are each sorted by start and disjoint (the
            // decoder checks): merge them.
            let first = diff.first.iter().map(|r| Run { start: r.start, count: r.count, src: None, reference: None });
            let shift = diff.shift.iter().map(|s| Run {
                start: s.start,
                count: s.count,
                src: Some((s.src_rank, s.src_version, s.src_start)),
                reference: s.reference,
            });
            let mut runs = Vec::with_capacity(diff.first.len() + diff.shift.len());
            let (mut first, mut shift) = (first.peekable(), shift.peekable());
            while let Some(next) = match (first.peek(), shift.peek()) {
                (Some(a), Some(b)) if a.start < b.start => first.next(),
                (Some(_), None) => first.next(),
                _ => shift.next(),
            } {
                runs.push(next);
            }
            VersionRuns { version: reader.header.version, runs, path: reader.path().to_path_buf() }
        })
        .collect();
    drop(runs_span);
    let _span = crate::profile::Span::new("resolve-walk", version);
    let n = layout.chunks();
    let segments = (rayon::current_num_threads() as u64 * 8).clamp(1, n);
    let walked: Vec<Walked> = (0..segments)
        .into_par_iter()
        .map(|i| {
            let mut w = walk(&walk_order, rank, (n * i / segments)..(n * (i + 1) / segments));
            // In destination order within the segment (a sorted run per
            // version: a stable sort merges them); the segments follow
            // one another, so their concatenation is sorted too.
            w.sources.sort_by_key(|s| s.dst);
            w
        })
        .collect();
    let mut claims: HashMap<(usize, usize), u64> = HashMap::new();
    for w in &walked {
        if let Some(gap) = &w.unresolved {
            let path = catalog.store(rank)?.diff_path(chain[0]);
            return Err(Error::corrupt(
                path,
                format!("chunks {}..{} are stored in no version of the chain", gap.start, gap.end),
            ));
        }
        for &(key, c) in &w.reference_claims {
            *claims.entry(key).or_default() += c;
        }
    }
    let sources = concat_parallel(&walked, |w| &w.sources);
    crate::memory::drop_later(walked);
    let mut keys: Vec<(usize, usize)> = claims.keys().copied().collect();
    keys.sort_unstable();
    let references: Vec<UsedReference> = keys
        .into_iter()
        .filter_map(|(vi, j)| {
            let vr = &walk_order[vi];
            let run = vr.runs[j];
            let (owner, ver, src) = run.src?;
            Some(UsedReference {
                dst: run.start,
                count: run.count,
                owner,
                version: ver,
                src,
                digest: run.reference?,
                whole: claims[&(vi, j)] == run.count,
                path: vr.path.clone(),
            })
        })
        .collect();
    // The chain's run lists (hundreds of MB for a long chain of a large
    // buffer) are freed off the restore's path.
    crate::memory::drop_later(walk_order);
    Ok(Resolution { layout, sources, references })
}

/// One version's runs as the walk sees them.
struct VersionRuns {
    version: u64,
    runs: Vec<Run>,
    path: PathBuf,
}

/// What walking one segment found.
struct Walked {
    sources: Vec<Source>,
    /// Chunks claimed through each cross-rank reference run `(version index, run index)`.
    reference_claims: Vec<((usize, usize), u64)>,
    /// The first chunks no version stores, if any.
    unresolved: Option<Range<u64>>,
}

/// Resolves the chunks of `segment`: newest version first, each version's
/// runs claim the chunks still unresolved (FIXED chunks fall through).
fn walk(versions: &[VersionRuns], rank: u32, segment: Range<u64>) -> Walked {
    let mut out = Walked { sources: Vec::new(), reference_claims: Vec::new(), unresolved: None };
    let mut unresolved: Vec<Range<u64>> = if segment.is_empty() { Vec::new() } else { vec![segment.clone()] };
    for (vi, vr) in versions.iter().enumerate() {
        if unresolved.is_empty() {
            break;
        }
        let runs = &vr.runs;
        let mut still = Vec::new();
        let mut k = runs.partition_point(|r| r.start + r.count <= segment.start);
        for gap in unresolved {
            let mut at = gap.start;
            while k < runs.len() && runs[k].start + runs[k].count <= at {
                k += 1;
            }
            let mut j = k;
            while at < gap.end {
                match runs.get(j) {
                    Some(run) if run.start < gap.end => {
                        if run.start > at {
                            still.push(at..run.start);
                            at = run.start;
                        }
                        let end = (run.start + run.count).min(gap.end);
                        let (srank, sver, sstart) = run.src.unwrap_or((rank, vr.version, run.start));
                        out.sources.push(Source {
                            dst: at,
                            count: end - at,
                            rank: srank,
                            version: sver,
                            src: sstart + (at - run.start),
                        });
                        if run.reference.is_some() {
                            out.reference_claims.push(((vi, j), end - at));
                        }
                        at = end;
                        j += 1;
                    }
                    _ => {
                        still.push(at..gap.end);
                        at = gap.end;
                    }
                }
            }
            k = j.saturating_sub(1);
        }
        unresolved = still;
    }
    out.unresolved = unresolved.into_iter().next();
    out
}

/// The concatenation of `parts`' lists, written by every core (joining
/// them one after another was one core copying, and faulting in, hundreds
/// of MB at 4 GiB).
fn concat_parallel<P: Sync, T: Copy + Send + Sync>(parts: &[P], list: impl Fn(&P) -> &[T] + Sync) -> Vec<T> {
    let mut starts = Vec::with_capacity(parts.len() + 1);
    let mut total = 0usize;
    for p in parts {
        starts.push(total);
        total += list(p).len();
    }
    starts.push(total);
    (0..total)
        .into_par_iter()
        .with_min_len(1 << 14)
        .map_init(
            || 0usize,
            |part, i| {
                // Indices come in runs: the part of the previous one, mostly.
                if !(starts[*part] <= i && i < starts[*part + 1]) {
                    *part = starts.partition_point(|&s| s <= i) - 1;
                }
                list(&parts[*part])[i - starts[*part]]
            },
        )
        .collect()
}

/// Checks each followed cross-rank reference against its region digest:
/// restored bytes that came wholly from it are hashed in `out`, the others
/// are read from the owner again. A mismatch is an error, never other bytes.
pub fn check_references(
    catalog: &mut Catalog,
    rank: u32,
    layout: &Layout,
    refs: &[UsedReference],
    out: Option<&[u8]>,
) -> Result<()> {
    let (hash, cs) = {
        let m = catalog.store(rank)?.manifest();
        (m.hash, m.chunk_size)
    };
    for r in refs {
        let digest = match out.filter(|_| r.whole) {
            Some(out) => {
                let b = layout.chunk_bytes(r.dst..r.dst + r.count);
                subtree_digest(hash, cs, &out[b.start as usize..b.end as usize])
            }
            None => {
                let owner = owner_reader(catalog, rank, r.owner, r.version)?;
                subtree_digest(hash, cs, &owner.read_chunks(r.src..r.src + r.count)?)
            }
        };
        if digest != r.digest {
            return Err(Error::BrokenReference {
                path: r.path.clone(),
                reason: format!(
                    "chunks {}..+{} reference bytes of rank {} version {} that do not match the region's digest",
                    r.dst, r.count, r.owner, r.version
                ),
            });
        }
    }
    Ok(())
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
    let len = usize::try_from(span.end - span.start).map_err(|_| Error::Internal("range too large".into()))?;
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
    let t0 = std::time::Instant::now();
    let res = {
        let _span = crate::profile::Span::new("restore-resolve", version);
        resolve_all(catalog, rank, version)?
    };
    let resolve_seconds = t0.elapsed().as_secs_f64();
    let layout = res.layout;
    let len = usize::try_from(layout.data_len()).map_err(|_| Error::Internal("version too large".into()))?;
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
    {
        let _span = crate::profile::Span::new("restore-references", version);
        check_references(catalog, rank, &layout, &res.references, Some(out))?;
    }
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

/// The reader of `(owner, version)` for a restore of `rank`: a failure to open
/// another rank's file names both ranks, the version and the file.
pub fn owner_reader(catalog: &mut Catalog, rank: u32, owner: u32, version: u64) -> Result<&DiffReader> {
    if owner == rank {
        return catalog.reader(owner, version);
    }
    let path = crate::store::rank_dir(&catalog.root, owner).join(crate::store::diff_file_name(version));
    match catalog.reader(owner, version) {
        Ok(_) => catalog.reader(owner, version),
        Err(e) => {
            let reason = match e {
                Error::Io { source, .. } => source.to_string(),
                other => other.to_string(),
            };
            Err(Error::OwnerUnavailable { rank, version, owner, path, reason })
        }
    }
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
