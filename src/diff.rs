//! The in-memory result of de-duplicating one version: which chunk ranges
//! are stored here (FIRST runs), which point at bytes stored elsewhere (SHIFT
//! runs), and how the table is encoded. FIXED chunks appear nowhere.

use crate::hash::Digest;
use crate::hash::HashAlgo;
use crate::layout::Layout;
use crate::method::Method;
use rayon::prelude::*;

/// A run of chunks whose bytes this version stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FirstRun {
    /// First chunk.
    pub start: u64,
    /// Number of chunks.
    pub count: u64,
}

/// A run of chunks whose bytes are stored as FIRST data elsewhere:
/// chunks `[src_start, src_start + count)` of `(src_version, src_rank)`, or,
/// for a repeat (`period` p > 0), the source range `[src_start, src_start +
/// p)` taken again every p chunks, the last copy cut short.
///
/// Repeats are how a device writes a repeated Merkle node (and how the file
/// stores runs of one repeated source range, format v3). Decoded files give
/// plain runs only ([`crate::format::decode_meta`]); a diff decoded for the
/// collective step keeps them folded ([`crate::format::decode_meta_folded`]),
/// so that describing, giving away and re-encoding a version cost in
/// proportion to its entries, not to the chunks a repeat covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShiftRun {
    /// First chunk in this version.
    pub start: u64,
    /// Number of chunks.
    pub count: u64,
    /// Version whose file holds the bytes.
    pub src_version: u64,
    /// Rank whose file holds the bytes.
    pub src_rank: u32,
    /// First chunk of the source range, in the source's chunk numbering.
    pub src_start: u64,
    /// `Some(digest of the region)` when this run is a collective cross-rank
    /// reference: the region's owner (`src_rank`, same version) stores the
    /// bytes for every rank that holds them (format v2). `verify` rehashes
    /// the owner's bytes against it.
    pub reference: Option<Digest>,
    /// 0 for a plain run; p > 0: a repeat of a source range of p chunks
    /// (never a reference; `count` > p).
    pub period: u64,
}

/// How the FIRST runs are written to the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionEncoding {
    /// A table of `(start, count)` entries.
    Table,
    /// A bitmap of one bit per chunk (the Basic method).
    Bitmap,
}

/// Per-version chunk statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ChunkCounts {
    /// Chunks stored in this version.
    pub first: u64,
    /// Chunks pointing at bytes stored elsewhere.
    pub shift: u64,
    /// Chunks unchanged since the previous version.
    pub fixed: u64,
}

/// One version's de-duplicated description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diff {
    /// Version number.
    pub version: u64,
    /// Rank that took it.
    pub rank: u32,
    /// Chunking of the protected buffer.
    pub layout: Layout,
    /// Digest algorithm of the record.
    pub hash: HashAlgo,
    /// Method that produced it.
    pub method: Method,
    /// A baseline references no earlier version.
    pub baseline: bool,
    /// Stored in full because most chunks changed (see
    /// [`crate::dedup::is_dense`]): a baseline that adds nothing to the record.
    pub dense: bool,
    /// Stored runs, sorted by `start`, disjoint.
    pub first: Vec<FirstRun>,
    /// Referencing runs, sorted by `start`, disjoint from each other and from `first`.
    pub shift: Vec<ShiftRun>,
    /// How `first` is encoded.
    pub encoding: RegionEncoding,
}

impl Diff {
    /// Chunk counts by label.
    pub fn counts(&self) -> ChunkCounts {
        let first: u64 = self.first.iter().map(|r| r.count).sum();
        let shift: u64 = self.shift.iter().map(|r| r.count).sum();
        ChunkCounts { first, shift, fixed: self.layout.chunks() - first - shift }
    }

    /// Bytes of FIRST data this version stores.
    pub fn data_bytes(&self) -> u64 {
        self.first.iter().map(|r| self.run_bytes(r.start, r.count)).sum()
    }

    fn run_bytes(&self, start: u64, count: u64) -> u64 {
        let b = self.layout.chunk_bytes(start..start + count);
        b.end - b.start
    }

