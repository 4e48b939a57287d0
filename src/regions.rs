//! Regions of a diff and what giving one away does to it: the FIRST regions
//! a rank can offer to other ranks ([`first_regions`]), and, once an owner
//! is chosen for some of them ([`Conversion`]), the rewrite of the diff into
//! cross-rank references ([`apply`]) and of its record entries
//! ([`relocate`]). Pure functions over diffs and layouts: the engine uses
//! them without knowing how owners are chosen (`collective::regions` reads
//! them off the reduction's result).
//!
//! A region is a Merkle node inside a FIRST run, at most `2^max_level`
//! chunks: runs are cut into the largest aligned nodes that fit, so ranks
//! holding the same bytes at the same offsets offer the same digests, and a
//! replicated buffer is offered in pieces small enough to spread over the
//! ranks.

use crate::diff::{Diff, FirstRun, ShiftRun};
use crate::hash::Digest;
use crate::layout::{Layout, NodeId};
use crate::record::RecordEntry;
use rayon::prelude::*;
use std::borrow::Cow;
use std::ops::Range;

/// A region this rank would store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// Digest of the node (as the record stores it).
    pub digest: Digest,
    /// The node in this rank's tree.
    pub node: NodeId,
    /// First chunk.
    pub start: u64,
    /// Number of chunks.
    pub count: u64,
    /// Bytes it covers.
    pub bytes: u64,
}

/// The largest node level whose nodes hold at most `region_bytes` bytes
/// (level 0, one chunk, at least).
pub fn max_region_level(chunk_size: u32, region_bytes: u64) -> u32 {
    let mut k = 0;
    while k < 40 && u64::from(chunk_size) << (k + 1) <= region_bytes {
        k += 1;
    }
    k
}

/// Cuts `chunks` into the largest nodes of `layout` (at most `max_level`)
/// that lie inside it, left to right, appended to `out`.
fn node_cover(layout: &Layout, chunks: Range<u64>, max_level: u32, out: &mut Vec<NodeId>) {
    let top = max_level.min(layout.levels() - 1);
    let mut at = chunks.start;
    while at < chunks.end {
        // The largest aligned node at `at` that ends inside the range (the
        // buffer's last node may be short: it ends at the last chunk).
        let mut k = top.min(at.trailing_zeros());
        while k > 0 && (at + (1u64 << k)).min(layout.chunks()) > chunks.end {
            k -= 1;
        }
        out.push(NodeId::new(k, at >> k));
        at = (at + (1u64 << k)).min(layout.chunks());
    }
}

pub use crate::hash::subtree_digest;

/// Where the bytes of a diff's FIRST chunks lie in the bytes it carries:
/// the whole protected buffer (CPU), or only the FIRST runs' bytes
/// concatenated in run order (what a GPU diff carries, in host or device
/// memory).
#[derive(Clone, Debug)]
pub struct FirstIndex {
    layout: Layout,
    /// `(first chunk, end chunk, offset in data)` per FIRST run; empty = whole buffer.
    runs: Vec<(u64, u64, u64)>,
}

impl FirstIndex {
    /// The whole buffer.
    pub fn whole(layout: Layout) -> Self {
        FirstIndex { layout, runs: Vec::new() }
    }

    /// `diff`'s FIRST runs' bytes, concatenated in run order.
    pub fn gathered(diff: &Diff) -> Self {
        let mut at = 0;
        let runs = diff
            .first
            .iter()
            .map(|r| {
                let b = diff.layout.chunk_bytes(r.start..r.start + r.count);
                let entry = (r.start, r.start + r.count, at);
                at += b.end - b.start;
                entry
            })
            .collect();
        FirstIndex { layout: diff.layout, runs }
    }

    /// Where the bytes of chunks `range` lie in the data, `range` inside one FIRST run.
    pub fn locate(&self, range: Range<u64>) -> Range<u64> {
        let b = self.layout.chunk_bytes(range.clone());
        if self.runs.is_empty() {
            return b;
        }
        let k = self.runs.partition_point(|r| r.1 <= range.start);
        let (start, _, off) = self.runs[k];
        let base = self.layout.chunk_bytes(start..start).start;
        let from = off + b.start - base;
        from..from + (b.end - b.start)
    }
}

