//! A resolved version's bytes: its sources mapped to byte copies per file
//! (the plan), then every file's blocks read once, verified, and copied into
//! place (the fill).
//!
//! The plan maps all the sources in one parallel pass (each part of the
//! list sorted into its files, then each file's parts joined in order); the
//! fill reads one file at a time, its windows in parallel.

use super::{Catalog, Source, owner_reader};
use crate::format::diff_file::DiffReader;
use crate::layout::Layout;
use crate::{Error, Result};
use rayon::prelude::*;
use std::collections::{HashMap, HashSet};
use std::ops::Range;

/// Sources one task of the plan maps.
const PLAN_SOURCES: usize = 1 << 14;

/// Largest read, in blocks.
const MAX_READ_BLOCKS: u64 = 256;

/// One byte copy: `len` bytes at `data_off` of a file's FIRST data go to `dst_off`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Copy {
    data_off: u64,
    len: u64,
    dst_off: u64,
}

/// The byte copies of one file, sorted by source offset.
#[derive(Debug)]
struct FileCopies {
    key: (u32, u64),
    copies: Vec<Copy>,
}

/// Byte copies per file, the files in `(rank, version)` order.
#[derive(Debug, Default)]
pub(super) struct CopyPlan {
    files: Vec<FileCopies>,
}

/// Bytes read, time reading, and time verifying and copying, accumulated.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct IoTimes {
    pub(super) bytes: u64,
    pub(super) read: f64,
    pub(super) copy: f64,
}

/// The distinct files `(rank, version)` of `sources`, sorted.
fn distinct_files(sources: &[Source]) -> Vec<(u32, u64)> {
    let seen = sources
        .par_chunks(PLAN_SOURCES)
        .map(|part| {
            // Sources come in stretches of one file: look up only changes.
            let (mut seen, mut last) = (HashSet::new(), None);
            for s in part {
                if last != Some((s.rank, s.version)) {
                    last = Some((s.rank, s.version));
                    seen.insert((s.rank, s.version));
                }
            }
            seen
        })
        .reduce(HashSet::new, |mut a, b| {
            a.extend(b);
            a
        });
    let mut keys: Vec<(u32, u64)> = seen.into_iter().collect();
    keys.sort_unstable();
    keys
}

/// Checks that every source points at stored bytes of the right length and
/// maps it to byte copies per file; destinations are `dst_base` bytes lower
/// than the sources' (a range restore fills a buffer starting there).
pub(super) fn plan_copies(
    catalog: &mut Catalog,
    rank: u32,
    layout: &Layout,
    sources: &[Source],
    dst_base: u64,
) -> Result<CopyPlan> {
    let keys = distinct_files(sources);
    for &(owner, version) in &keys {
        owner_reader(catalog, rank, owner, version)?;
    }
    let catalog: &Catalog = catalog;
    let readers: Vec<&DiffReader> = keys
        .iter()
        .map(|&(r, v)| catalog.loaded(r, v).ok_or_else(|| Error::Internal(format!("reader of rank {r} version {v}"))))
        .collect::<Result<_>>()?;
    let index: HashMap<(u32, u64), usize> = keys.iter().enumerate().map(|(i, k)| (*k, i)).collect();
    // Each part of the sources mapped into its files' copies, in order.
    let parts: Vec<Vec<Vec<Copy>>> = sources
        .par_chunks(PLAN_SOURCES)
        .map(|part| {
            let mut copies: Vec<Vec<Copy>> = keys.iter().map(|_| Vec::new()).collect();
            let mut near = vec![0usize; keys.len()];
            let mut last: Option<((u32, u64), usize)> = None;
            for s in part {
                let key = (s.rank, s.version);
                let i = match last {
                    Some((k, i)) if k == key => i,
                    _ => {
                        let i = index[&key];
                        last = Some((key, i));
                        i
                    }
                };
                plan_source(readers[i], layout, s, dst_base, &mut near[i], &mut copies[i])?;
            }
            Ok(copies)
        })
        .collect::<Result<_>>()?;
    let files = keys
        .par_iter()
        .enumerate()
        .map(|(i, &key)| {
            let mut copies: Vec<Copy> = Vec::with_capacity(parts.iter().map(|p| p[i].len()).sum());
            for p in &parts {
                copies.extend_from_slice(&p[i]);
            }
            // In destination order now; mostly in source order already.
            if !copies.is_sorted_by_key(|c| c.data_off) {
                copies.par_sort_unstable_by_key(|c| c.data_off);
            }
            FileCopies { key, copies }
        })
        .collect();
    crate::memory::drop_later(parts);
    Ok(CopyPlan { files })
}

