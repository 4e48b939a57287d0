//! A resolved version's bytes: its sources mapped to byte copies per file
//! (the plan), then every file's blocks read once, verified, and copied into
//! place (the fill).
//!
//! The plan maps all the sources in one parallel pass (each part of the
//! list sorted into its files, then each file's parts joined in order). The
//! fill takes one file at a time: where its copies go to the output in the
//! order they are read, parts of them cut their own destinations and read
//! their own blocks in parallel ([`copy_in_order`]); otherwise the pieces'
//! destinations are cut in parallel and sorted into block order first
//! ([`copy_from_file`]).

use super::{Catalog, Source, owner_reader};
use crate::error::{Error, Result};
use crate::format::diff_file::DiffReader;
use crate::layout::Layout;
use rayon::prelude::*;
use std::collections::{HashMap, HashSet};
use std::ops::Range;

/// Sources one task of the plan maps.
const PLAN_SOURCES: usize = 1 << 14;

/// Largest read, in blocks: 1 MiB, so that a window's blocks are still in
/// the core's cache when they are verified and copied (a 16 MiB window
/// went through memory three times; its fill took 12% longer).
const MAX_READ_BLOCKS: u64 = 16;

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
    /// Seconds cutting `out` among the copies before the parallel reads
    /// (the cut of copies in destination order is part of `copy`).
    pub(super) cut: f64,
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
    catalog.preload_files(&keys);
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
        let in_order = f.copies.par_windows(2).all(|w| w[0].dst_off + w[0].len <= w[1].dst_off);
        let t = match in_order {
            true => copy_in_order(reader, &f.copies, out)?,
            false => copy_from_file(reader, &f.copies, out)?,
        };
        (io.bytes, io.read, io.copy, io.cut) = (io.bytes + t.bytes, io.read + t.read, io.copy + t.copy, io.cut + t.cut);
        crate::memory::drop_later(f.copies);
    }
    Ok(io)
}