impl FirstIndex {
    /// Where the bytes of `runs` (inside the FIRST runs) lie, in order: one
    /// range a source run they cross.
    pub fn pieces(&self, runs: &[FirstRun]) -> Vec<Range<u64>> {
        let mut out = Vec::with_capacity(runs.len());
        for r in runs {
            let mut at = r.start;
            while at < r.start + r.count {
                // Cut at the end of the source run holding `at`.
                let k = self.runs.partition_point(|x| x.1 <= at);
                let end = self.runs.get(k).map_or(r.start + r.count, |x| x.1).min(r.start + r.count);
                out.push(self.locate(at..end));
                at = end;
            }
        }
        out
    }
}

/// The bytes of a diff's FIRST chunks in host memory ([`FirstIndex`]).
pub struct FirstBytes<'a> {
    index: FirstIndex,
    data: &'a [u8],
}

impl<'a> FirstBytes<'a> {
    /// The whole buffer.
    pub fn whole(layout: Layout, data: &'a [u8]) -> Self {
        FirstBytes { index: FirstIndex::whole(layout), data }
    }

    /// `diff`'s FIRST runs' bytes, concatenated in run order.
    pub fn gathered(diff: &Diff, first_data: &'a [u8]) -> Self {
        FirstBytes { index: FirstIndex::gathered(diff), data: first_data }
    }

    /// The bytes of chunks `range`, which must lie inside one FIRST run.
    pub fn get(&self, range: Range<u64>) -> &'a [u8] {
        let b = self.index.locate(range);
        &self.data[b.start as usize..b.end as usize]
    }

    /// The bytes of `runs` (inside the FIRST runs) concatenated in order.
    pub fn gather(&self, runs: &[FirstRun]) -> Vec<u8> {
        let mut out = Vec::new();
        for piece in self.index.pieces(runs) {
            out.extend_from_slice(&self.data[piece.start as usize..piece.end as usize]);
        }
        out
    }
}

/// The nodes a collective step offers for `diff`'s FIRST runs: each run cut
/// into the largest aligned nodes of at most `2^max_level` chunks, in order.
pub fn region_nodes(diff: &Diff, max_level: u32) -> Vec<NodeId> {
    let mut out = Vec::with_capacity(diff.first.len());
    for r in &diff.first {
        node_cover(&diff.layout, r.start..r.start + r.count, max_level, &mut out);
    }
    out
}

/// The regions of `nodes` (from [`region_nodes`]) with their `digests`, in order.
pub fn regions_of(layout: &Layout, nodes: &[NodeId], digests: &[Digest]) -> Vec<Region> {
    nodes.iter().zip(digests).map(|(&node, &digest)| region(layout, node, digest)).collect()
}

fn region(layout: &Layout, node: NodeId, digest: Digest) -> Region {
    let c = layout.node_chunks(node);
    let b = layout.node_bytes(node);
    Region { digest, node, start: c.start, count: c.end - c.start, bytes: b.end - b.start }
}

/// The regions of `diff`'s FIRST runs, with their digests hashed over `bytes`.
pub fn first_regions(diff: &Diff, bytes: &FirstBytes<'_>, max_level: u32) -> Vec<Region> {
    let read = |at: Range<u64>| Some(Cow::Borrowed(&bytes.data[at.start as usize..at.end as usize]));
    // Every range lies in `bytes` (the index was made from the same diff).
    first_regions_read(diff, &bytes.index, max_level, &read).unwrap_or_default()
}