    /// Copies the FIRST runs' bytes from `data` into `out` (which must be
    /// `data_bytes()` long), in run order, in parallel.
    pub fn gather_into(&self, data: &[u8], out: &mut [u8]) {
        const PIECE: u64 = 1 << 20;
        let mut pieces: Vec<(usize, usize)> = Vec::new(); // (src offset, len)
        for r in &self.first {
            let b = self.layout.chunk_bytes(r.start..r.start + r.count);
            let mut at = b.start;
            while at < b.end {
                let len = (b.end - at).min(PIECE);
                pieces.push((at as usize, len as usize));
                at += len;
            }
        }
        let mut slices: Vec<(&mut [u8], usize)> = Vec::with_capacity(pieces.len());
        let mut rest = out;
        for &(src, len) in &pieces {
            let (head, tail) = rest.split_at_mut(len);
            slices.push((head, src));
            rest = tail;
        }
        slices.into_par_iter().with_min_len(16).for_each(|(dst, src)| dst.copy_from_slice(&data[src..src + dst.len()]));
    }

    /// Merges adjacent FIRST runs, and adjacent SHIFT runs whose sources are
    /// contiguous in the same file (never collective references, whose
    /// digest covers exactly one region). Keeps the stored bytes identical.
    pub fn coalesce(&mut self) {
        self.first.dedup_by(|next, prev| {
            if prev.start + prev.count == next.start {
                prev.count += next.count;
                true
            } else {
                false
            }
        });
        coalesce_shift(&mut self.shift);
    }
}

/// Merges each SHIFT run of `runs` (sorted) into the one before it where it
/// continues it ([`ShiftRun::extended_by`]): [`Diff::coalesce`]'s SHIFT half.
/// Repeats take part copy by copy: a repeat's first copy may continue the
/// run before it and its last copy may be continued by the run after it,
/// exactly as if it were expanded into plain runs, while its middle copies
/// stay one repeat (no copy of a repeat continues the one before it). So
/// the result, expanded, is the expanded runs coalesced, in time
/// proportional to the entries.
pub fn coalesce_shift(runs: &mut Vec<ShiftRun>) {
    if !runs.iter().any(|r| r.period > 0) {
        runs.dedup_by(|next, prev| {
            let merge = prev.extended_by(next);
            if merge {
                prev.count += next.count;
            }
            merge
        });
        return;
    }
    let mut out: Vec<ShiftRun> = Vec::with_capacity(runs.len() + 2);
    let push_plain = |out: &mut Vec<ShiftRun>, r: ShiftRun| match out.last_mut() {
        Some(prev) if prev.extended_by(&r) => prev.count += r.count,
        _ => out.push(r),
    };
    for r in runs.drain(..) {
        if r.period == 0 || r.count <= r.period {
            push_plain(&mut out, ShiftRun { period: 0, ..r });
            continue;
        }
        let p = r.period;
        let copies = r.count.div_ceil(p);
        push_plain(&mut out, ShiftRun { count: p, period: 0, ..r });
        match copies - 2 {
            0 => {}
            1 => out.push(ShiftRun { start: r.start + p, count: p, period: 0, ..r }),
            middle => out.push(ShiftRun { start: r.start + p, count: middle * p, ..r }),
        }
        let last = r.start + (copies - 1) * p;
        push_plain(&mut out, ShiftRun { start: last, count: r.start + r.count - last, period: 0, ..r });
    }
    *runs = out;
}

impl ShiftRun {
    /// Whether `next` continues this run: it starts where this one ends and
    /// takes its bytes from where this one's source ends, in the same file
    /// (never a collective reference). [`Diff::coalesce`]'s rule.
    pub fn extended_by(&self, next: &ShiftRun) -> bool {
        self.start + self.count == next.start
            && self.src_version == next.src_version
            && self.src_rank == next.src_rank
            && self.src_start + self.count == next.src_start
            && self.reference.is_none()
            && next.reference.is_none()
            && self.period == 0
            && next.period == 0
    }

    /// Chunks of the source range one copy takes: `count` for a plain run,
    /// the period for a repeat.
    pub fn source_count(&self) -> u64 {
        match self.period {
            0 => self.count,
            p => p.min(self.count),
        }
    }

    /// The plain runs this run stands for, pushed onto `out` (itself for a
    /// plain run; one per copy for a repeat).
    pub fn expand_into(&self, out: &mut Vec<ShiftRun>) {
        let p = match self.period {
            0 => self.count,
            p => p,
        };
        let mut at = 0;
        while at < self.count {
            let count = p.min(self.count - at);
            out.push(ShiftRun { start: self.start + at, count, period: 0, ..*self });
            at += count;
        }
    }
}

impl Diff {
    /// The same diff with every repeat expanded into plain runs (what a
    /// decoded file holds).
    pub fn expand_repeats(&mut self) {
        if self.shift.iter().any(|s| s.period > 0) {
            let mut out = Vec::with_capacity(self.shift.len());
            for s in &self.shift {
                s.expand_into(&mut out);
            }
            self.shift = out;
        }
    }
}