/// [`copy_from_file`] of copies whose destinations are in the same order
/// as their sources (and disjoint), as a version's own FIRST data and its
/// chain's mostly are: the copies are split into parts, `out` at each
/// part's first destination, and each part, in parallel, cuts its pieces'
/// destinations and reads its blocks (no list of every piece is made: at
/// 4 GiB those lists and their page faults took 400 ms). A block two
/// neighbouring parts need is read by both.
fn copy_in_order(reader: &DiffReader, copies: &[Copy], out: &mut [u8]) -> Result<IoTimes> {
    let cutting = std::time::Instant::now();
    let beyond = |c: &Copy| Error::Internal(format!("restore copy to {} ends past the buffer", c.dst_off));
    let mut parts: Vec<(&[Copy], u64, &mut [u8])> = Vec::with_capacity(copies.len().div_ceil(CUT_COPIES));
    let (mut rest, mut base): (&mut [u8], u64) = (out, 0);
    for part in copies.chunks(CUT_COPIES) {
        let (first, last) = (&part[0], &part[part.len() - 1]);
        let skip = usize::try_from(first.dst_off - base).ok().filter(|&n| n <= rest.len());
        let Some(skip) = skip else { return Err(beyond(first)) };
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(skip);
        let len = usize::try_from(last.dst_off + last.len - first.dst_off).ok().filter(|&n| n <= tail.len());
        let Some(len) = len else { return Err(beyond(last)) };
        let (mine, tail) = tail.split_at_mut(len);
        parts.push((part, first.dst_off, mine));
        (rest, base) = (tail, last.dst_off + last.len);
    }
    let cut = cutting.elapsed().as_secs_f64();
    let bs = u64::from(reader.header.block_size);
    let data_bytes = reader.header.data_bytes;
    let times: Vec<(f64, f64, u64)> = parts
        .into_par_iter()
        .map(|(part, start, mut slice)| {
            let started = std::time::Instant::now();
            // The part's pieces, cut at block boundaries, in block order.
            let mut jobs: Vec<Job<'_>> = Vec::with_capacity(part.len() + part.len() / 4);
            let mut base = start;
            for c in part {
                for_each_piece(c, bs, |p| {
                    let (_, tail) = std::mem::take(&mut slice).split_at_mut((p.dst - base) as usize);
                    let (dst, tail) = tail.split_at_mut(p.len);
                    jobs.push(Job { block: p.block, at: p.at, dst });
                    (slice, base) = (tail, p.dst + p.len as u64);
                });
            }
            // Copies are in source order, but one that starts at the same
            // offset as a shorter one after it (a shifted duplicate of
            // part of it) reaches further: put the pieces in block order.
            if !jobs.is_sorted_by_key(|j| j.block) {
                jobs.sort_by_key(|j| j.block);
            }
            // Windows of consecutive blocks, at most MAX_READ_BLOCKS each.
            let (mut read, mut bytes, mut buf) = (std::time::Duration::ZERO, 0u64, Vec::new());
            let mut rest: &mut [Job<'_>] = &mut jobs;
            while let Some(b0) = rest.first().map(|j| j.block) {
                let (mut n, mut last) = (1, b0);
                while n < rest.len() && rest[n].block <= last + 1 && rest[n].block < b0 + MAX_READ_BLOCKS {
                    last = rest[n].block;
                    n += 1;
                }
                let (window, tail) = std::mem::take(&mut rest).split_at_mut(n);
                rest = tail;
                bytes += ((last + 1) * bs).min(data_bytes) - b0 * bs;
                read += read_window(reader, b0..last + 1, &mut buf, window)?;
            }
            Ok((read.as_secs_f64(), started.elapsed().saturating_sub(read).as_secs_f64(), bytes))
        })
        .collect::<Result<_>>()?;
    Ok(summed(cut, times))
}

/// Copies `copies` (sorted by source offset) out of `reader`'s data into
/// `out`, reading each block they touch once (at most [`MAX_READ_BLOCKS`]
/// at a time), verifying it and copying its pieces while it is in cache
/// ([`DiffReader::for_each_verified_block`]; no copy of the file first
/// where it lives in memory).
///
/// The windows are read in parallel (one core's read of the page cache
/// would be the restore's slowest stage): every piece's destination is cut
/// out of `out` up front, so each window owns its own (the plan's
/// destinations are disjoint; [`cut_destinations`] checks). The cut runs on
/// every core too. Read and copy times are summed over the windows.
fn copy_from_file(reader: &DiffReader, copies: &[Copy], out: &mut [u8]) -> Result<IoTimes> {
    let cutting = std::time::Instant::now();
    let bs = u64::from(reader.header.block_size);
    let (spans, pieces) = pieces_of(bs, copies);
    if spans.is_empty() {
        return Ok(IoTimes::default());
    }
    let mut jobs = cut_destinations(pieces, out)?;
    // The read windows, each with its blocks' jobs (in block order: the
    // jobs are, as the copies were).
    let mut windows: Vec<(Range<u64>, &mut [Job<'_>])> = Vec::new();
    let mut rest: &mut [Job<'_>] = &mut jobs;
    for span in spans {
        let mut b = span.start;
        while b < span.end {
            let e = (b + MAX_READ_BLOCKS).min(span.end);
            let n = rest.partition_point(|j| j.block < e);
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(n);
            windows.push((b..e, mine));
            rest = tail;
            b = e;
        }
    }
    let cut = cutting.elapsed().as_secs_f64();
    let data_bytes = reader.header.data_bytes;
    let times: Vec<(f64, f64, u64)> = windows
        .into_par_iter()
        .map_init(Vec::new, |buf, (blocks, jobs)| {
            let started = std::time::Instant::now();
            let bytes = (blocks.end * bs).min(data_bytes) - blocks.start * bs;
            let read = read_window(reader, blocks, buf, jobs)?;
            Ok((read.as_secs_f64(), started.elapsed().saturating_sub(read).as_secs_f64(), bytes))
        })
        .collect::<Result<_>>()?;
    Ok(summed(cut, times))
}

/// Reads, verifies and copies window `blocks` of `reader` (its jobs, in
/// block order, in `jobs`) through `buf`; returns the time spent reading.
fn read_window(
    reader: &DiffReader,
    blocks: Range<u64>,
    buf: &mut Vec<u8>,
    mut jobs: &mut [Job<'_>],
) -> Result<std::time::Duration> {
    // One slice of jobs per block of the window.
    let mut per_block: Vec<&mut [Job<'_>]> = Vec::with_capacity((blocks.end - blocks.start) as usize);
    for b in blocks.clone() {
        let n = jobs.partition_point(|j| j.block <= b);
        let (mine, tail) = std::mem::take(&mut jobs).split_at_mut(n);
        per_block.push(mine);
        jobs = tail;
    }
    reader.for_each_verified_block(blocks, buf, per_block, |block, jobs| {
        for j in jobs.iter_mut() {
            j.dst.copy_from_slice(&block[j.at..j.at + j.dst.len()]);
        }
    })
}

/// The windows' `(read, copy, bytes)` summed, after a cut of `cut` seconds.
fn summed(cut: f64, times: Vec<(f64, f64, u64)>) -> IoTimes {
    times.into_iter().fold(IoTimes { cut, ..IoTimes::default() }, |io, (read, copy, bytes)| IoTimes {
        bytes: io.bytes + bytes,
        read: io.read + read,
        copy: io.copy + copy,
        cut: io.cut,
    })
}

/// Copies one task of the cut handles.
const CUT_COPIES: usize = 1 << 14;

/// The blocks (of `bs` bytes) that `copies` (sorted by source offset) touch,
/// as a union of spans in order, and every copy cut at block boundaries (in
/// block order), on every core.
fn pieces_of(bs: u64, copies: &[Copy]) -> (Vec<Range<u64>>, Vec<Piece>) {
    let parts: Vec<(Vec<Range<u64>>, Vec<Piece>)> = copies
        .par_chunks(CUT_COPIES)
        .map(|copies| {
            let mut spans: Vec<Range<u64>> = Vec::new();
            let mut pieces: Vec<Piece> = Vec::with_capacity(copies.len());
            for c in copies {
                add_span(&mut spans, (c.data_off / bs)..(c.data_off + c.len).div_ceil(bs));
                for_each_piece(c, bs, |p| pieces.push(p));
            }
            (spans, pieces)
        })
        .collect();
    let mut spans: Vec<Range<u64>> = Vec::new();
    for b in parts.iter().flat_map(|p| &p.0) {
        add_span(&mut spans, b.clone());
    }
    let mut pieces = Vec::with_capacity(parts.iter().map(|p| p.1.len()).sum());
    for (_, p) in parts {
        pieces.extend(p);
    }
    (spans, pieces)
}

/// Adds blocks `b` (starting at or after the last span's start) to the
/// union `spans`.
fn add_span(spans: &mut Vec<Range<u64>>, b: Range<u64>) {
    match spans.last_mut() {
        Some(last) if b.start <= last.end => last.end = last.end.max(b.end),
        _ => spans.push(b),
    }
}

/// Calls `f` with each piece of copy `c`, cut at block (`bs` bytes)
/// boundaries, in order.
fn for_each_piece(c: &Copy, bs: u64, mut f: impl FnMut(Piece)) {
    let (mut from, to) = (c.data_off, c.data_off + c.len);
    while from < to {
        let block = from / bs;
        let cut = to.min((block + 1) * bs);
        f(Piece {
            block,
            at: (from - block * bs) as usize,
            dst: c.dst_off + (from - c.data_off),
            len: (cut - from) as usize,
        });
        from = cut;
    }
}

/// A piece of a read window: `len` bytes at `at` of its file's block
/// `block` go to `dst`.
#[derive(Clone, Copy)]
struct Piece {
    block: u64,
    at: usize,
    dst: u64,
    len: usize,
}

/// A piece with its destination cut out of the output.
struct Job<'o> {
    block: u64,
    at: usize,
    dst: &'o mut [u8],
}

/// The pieces (in source order) with their destinations cut out of `out`,
/// in block order; an error if two overlap or one ends past `out`.
///
/// The pieces are ordered by destination (an index sort, skipped where
/// block order is destination order, as it mostly is), that order is cut
/// into one part per task, `out` is split at the parts' first
/// destinations, and each part cuts its own slice, all in parallel.
fn cut_destinations(pieces: Vec<Piece>, out: &mut [u8]) -> Result<Vec<Job<'_>>> {
    let in_order = pieces.par_windows(2).all(|w| w[0].dst < w[1].dst);
    let order: Option<Vec<usize>> = (!in_order).then(|| {
        let mut order: Vec<usize> = (0..pieces.len()).collect();
        order.par_sort_unstable_by_key(|&k| pieces[k].dst);
        order
    });
    let nth = |k: usize| match &order {
        Some(order) => pieces[order[k]],
        None => pieces[k],
    };
    let overlap = |p: &Piece| Error::Internal(format!("restore piece at {} overlaps another or the end", p.dst));
    // Parts of the destination order, and `out` split at their starts.
    let parts = pieces.len().div_ceil(CUT_COPIES).max(1);
    let mut slices: Vec<(usize, u64, &mut [u8])> = Vec::with_capacity(parts);
    let mut rest: &mut [u8] = out;
    let mut base = 0u64;
    for part in 0..parts {
        let k = part * CUT_COPIES;
        let start = if k < pieces.len() { nth(k).dst } else { base };
        let skip = start.checked_sub(base).and_then(|n| usize::try_from(n).ok()).filter(|&n| n <= rest.len());
        let Some(skip) = skip else { return Err(overlap(&nth(k))) };
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(skip);
        let end = if k + CUT_COPIES < pieces.len() { nth(k + CUT_COPIES).dst } else { start + tail.len() as u64 };
        let len = end.checked_sub(start).and_then(|n| usize::try_from(n).ok()).filter(|&n| n <= tail.len());
        let Some(len) = len else { return Err(overlap(&nth(k))) };
        let (mine, tail) = tail.split_at_mut(len);
        slices.push((k, start, mine));
        rest = tail;
        base = end;
    }
    // Each part cuts its slice.
    let cut: Vec<Vec<Job<'_>>> = slices
        .into_par_iter()
        .map(|(first, start, mut rest)| {
            let mut jobs = Vec::with_capacity(CUT_COPIES);
            let mut base = start;
            for k in first..(first + CUT_COPIES).min(pieces.len()) {
                let p = nth(k);
                let skip = p.dst.checked_sub(base).and_then(|n| usize::try_from(n).ok());
                let Some(skip) = skip.filter(|&n| n.checked_add(p.len).is_some_and(|e| e <= rest.len())) else {
                    return Err(overlap(&p));
                };
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(skip);
                let (dst, tail) = tail.split_at_mut(p.len);
                jobs.push(Job { block: p.block, at: p.at, dst });
                rest = tail;
                base = p.dst + p.len as u64;
            }
            Ok(jobs)
        })
        .collect::<Result<_>>()?;
    let mut jobs: Vec<Job<'_>> = Vec::with_capacity(pieces.len());
    for part in cut {
        jobs.extend(part);
    }
    // Block order (pieces come in source order, which is not block order
    // where a copy reaches past a shorter one that starts where it does).
    if !jobs.is_sorted_by_key(|j| j.block) {
        jobs.par_sort_by_key(|j| j.block);
    }
    crate::memory::drop_later(pieces);
    Ok(jobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces of `len` bytes each, three to a block, whose destinations
    /// are `slots` (in units of `len`); every fourth piece comes from the
    /// block before (a copy reaching further than the next one). Each
    /// piece's `at` is its index, to find it again.
    fn pieces(slots: &[u64], len: usize) -> Vec<Piece> {
        let block = |k: usize| if k % 4 == 3 { (k as u64 - 3) / 3 } else { k as u64 / 3 };
        slots.iter().enumerate().map(|(k, &s)| Piece { block: block(k), at: k, dst: s * len as u64, len }).collect()
    }

    #[test]
    fn destinations_are_cut_in_block_order_whatever_their_order() {
        // More pieces than one part, destinations a permutation (a shifted
        // chunk's bytes land anywhere), and the same in order.
        let n = 3 * CUT_COPIES + 5;
        let shuffled: Vec<u64> = (0..n as u64).map(|k| (k * 7919) % n as u64).collect();
        let ordered: Vec<u64> = (0..n as u64).collect();
        for slots in [shuffled, ordered] {
            let mut out = vec![0u8; 2 * n];
            let jobs = cut_destinations(pieces(&slots, 2), &mut out).expect("disjoint");
            assert_eq!(jobs.len(), n);
            assert!(jobs.is_sorted_by_key(|j| j.block));
            for job in jobs {
                let k = job.at; // the piece's index, in this test
                assert_eq!(job.dst.len(), 2);
                job.dst.copy_from_slice(&[k as u8, (k >> 8) as u8]);
            }
            for (k, &s) in slots.iter().enumerate() {
                assert_eq!(&out[2 * s as usize..2 * s as usize + 2], &[k as u8, (k >> 8) as u8]);
            }
        }
    }

    #[test]
    fn overlapping_or_overlong_destinations_are_refused() {
        let mut out = vec![0u8; 64];
        assert!(cut_destinations(pieces(&[0, 1, 1, 2], 8), &mut out).is_err());
        assert!(cut_destinations(pieces(&[0, 8], 8), &mut out).is_err());
        let mut big = vec![0u8; 8 * (CUT_COPIES + 2)];
        let mut slots: Vec<u64> = (0..CUT_COPIES as u64 + 2).collect();
        slots[CUT_COPIES + 1] = 3; // overlaps a piece of the first part
        assert!(cut_destinations(pieces(&slots, 8), &mut big).is_err());
    }
}