/// The regions of `diff`'s FIRST runs, their digests hashed over the bytes
/// `read` gives for a range of the data `index` describes: borrowed where
/// they lie in one piece (a cached file's segment), copied where they do
/// not, so that no copy of all the FIRST data is made first. `None` where
/// `read` could not give a range (data shorter than the diff says).
pub fn first_regions_read<'a>(
    diff: &Diff,
    index: &FirstIndex,
    max_level: u32,
    read: &(dyn Fn(Range<u64>) -> Option<Cow<'a, [u8]>> + Sync),
) -> Option<Vec<Region>> {
    let layout = diff.layout;
    region_nodes(diff, max_level)
        .into_par_iter()
        .with_min_len(256)
        .map(|node| {
            let bytes = read(index.locate(layout.node_chunks(node)))?;
            let digest = subtree_digest(diff.hash, layout.chunk_size(), &bytes);
            Some(region(&layout, node, digest))
        })
        .collect()
}

/// The rewrite of a serialized diff file after regions were given away:
/// the file as made (`before`'s tables, its FIRST bytes at `data_start`)
/// becomes `after`'s file, keeping only the FIRST bytes `after` still
/// stores. Host work proportional to the file; the synchronous path applies
/// it before writing, the asynchronous tiers in their flush worker (off the
/// application's path). Both produce the same bytes.
#[derive(Clone, Debug)]
pub struct Rewrite {
    before: Diff,
    after: Diff,
    data_start: usize,
}

impl Rewrite {
    /// The rewrite of a file of `before` (FIRST bytes from `data_start`) into one of `after`.
    pub fn new(before: Diff, after: Diff, data_start: usize) -> Self {
        Rewrite { before, after, data_start }
    }

    /// The rewrite that folds a device-made file's runs of one repeated
    /// source range into repeat entries, as the encoder writes them (a
    /// device writes every run): `meta` is the file's header, tables and
    /// bitmap. `None` where the file holds nothing to fold.
    pub fn folding(meta: &[u8]) -> crate::error::Result<Option<Self>> {
        use crate::format::diff_file::{DiffHeader, HEADER_LEN, runs_fold};
        let invalid = |e: String| crate::error::Error::Internal(format!("a device-made diff file: {e}"));
        // The table scanned in place first: most files fold nothing.
        if !runs_fold(meta).map_err(invalid)? {
            return Ok(None);
        }
        let header = DiffHeader::decode(&meta[..HEADER_LEN as usize]).map_err(invalid)?;
        let diff = crate::format::decode_meta_folded(meta, header.data_bytes).map_err(invalid)?;
        Ok(Some(Rewrite::new(diff.clone(), diff, meta.len())))
    }

    /// The diff of the file as made (what a later rewrite of the same file
    /// starts from).
    pub fn into_before(self) -> Diff {
        self.before
    }

    /// The rewritten file's length.
    pub fn file_len(&self) -> u64 {
        crate::format::diff_file::file_len_of(&self.after)
    }

    /// The rewritten file, from the file as made (`file`, at least up to the
    /// end of its FIRST data).
    pub fn apply(&self, file: &[u8]) -> crate::error::Result<Vec<u8>> {
        self.apply_with(&|at, buf: &mut [u8]| {
            buf.copy_from_slice(file.get(at..at + buf.len())?);
            Some(())
        })
    }

    /// The rewritten file, reading the file as made through `read(offset,
    /// buf)` (`None`: shorter than that): only the FIRST bytes it keeps are
    /// read, each straight into its place in the new file, in parallel, and
    /// the new file is allocated once at its final length (a file of
    /// gigabytes is copied once, not gathered first).
    pub fn apply_with(&self, read: &(dyn Fn(usize, &mut [u8]) -> Option<()> + Sync)) -> crate::error::Result<Vec<u8>> {
        let meta = crate::format::encode_meta(&self.after);
        let data_start = meta.len();
        let kept_len = self.after.data_bytes() as usize;
        let mut body = Vec::with_capacity(self.file_len() as usize);
        body.extend_from_slice(&meta);
        body.resize(data_start + kept_len, 0);
        let pieces = FirstIndex::gathered(&self.before).pieces(&self.after.first);
        let mut jobs = Vec::with_capacity(pieces.len());
        let mut rest = &mut body[data_start..];
        for piece in &pieces {
            let (dst, tail) = std::mem::take(&mut rest).split_at_mut((piece.end - piece.start) as usize);
            jobs.push((self.data_start + piece.start as usize, dst));
            rest = tail;
        }
        let short = || crate::error::Error::Internal("the file to rewrite is shorter than its FIRST data".into());
        if !rest.is_empty() {
            return Err(short());
        }
        jobs.into_par_iter().try_for_each(|(at, dst)| read(at, dst).ok_or_else(short))?;
        Ok(crate::format::finish_body(body, data_start))
    }
}