/// The byte copies of one source out of `reader`'s data, checking that the
/// source's chunks hold exactly the bytes the destination needs; `near`:
/// the FIRST run the previous source ended in (sources of a file come in
/// destination order, mostly in source order too).
fn plan_source(
    reader: &DiffReader,
    layout: &Layout,
    s: &Source,
    dst_base: u64,
    near: &mut usize,
    copies: &mut Vec<Copy>,
) -> Result<()> {
    let src_layout = reader.diff.layout;
    let dst_bytes = layout.chunk_bytes(s.dst..s.dst + s.count);
    let end = s.src.checked_add(s.count).filter(|&e| e <= src_layout.chunks());
    let src_bytes = end.map(|e| src_layout.chunk_bytes(s.src..e));
    if src_bytes.as_ref().is_none_or(|b| b.end - b.start != dst_bytes.end - dst_bytes.start)
        || dst_bytes.start < dst_base
    {
        return Err(Error::BrokenReference {
            path: reader.path().to_path_buf(),
            reason: format!(
                "chunks {}..+{} do not match the {} bytes they must restore",
                s.src,
                s.count,
                dst_bytes.end - dst_bytes.start
            ),
        });
    }
    let mut dst = dst_bytes.start - dst_base;
    reader.locate_each_near(s.src..s.src + s.count, near, |data_off, len| {
        copies.push(Copy { data_off, len, dst_off: dst });
        dst += len;
    })
}

/// Copies every planned byte into `out`, file by file; returns the data
/// bytes read.
pub(super) fn fill(catalog: &mut Catalog, plan: CopyPlan, out: &mut [u8]) -> Result<IoTimes> {
    let mut io = IoTimes::default();
    for f in plan.files {
        let reader = catalog.reader(f.key.0, f.key.1)?;
        let t = copy_from_file(reader, &f.copies, out)?;
        (io.bytes, io.read, io.copy) = (io.bytes + t.bytes, io.read + t.read, io.copy + t.copy);
        crate::memory::drop_later(f.copies);
    }
    Ok(io)
}