/// A region this rank hands to another owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conversion {
    /// The region, in this rank's numbering.
    pub region: Region,
    /// The rank that stores it.
    pub owner: u32,
    /// Its first chunk in the owner's numbering.
    pub owner_start: u64,
}

/// Rewrites `diff`: every converted region leaves the FIRST runs and becomes
/// a cross-rank reference to its owner's copy in the same version. A dense
/// version with conversions stays a baseline but is no longer dense.
/// Returns the diff as it was (its runs moved out, nothing copied), `None`
/// when there is nothing to convert. Linear in the runs (a baseline of
/// small chunks has hundreds of thousands of SHIFT runs into itself).
pub fn apply(diff: &mut Diff, conv: &[Conversion]) -> Option<Diff> {
    if conv.is_empty() {
        return None;
    }
    let mut first = Vec::with_capacity(diff.first.len() + conv.len());
    let mut k = 0;
    for run in &diff.first {
        let (mut at, end) = (run.start, run.start + run.count);
        while k < conv.len() && conv[k].region.start < end {
            let r = conv[k].region;
            if r.start > at {
                first.push(FirstRun { start: at, count: r.start - at });
            }
            at = r.start + r.count;
            k += 1;
        }
        if at < end {
            first.push(FirstRun { start: at, count: end - at });
        }
    }
    let (me, version) = (diff.rank, diff.version);
    let mut shift = Vec::with_capacity(diff.shift.len() + conv.len());
    for s in &diff.shift {
        if s.src_rank == me && s.src_version == version {
            redirect_into(s, conv, &mut shift);
        } else {
            shift.push(*s);
        }
    }
    shift.extend(conv.iter().map(|c| ShiftRun {
        start: c.region.start,
        count: c.region.count,
        src_version: version,
        src_rank: c.owner,
        src_start: c.owner_start,
        reference: Some(c.region.digest),
        period: 0,
    }));
    // Two sorted sequences (the runs kept, the references): the stable
    // sort merges them in linear time (the starts are distinct).
    shift.sort_by_key(|s| s.start);
    let before = Diff {
        first: std::mem::replace(&mut diff.first, first),
        shift: std::mem::replace(&mut diff.shift, shift),
        ..*diff
    };
    diff.dense = false;
    diff.coalesce();
    Some(before)
}

/// Appends to `out` a SHIFT run pointing into this very version, cut where
/// its source crosses converted regions: the pieces inside one point at the
/// owner's copy instead (the bytes left this file), the others stay. A run
/// whose source meets no converted region is appended as it is.
///
/// A repeat ([`ShiftRun::period`]) stays one run where its source range
/// meets no converted region, or lies inside one (every copy then points at
/// the owner's copy); otherwise each copy is redirected as a plain run.
fn redirect_into(s: &ShiftRun, conv: &[Conversion], out: &mut Vec<ShiftRun>) {
    let (mut at, end) = (s.src_start, s.src_start + s.source_count());
    let mut k = conv.partition_point(|x| x.region.start + x.region.count <= at);
    if conv.get(k).is_none_or(|x| x.region.start >= end) {
        out.push(*s);
        return;
    }
    if s.period > 0 {
        let x = conv[k];
        if x.region.start <= at && end <= x.region.start + x.region.count {
            out.push(ShiftRun { src_rank: x.owner, src_start: x.owner_start + (at - x.region.start), ..*s });
        } else {
            let mut copies = Vec::new();
            s.expand_into(&mut copies);
            for c in &copies {
                redirect_into(c, conv, out);
            }
        }
        return;
    }
    while at < end {
        let piece = |from: u64, to: u64, rank: u32, src: u64| ShiftRun {
            start: s.start + (from - s.src_start),
            count: to - from,
            src_rank: rank,
            src_start: src,
            ..*s
        };
        match conv.get(k).filter(|x| x.region.start < end) {
            Some(x) if x.region.start <= at => {
                let to = (x.region.start + x.region.count).min(end);
                out.push(piece(at, to, x.owner, x.owner_start + (at - x.region.start)));
                at = to;
                k += 1;
            }
            Some(x) => {
                out.push(piece(at, x.region.start, s.src_rank, at));
                at = x.region.start;
            }
            None => {
                out.push(piece(at, end, s.src_rank, at));
                at = end;
            }
        }
    }
}

/// Where a record entry of this version points after the conversions: an
/// entry whose node lies inside one converted region points at the owner's
/// copy (when that node exists in the owner's tree), so later versions
/// de-duplicate against it as against the rank's own history; one that
/// overlaps a converted region otherwise is dropped (its bytes are no longer
/// stored here as one piece); the rest stay.
pub fn relocate(
    entry: &RecordEntry,
    me: u32,
    layout: &Layout,
    conv: &[Conversion],
    layouts: &[Layout],
) -> Option<RecordEntry> {
    if entry.rank != me {
        return Some(*entry);
    }
    let c = layout.node_chunks(entry.node);
    let i = conv.partition_point(|x| x.region.start + x.region.count <= c.start);
    let Some(x) = conv.get(i).filter(|x| x.region.start < c.end) else { return Some(*entry) };
    if c.start < x.region.start || c.end > x.region.start + x.region.count {
        return None;
    }
    let start = c.start - x.region.start + x.owner_start;
    let level = entry.node.level();
    let node = NodeId::new(level, start >> level);
    let owner_layout = layouts.get(x.owner as usize)?;
    let fits = start.trailing_zeros() >= level || start == 0;
    (fits && owner_layout.contains(node) && owner_layout.node_chunks(node) == (start..start + (c.end - c.start)))
        .then_some(RecordEntry { version: entry.version, rank: x.owner, node })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::HashAlgo;
    use crate::layout::Layout;

    #[test]
    fn node_cover_tiles_any_range_with_nodes_inside_it() {
        for n in [1u64, 2, 7, 64, 100, 257] {
            let layout = Layout::new(n * 64 - 3, 64).unwrap();
            for max in [0, 1, 3, 10] {
                for a in 0..n.min(20) {
                    for b in (a + 1)..=n {
                        let mut nodes = Vec::new();
                        node_cover(&layout, a..b, max, &mut nodes);
                        let mut at = a;
                        for node in nodes {
                            assert!(node.level() <= max && layout.contains(node));
                            let c = layout.node_chunks(node);
                            assert_eq!(c.start, at);
                            at = c.end;
                        }
                        assert_eq!(at, b);
                    }
                }
            }
        }
    }

    #[test]
    fn applied_conversions_redirect_runs_into_the_given_regions_and_return_the_diff_as_it_was() {
        use crate::diff::RegionEncoding;
        let layout = Layout::new(64 * 64, 64).unwrap();
        let own = |start, count, src_start| ShiftRun {
            period: 0,
            start,
            count,
            src_version: 3,
            src_rank: 0,
            src_start,
            reference: None,
        };
        let older = ShiftRun { src_version: 2, ..own(40, 4, 8) };
        let diff = Diff {
            version: 3,
            rank: 0,
            layout,
            hash: HashAlgo::Murmur3,
            method: crate::method::Method::Tree,
            baseline: true,
            dense: true,
            first: vec![FirstRun { start: 0, count: 16 }],
            // Into chunks 4..6 (inside the region 4..8), 6..10 (across its end),
            // 12..14 (outside it), and one run into an older version.
            shift: vec![own(20, 2, 4), own(24, 4, 6), own(30, 2, 12), older],
            encoding: RegionEncoding::Table,
        };
        let region = Region { digest: Digest(7), node: NodeId::new(2, 1), start: 4, count: 4, bytes: 4 * 64 };
        let conv = [Conversion { region, owner: 1, owner_start: 100 }];
        let mut after = diff.clone();
        assert_eq!(apply(&mut after, &[]), None);
        assert_eq!(apply(&mut after, &conv), Some(diff));
        assert_eq!(after.first, vec![FirstRun { start: 0, count: 4 }, FirstRun { start: 8, count: 8 }]);
        let theirs = |start, count, src_start| ShiftRun { src_rank: 1, src_start, ..own(start, count, 0) };
        let reference = ShiftRun { reference: Some(Digest(7)), ..theirs(4, 4, 100) };
        assert_eq!(
            after.shift,
            vec![reference, theirs(20, 2, 100), theirs(24, 2, 102), own(26, 2, 8), own(30, 2, 12), older]
        );
        assert!(!after.dense);
    }

    #[test]
    fn gathered_first_bytes_read_like_the_whole_buffer() {
        use crate::diff::RegionEncoding;
        let data: Vec<u8> = (0..(50 * 64 + 7)).map(|i| (i * 13 % 251) as u8).collect();
        let layout = Layout::new(data.len() as u64, 64).unwrap();
        let first =
            vec![FirstRun { start: 2, count: 5 }, FirstRun { start: 10, count: 1 }, FirstRun { start: 40, count: 11 }];
        let diff = Diff {
            version: 1,
            rank: 0,
            layout,
            hash: HashAlgo::Murmur3,
            method: crate::method::Method::Tree,
            baseline: true,
            dense: false,
            first: first.clone(),
            shift: Vec::new(),
            encoding: RegionEncoding::Table,
        };
        let mut gathered = vec![0u8; diff.data_bytes() as usize];
        diff.gather_into(&data, &mut gathered);
        let (whole, part) = (FirstBytes::whole(layout, &data), FirstBytes::gathered(&diff, &gathered));
        for r in &first {
            for a in r.start..r.start + r.count {
                for b in a + 1..=r.start + r.count {
                    assert_eq!(whole.get(a..b), part.get(a..b), "chunks {a}..{b}");
                }
            }
        }
        let sub = [FirstRun { start: 3, count: 2 }, FirstRun { start: 40, count: 1 }, FirstRun { start: 45, count: 6 }];
        assert_eq!(part.gather(&sub), whole.gather(&sub));
        assert_eq!(part.gather(&first), gathered);

        // Read in pieces (segments of 100 bytes, not chunk-aligned: some
        // regions cross two and are copied), the regions are the same; a
        // reader that runs short gives none.
        let segmented = |at: Range<u64>| -> Option<Cow<'_, [u8]>> {
            let bytes = gathered.get(at.start as usize..at.end as usize)?;
            Some(if at.start / 100 == (at.end - 1) / 100 { Cow::Borrowed(bytes) } else { Cow::Owned(bytes.to_vec()) })
        };
        let index = FirstIndex::gathered(&diff);
        for level in 0..4 {
            let nodes = region_nodes(&diff, level);
            let digests: Vec<Digest> =
                nodes.iter().map(|&n| subtree_digest(diff.hash, 64, whole.get(layout.node_chunks(n)))).collect();
            let want = regions_of(&layout, &nodes, &digests);
            assert!(want.len() >= first.len());
            assert_eq!(first_regions(&diff, &part, level), want, "level {level}");
            assert_eq!(first_regions_read(&diff, &index, level, &segmented), Some(want), "level {level}");
        }
        let short = gathered.len() as u64 - 1;
        let truncated =
            |at: Range<u64>| (at.end <= short).then(|| Cow::Borrowed(&gathered[at.start as usize..at.end as usize]));
        assert_eq!(first_regions_read(&diff, &index, 2, &truncated), None);
    }

    #[test]
    fn node_digest_matches_the_tree_the_dedup_builds() {
        let data: Vec<u8> = (0..(37 * 32 + 5)).map(|i| (i * 7 % 251) as u8).collect();
        let layout = Layout::new(data.len() as u64, 32).unwrap();
        for hash in [HashAlgo::Murmur3, HashAlgo::Blake3] {
            let leaves = crate::dedup::hash_leaves(&data, layout, hash, None);
            // Build every level the way the layout defines it.
            let mut level: Vec<Digest> = leaves.iter().map(|(_, d)| *d).collect();
            let mut k = 0;
            loop {
                for (i, d) in level.iter().enumerate() {
                    let b = layout.node_bytes(NodeId::new(k, i as u64));
                    let bytes = &data[b.start as usize..b.end as usize];
                    assert_eq!(subtree_digest(hash, 32, bytes), *d, "node ({k}, {i})");
                }
                if level.len() == 1 {
                    break;
                }
                level = level.chunks(2).map(|p| if let [l, r] = p { hash.node(*l, *r) } else { p[0] }).collect();
                k += 1;
            }
        }
    }

    /// A baseline diff whose chunks 0..16 are one FIRST run and whose SHIFT
    /// runs follow them from `segments` (count, source start, copies: a
    /// plain run, or a repeat of `copies` ≥ 2), each a FIXED chunk apart,
    /// sources in chunks 0..16; returned folded (repeats kept) and expanded
    /// (one run per copy, coalesced, as a decoded file gives).
    fn folded_and_expanded(segments: &[(u64, u64, u64)]) -> (Diff, Diff) {
        use crate::diff::RegionEncoding;
        let mut shift = Vec::new();
        let mut at = 16;
        for &(count, src_start, copies) in segments {
            let period = if copies > 1 { count } else { 0 };
            shift.push(ShiftRun {
                start: at,
                count: count * copies,
                src_version: 3,
                src_rank: 0,
                src_start,
                reference: None,
                period,
            });
            at += count * copies + 1; // one FIXED chunk between runs
        }
        let mut folded = Diff {
            version: 3,
            rank: 0,
            layout: Layout::new((at + 1) * 64, 64).unwrap(),
            hash: HashAlgo::Murmur3,
            method: crate::method::Method::Tree,
            baseline: true,
            dense: false,
            first: vec![FirstRun { start: 0, count: 16 }],
            shift,
            encoding: RegionEncoding::Table,
        };
        folded.coalesce();
        let mut expanded = folded.clone();
        expanded.expand_repeats();
        expanded.coalesce();
        (folded, expanded)
    }

    proptest::proptest! {
        /// Giving regions away from a diff whose repeats are kept folded
        /// gives the diff and the file that the expanded runs give: the
        /// same runs once expanded, the same encoded tables, and no more
        /// runs than the folded diff had plus what the conversions cut.
        #[test]
        fn a_give_away_on_folded_repeats_is_the_give_away_on_their_copies(
            segments in proptest::collection::vec((1u64..5, 0u64..12, proptest::prop_oneof![proptest::strategy::Just(1u64), 2u64..40]), 0..30),
            cuts in proptest::collection::vec((0u64..16, 1u64..5, 0u64..64), 0..4),
        ) {
            let (folded, expanded) = folded_and_expanded(&segments);
            // Disjoint conversions inside the FIRST run 0..16, sorted.
            let mut conv: Vec<Conversion> = Vec::new();
            let mut at = 0;
            for (gap, count, owner_start) in cuts {
                let start = at + gap % 4;
                if start + count > 16 {
                    break;
                }
                let region = Region { digest: Digest(u128::from(start)), node: NodeId::new(0, start), start, count, bytes: count * 64 };
                conv.push(Conversion { region, owner: 1, owner_start });
                at = start + count;
            }
            let (mut f, mut e) = (folded.clone(), expanded.clone());
            apply(&mut f, &conv);
            apply(&mut e, &conv);
            proptest::prop_assert_eq!(crate::format::encode_meta(&f), crate::format::encode_meta(&e));
            let runs = f.shift.len();
            f.expand_repeats();
            f.coalesce();
            proptest::prop_assert_eq!(&f.shift, &e.shift);
            proptest::prop_assert!(runs <= 3 * (folded.shift.len() + 1) + 16 * 40 * conv.len());
        }
    }
}