/// Copies `copies` (sorted by source offset) out of `reader`'s data into
/// `out`, reading each block they touch once (at most [`MAX_READ_BLOCKS`]
/// at a time), verifying it and copying its pieces while it is in cache
/// ([`DiffReader::for_each_verified_block`]; no copy of the file first
/// where it lives in memory).
///
/// The windows are read in parallel (one core's read of the page cache
/// would be the restore's slowest stage): every piece's destination is cut
/// out of `out` once, up front, so each window owns its own (the plan's
/// destinations are disjoint; [`destinations`] checks). Read and copy
/// times are summed over the windows.
fn copy_from_file(reader: &DiffReader, copies: &[Copy], out: &mut [u8]) -> Result<IoTimes> {
    let bs = u64::from(reader.header.block_size);
    let (spans, mut pieces) = pieces_of(bs, copies);
    let Some(last_block) = spans.last().map(|s| s.end) else { return Ok(IoTimes::default()) };
    let mut work = destinations(&mut pieces, out, last_block as usize)?.into_iter();
    // The read windows, each with its blocks' jobs.
    let mut windows: Vec<(Range<u64>, Vec<BlockJobs<'_>>)> = Vec::new();
    let mut at = 0u64;
    for span in spans {
        work.by_ref().take((span.start - at) as usize).for_each(drop);
        let mut b = span.start;
        while b < span.end {
            let e = (b + MAX_READ_BLOCKS).min(span.end);
            windows.push((b..e, work.by_ref().take((e - b) as usize).collect()));
            b = e;
        }
        at = span.end;
    }
    let data_bytes = reader.header.data_bytes;
    let times: Vec<(f64, f64, u64)> = windows
        .into_par_iter()
        .map_init(Vec::new, |buf, (blocks, jobs)| {
            let started = std::time::Instant::now();
            let bytes = (blocks.end * bs).min(data_bytes) - blocks.start * bs;
            let read = reader.for_each_verified_block(blocks, buf, jobs, |block, jobs| {
                for (at, dst) in jobs {
                    dst.copy_from_slice(&block[at..at + dst.len()]);
                }
            })?;
            Ok((read.as_secs_f64(), started.elapsed().saturating_sub(read).as_secs_f64(), bytes))
        })
        .collect::<Result<_>>()?;
    Ok(times.into_iter().fold(IoTimes::default(), |io, (read, copy, bytes)| IoTimes {
        bytes: io.bytes + bytes,
        read: io.read + read,
        copy: io.copy + copy,
    }))
}

/// The blocks (of `bs` bytes) that `copies` (sorted by source offset) touch,
/// as a union of spans in order, and every copy cut at block boundaries.
fn pieces_of(bs: u64, copies: &[Copy]) -> (Vec<Range<u64>>, Vec<Piece>) {
    let mut spans: Vec<Range<u64>> = Vec::new();
    let mut pieces: Vec<Piece> = Vec::with_capacity(copies.len());
    for c in copies {
        let b = (c.data_off / bs)..(c.data_off + c.len).div_ceil(bs);
        match spans.last_mut() {
            Some(last) if b.start <= last.end => last.end = last.end.max(b.end),
            _ => spans.push(b),
        }
        let mut from = c.data_off;
        let to = c.data_off + c.len;
        while from < to {
            let block = from / bs;
            let cut = to.min((block + 1) * bs);
            pieces.push(Piece {
                block: block as usize,
                at: (from - block * bs) as usize,
                dst: c.dst_off + (from - c.data_off),
                len: (cut - from) as usize,
            });
            from = cut;
        }
    }
    (spans, pieces)
}

/// A piece of a read window: `len` bytes at `at` of its file's block
/// `block` go to `dst`.
#[derive(Clone, Copy)]
struct Piece {
    block: usize,
    at: usize,
    dst: u64,
    len: usize,
}

/// One block's copies: `(offset in the block, destination)`.
type BlockJobs<'o> = Vec<(usize, &'o mut [u8])>;

/// The pieces' destinations cut out of `out` (they are disjoint), grouped
/// by their block: `(offset in the block, destination)` per block.
fn destinations<'o>(pieces: &mut [Piece], out: &'o mut [u8], blocks: usize) -> Result<Vec<BlockJobs<'o>>> {
    if !pieces.is_sorted_by_key(|p| p.dst) {
        pieces.par_sort_unstable_by_key(|p| p.dst);
    }
    let mut work: Vec<BlockJobs<'o>> = (0..blocks).map(|_| Vec::new()).collect();
    let mut rest: &mut [u8] = out;
    let mut base = 0u64;
    for p in pieces.iter() {
        let skip = p.dst.checked_sub(base).and_then(|k| usize::try_from(k).ok());
        let fits = skip.filter(|&k| k.checked_add(p.len).is_some_and(|n| n <= rest.len()));
        let (Some(skip), Some(slot)) = (fits, work.get_mut(p.block)) else {
            return Err(Error::Internal(format!("restore piece at {} overlaps another or the end", p.dst)));
        };
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(skip);
        let (piece, tail) = tail.split_at_mut(p.len);
        slot.push((p.at, piece));
        rest = tail;
        base = p.dst + p.len as u64;
    }
    Ok(work)
}
