//! The diff file's tables: a diff's runs encoded (repeats folded into
//! repeat entries) and decoded (repeat entries expanded), with every
//! check a reader makes of them.

use super::super::codec::{Cursor, PutLe};
use super::header::*;
use crate::diff::{Diff, FirstRun, RegionEncoding, ShiftRun};
use crate::error::Result;
use crate::hash::Digest;
use crate::method::Method;

/// The header of `diff`'s file, its SHIFT runs folded (one pass over them).
pub(super) fn header_of(diff: &Diff) -> DiffHeader {
    let (entries, folds) = shift_entries(&diff.shift).fold((0u64, false), |(n, f), e| (n + 1, f || e.period > 0));
    header_with(diff, entries, folds)
}

/// The header of `diff`'s file with `shift_count` SHIFT entries: v3 where
/// some entries fold runs (`folds`), v2 otherwise.
pub(super) fn header_with(diff: &Diff, shift_count: u64, folds: bool) -> DiffHeader {
    let bitmap_len = match diff.encoding {
        RegionEncoding::Bitmap => diff.layout.chunks().div_ceil(8),
        RegionEncoding::Table => 0,
    };
    DiffHeader {
        method: diff.method,
        hash: diff.hash,
        baseline: diff.baseline,
        dense: diff.dense,
        rank: diff.rank,
        chunk_size: diff.layout.chunk_size(),
        version: diff.version,
        data_len: diff.layout.data_len(),
        first_count: if bitmap_len > 0 { 0 } else { diff.first.len() as u64 },
        shift_count,
        bitmap_len,
        data_bytes: diff.data_bytes(),
        block_size: BLOCK_SIZE,
        reference_count: diff.shift.iter().filter(|s| s.reference.is_some()).count() as u64,
        format_version: match folds {
            true => FORMAT_VERSION_REPEATS,
            false => FORMAT_VERSION,
        },
        compressed: None,
    }
}

/// One SHIFT table entry as stored: a run (`period` 0), or consecutive runs
/// of one source range folded into one (`period` chunks, repeated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ShiftEntry {
    run: ShiftRun,
    period: u64,
}

/// `shift`'s table entries: where two or more runs in a row take the same
/// source range (same rank, version and start, the same count `p`, each
/// starting where the one before ends; the last may be shorter), one repeat
/// entry of period `p` stands for them. Never for cross-rank references
/// (each carries its own region digest). A buffer of one repeated chunk, or
/// of one repeated page, so costs one entry where it cost one per copy.
/// Expanding the entries ([`expand_repeat`]) gives `shift` back exactly.
///
/// `shift` may hold repeats ([`ShiftRun::period`]): they are read copy by
/// copy, as if expanded, but a repeat's copies of the period being folded
/// are taken in one step, so the entries of a folded diff cost time in
/// proportion to its runs, not to its chunks, and are the same entries as
/// its expanded runs'.
pub(super) fn shift_entries(shift: &[ShiftRun]) -> impl Iterator<Item = ShiftEntry> + '_ {
    let mut runs = Copies { shift, next: 0, rest: None };
    std::iter::from_fn(move || {
        let first = runs.take_copy()?;
        let p = first.count;
        if first.reference.is_some() || p > MAX_PERIOD {
            return Some(ShiftEntry { run: first, period: 0 });
        }
        let mut total = p;
        while let Some(next) = runs.peek() {
            let copy = next.source_count();
            let repeats = next.reference.is_none()
                && next.start == first.start + total
                && (next.src_rank, next.src_version, next.src_start)
                    == (first.src_rank, first.src_version, first.src_start)
                && copy <= p;
            if !repeats {
                break;
            }
            if next.period == p {
                // Every full copy in one step, then a shorter last one, which ends the repeat.
                let full = next.count / p;
                total += next.count;
                runs.skip();
                if full * p < next.count {
                    break;
                }
                continue;
            }
            total += copy;
            let _ = runs.take_copy();
            if copy < p {
                break; // a shorter run ends the repeat
            }
        }
        Some(match total == p {
            true => ShiftEntry { run: first, period: 0 },
            false => ShiftEntry { run: ShiftRun { count: total, ..first }, period: p },
        })
    })
}

/// Runs read one copy at a time: a repeat's copies one by one (or all at
/// once, [`Copies::skip`]), a plain run whole.
struct Copies<'a> {
    shift: &'a [ShiftRun],
    next: usize,
    /// What is left of a repeat whose first copies were taken.
    rest: Option<ShiftRun>,
}

impl Copies<'_> {
    /// The next run or what is left of a repeat, not taken.
    fn peek(&self) -> Option<ShiftRun> {
        self.rest.or_else(|| self.shift.get(self.next).copied())
    }

    /// Takes what [`Copies::peek`] shows, whole.
    fn skip(&mut self) {
        if self.rest.take().is_none() {
            self.next += 1;
        }
    }

    /// Takes the next copy: a plain run whole, or a repeat's first copy
    /// (what is left of it stays).
    fn take_copy(&mut self) -> Option<ShiftRun> {
        let run = self.peek()?;
        self.skip();
        let copy = run.source_count();
        if run.period > 0 && copy < run.count {
            let left = run.count - copy;
            let period = if left > run.period { run.period } else { 0 };
            self.rest = Some(ShiftRun { start: run.start + copy, count: left, period, ..run });
        }
        Some(ShiftRun { count: copy, period: 0, ..run })
    }
}

/// The runs a repeat entry of `period` chunks stands for, pushed onto
/// `out`: its source range once per period, the last copy cut short.
pub(super) fn expand_repeat(entry: ShiftRun, period: u64, out: &mut Vec<ShiftRun>) {
    ShiftRun { period, ..entry }.expand_into(out);
}

/// Whether the SHIFT table of a device-made file's metadata (`meta`:
/// header, tables, bitmap) may differ from the encoder's: it holds a repeat
/// entry (a device writes one per repeat node, which the encoder may merge
/// with its neighbours), or runs the encoder would fold: two entries in a
/// row, neither flagged, the second starting where the first ends, with the
/// same source and no more chunks (any fold has such a pair, and any such
/// pair makes a fold). Reads the table in place, decoding nothing else.
pub fn runs_fold(meta: &[u8]) -> Result<bool, String> {
    let header = DiffHeader::decode(meta.get(..HEADER_LEN as usize).ok_or("metadata shorter than a header")?)?;
    if header.compressed.is_some() {
        return Err("a compressed file's tables are not read in place".into());
    }
    let entries = || format!("{} SHIFT entries past the metadata", header.shift_count);
    let at = HEADER_LEN.checked_add(header.first_count.checked_mul(FIRST_ENTRY_LEN).ok_or_else(entries)?);
    let len = header.shift_count.checked_mul(SHIFT_ENTRY_LEN);
    let table = at
        .zip(len)
        .and_then(|(at, len)| meta.get(usize::try_from(at).ok()?..usize::try_from(at.checked_add(len)?).ok()?))
        .ok_or_else(entries)?;
    let field = |e: &[u8], at: usize| le_u64(&e[at..at + 8]);
    let repeat = |e: &[u8]| u32::from_le_bytes([e[36], e[37], e[38], e[39]]) & SHIFT_FLAG_REPEAT != 0;
    if header.format_version >= FORMAT_VERSION_REPEATS && table.chunks_exact(SHIFT_ENTRY_LEN as usize).any(repeat) {
        return Ok(true);
    }
    let folds = table
        .chunks_exact(SHIFT_ENTRY_LEN as usize)
        .zip(table.chunks_exact(SHIFT_ENTRY_LEN as usize).skip(1))
        .any(|(a, b)| {
            a[32..40] == b[32..40] // source rank, then flags
                && a[36..40] == [0; 4]
                && field(b, 0) == field(a, 0) + field(a, 8)
                && field(b, 8) <= field(a, 8)
                && a[16..32] == b[16..32] // source start and version
        });
    Ok(folds)
}

/// Keeps `diff`'s runs of one repeated source range as the repeats its file
/// stores them as ([`ShiftRun::period`]): the same runs expanded, the same
/// file, but a version's later steps (the collective step's regions and
/// give-away, its encoding) cost its entries, not the copies. One pass.
pub fn fold_repeats(diff: &mut Diff) {
    let folded: Vec<ShiftRun> = shift_entries(&diff.shift).map(|e| ShiftRun { period: e.period, ..e.run }).collect();
    if folded.len() < diff.shift.len() {
        diff.shift = folded;
    }
}

/// How many SHIFT entries `diff`'s file stores (repeats folded): its SHIFT
/// regions as reported.
pub fn stored_shift_entries(diff: &Diff) -> u64 {
    shift_entries(&diff.shift).count() as u64
}

/// Serializes `diff` with its FIRST bytes gathered from `data` into one
/// buffer, block digests and trailer included: the whole file.
pub fn encode_diff(diff: &Diff, data: &[u8]) -> Vec<u8> {
    let body = encode_body(diff, data);
    let meta_end = body.len() - diff.data_bytes() as usize;
    finish_body(body, meta_end)
}

/// The part of a diff file a backend produces in one contiguous buffer:
/// header, tables, bitmap and FIRST data (no block digests, no trailer).
pub fn encode_body(diff: &Diff, data: &[u8]) -> Vec<u8> {
    let h = header_of(diff);
    let mut out = encode_meta(diff);
    let meta_end = out.len();
    out.resize(meta_end + h.data_bytes as usize, 0);
    diff.gather_into(data, &mut out[meta_end..]);
    out
}

/// The length of `diff`'s file: header, tables, FIRST data, block digests, trailer.
pub fn file_len_of(diff: &Diff) -> u64 {
    file_len_from(&header_of(diff))
}

/// The length of `diff`'s file with `shift_entries` SHIFT entries, as a
/// device writes it before the encoder's fold (every coalesced run of plain
/// roots an entry, and every repeat node: `dedup`'s `device_shift_entries`):
/// the bound on a device's output buffer is taken on this length, by both
/// backends alike, so that both store the same versions whole.
pub fn device_file_len(diff: &Diff, shift_entries: u64) -> u64 {
    file_len_from(&header_with(diff, shift_entries, shift_entries < diff.shift.len() as u64))
}

/// Header, tables and bitmap of `diff` (the body without its data).
pub fn encode_meta(diff: &Diff) -> Vec<u8> {
    let h = header_of(diff);
    let meta = (h.first_count * FIRST_ENTRY_LEN
        + h.shift_count * SHIFT_ENTRY_LEN
        + h.reference_count * REFERENCE_ENTRY_LEN
        + h.bitmap_len) as usize;
    let total = HEADER_LEN as usize + meta + h.data_bytes as usize;
    let blocks = h.blocks() as usize;
    let mut out = Vec::with_capacity(total + blocks * DIGEST_LEN as usize + DIGEST_LEN as usize);
    h.encode(&mut out);
    if h.bitmap_len == 0 {
        for r in &diff.first {
            out.put_u64(r.start);
            out.put_u64(r.count);
        }
    }
    for ShiftEntry { run: s, period } in shift_entries(&diff.shift) {
        out.put_u64(s.start);
        out.put_u64(s.count);
        out.put_u64(s.src_start);
        out.put_u64(s.src_version);
        out.put_u32(s.src_rank);
        out.put_u32(match (s.reference, period) {
            (Some(_), _) => SHIFT_FLAG_REFERENCE,
            (None, 0) => 0,
            // At most MAX_PERIOD: it fits the flags' upper bits.
            (None, p) => SHIFT_FLAG_REPEAT | ((p as u32) << PERIOD_SHIFT),
        });
    }
    for d in diff.shift.iter().filter_map(|s| s.reference) {
        out.extend_from_slice(&d.0.to_le_bytes());
    }
    if h.bitmap_len > 0 {
        let at = out.len();
        out.resize(at + h.bitmap_len as usize, 0);
        let bitmap = &mut out[at..];
        for r in &diff.first {
            for c in r.start..r.start + r.count {
                bitmap[(c / 8) as usize] |= 1 << (c % 8);
            }
        }
    }
    out
}

/// Parses a body produced by [`encode_body`] (or a GPU backend): its header,
/// tables, and where its data starts. Checks everything but digests.
pub fn decode_body(body: &[u8]) -> Result<(DiffHeader, Diff, usize), String> {
    if body.len() < HEADER_LEN as usize {
        return Err("body shorter than a header".into());
    }
    let header = DiffHeader::decode(&body[..HEADER_LEN as usize])?;
    let meta_len = header.meta_len(body.len() as u64)? as usize;
    let data_start = HEADER_LEN as usize + meta_len;
    if body.len() as u64 != data_start as u64 + header.data_bytes {
        return Err(format!(
            "body is {} bytes, its header describes {}",
            body.len(),
            data_start as u64 + header.data_bytes
        ));
    }
    let diff = decode_tables(&header, &body[HEADER_LEN as usize..data_start])?;
    Ok((header, diff, data_start))
}

/// Parses the metadata (header, tables, bitmap) of a body whose FIRST data
/// (`data_bytes` of it) is elsewhere (still on a device): the diff it
/// describes. Checks that `meta` is exactly what its header describes.
pub fn decode_meta(meta: &[u8], data_bytes: u64) -> Result<Diff, String> {
    decode_meta_with(meta, data_bytes, false)
}

/// [`decode_meta`] with the repeat entries kept as repeats
/// ([`ShiftRun::period`]) rather than expanded into one run per copy: the
/// same diff, expanded ([`Diff::expand_repeats`]), in time and memory that
/// follow the file's entries, not the chunks they cover. For the collective
/// step, which describes a device-made file, gives regions away and encodes
/// it again; restores and checks read files through [`decode_meta`].
pub fn decode_meta_folded(meta: &[u8], data_bytes: u64) -> Result<Diff, String> {
    decode_meta_with(meta, data_bytes, true)
}

fn decode_meta_with(meta: &[u8], data_bytes: u64, folded: bool) -> Result<Diff, String> {
    if meta.len() < HEADER_LEN as usize {
        return Err("metadata shorter than a header".into());
    }
    let header = DiffHeader::decode(&meta[..HEADER_LEN as usize])?;
    if header.compressed.is_some() {
        return Err("a compressed header where a body was made".into());
    }
    if header.data_bytes != data_bytes {
        return Err(format!("the header describes {} bytes of data, not {data_bytes}", header.data_bytes));
    }
    let meta_len = header.meta_len(meta.len() as u64)? as usize;
    if HEADER_LEN as usize + meta_len != meta.len() {
        return Err(format!(
            "metadata is {} bytes, its header describes {}",
            meta.len(),
            HEADER_LEN as usize + meta_len
        ));
    }
    let diff = decode_tables_with(&header, &meta[HEADER_LEN as usize..], folded)?;
    // The FIRST runs must cover the data exactly (what a reader checks).
    if diff.data_bytes() != data_bytes {
        return Err(format!("the FIRST runs cover {} bytes, the data is {data_bytes}", diff.data_bytes()));
    }
    Ok(diff)
}

pub(super) fn decode_tables(h: &DiffHeader, meta: &[u8]) -> Result<Diff, String> {
    decode_tables_with(h, meta, false)
}

/// The tables decoded, repeat entries expanded or (`folded`) kept.
fn decode_tables_with(h: &DiffHeader, meta: &[u8], folded: bool) -> Result<Diff, String> {
    let layout = h.layout()?;
    let n = layout.chunks();
    let mut c = Cursor::new(meta);
    // Each table taken whole (its length checked once), then decoded entry
    // by entry from fixed offsets.
    pub(super) fn table<'m>(c: &mut Cursor<'m>, count: u64, entry: u64, what: &str) -> Result<&'m [u8], String> {
        let len = count.checked_mul(entry).and_then(|n| usize::try_from(n).ok());
        c.take(len.ok_or_else(|| format!("{what} of {count} entries is too large"))?, what)
    }
    let mut first: Vec<FirstRun> = table(&mut c, h.first_count, FIRST_ENTRY_LEN, "FIRST table")?
        .chunks_exact(FIRST_ENTRY_LEN as usize)
        .map(|e| FirstRun { start: le_u64(&e[0..8]), count: le_u64(&e[8..16]) })
        .collect();
    let shift_table = table(&mut c, h.shift_count, SHIFT_ENTRY_LEN, "SHIFT table")?;
    let mut shift = Vec::with_capacity(h.shift_count as usize);
    let mut flagged = Vec::new();
    let mut expanded = false;
    // Runs the entries stand for, expanded (at most one per chunk).
    let mut runs = 0u64;
    let known_flags = match h.format_version {
        v if v >= FORMAT_VERSION_REPEATS => SHIFT_FLAG_REFERENCE | SHIFT_FLAG_REPEAT | !0 << PERIOD_SHIFT,
        _ => SHIFT_FLAG_REFERENCE,
    };
    for e in shift_table.chunks_exact(SHIFT_ENTRY_LEN as usize) {
        let s = ShiftRun {
            start: le_u64(&e[0..8]),
            count: le_u64(&e[8..16]),
            src_start: le_u64(&e[16..24]),
            src_version: le_u64(&e[24..32]),
            src_rank: u32::from_le_bytes([e[32], e[33], e[34], e[35]]),
            reference: None,
            period: 0,
        };
        let flags = u32::from_le_bytes([e[36], e[37], e[38], e[39]]);
        // v1 wrote zero here but never checked it; v2 defines bit 0, v3
        // bit 1 and the period above it.
        if h.format_version >= 2 {
            if flags & !known_flags != 0 {
                return Err(format!("SHIFT run at chunk {} has unknown flags {flags:#x}", s.start));
            }
            if flags & SHIFT_FLAG_REFERENCE != 0 {
                if flags != SHIFT_FLAG_REFERENCE {
                    return Err(format!("SHIFT run at chunk {} is a reference with flags {flags:#x}", s.start));
                }
                flagged.push(shift.len());
            }
            if flags & SHIFT_FLAG_REPEAT != 0 {
                let period = u64::from(flags >> PERIOD_SHIFT);
                if period == 0 || period >= s.count {
                    return Err(format!(
                        "SHIFT run at chunk {} of {} chunks repeats a period of {period}",
                        s.start, s.count
                    ));
                }
                // Expanded runs are disjoint chunks: no more than the layout has.
                if s.count / period >= n {
                    return Err(format!("SHIFT run at chunk {} expands past the layout's {n} chunks", s.start));
                }
                match folded {
                    true => shift.push(ShiftRun { period, ..s }),
                    false => expand_repeat(s, period, &mut shift),
                }
                runs += s.count.div_ceil(period);
                expanded = true;
            } else if flags >> PERIOD_SHIFT != 0 {
                return Err(format!("SHIFT run at chunk {} has a period but no repeat flag", s.start));
            } else {
                shift.push(s);
                runs += 1;
            }
        } else {
            shift.push(s);
            runs += 1;
        }
        if runs > n {
            return Err(format!("more SHIFT runs than the layout's {n} chunks"));
        }
    }
    if flagged.len() as u64 != h.reference_count {
        return Err(format!(
            "{} SHIFT runs are flagged as references, the header says {}",
            flagged.len(),
            h.reference_count
        ));
    }
    for i in flagged {
        let d = c.take(REFERENCE_ENTRY_LEN as usize, "reference table")?;
        let mut b = [0u8; 16];
        b.copy_from_slice(d);
        shift[i].reference = Some(Digest(u128::from_le_bytes(b)));
    }
    if expanded && h.method == Method::Tree {
        // A Tree diff's runs are coalesced, but a device writes a repeat
        // node's entry without merging its first or last copy into a
        // neighbouring run: merged here, a no-op on the encoder's files.
        crate::diff::coalesce_shift(&mut shift);
    }
    let encoding = if h.bitmap_len > 0 {
        if h.first_count != 0 || h.bitmap_len != n.div_ceil(8) {
            return Err(format!("bitmap of {} bytes does not fit {n} chunks", h.bitmap_len));
        }
        let bitmap = c.take(h.bitmap_len as usize, "bitmap")?;
        if n % 8 != 0 && bitmap[bitmap.len() - 1] >> (n % 8) != 0 {
            return Err("bitmap has bits set past the last chunk".into());
        }
        first = bitmap_runs(bitmap);
        RegionEncoding::Bitmap
    } else {
        RegionEncoding::Table
    };
    if c.remaining() != 0 {
        return Err("trailing bytes after the tables".into());
    }
    check_sorted("FIRST", first.iter().map(|r| (r.start, r.count)), n)?;
    check_sorted("SHIFT", shift.iter().map(|r| (r.start, r.count)), n)?;
    // FIRST and SHIFT runs must not overlap.
    let (mut i, mut j) = (0, 0);
    while i < first.len() && j < shift.len() {
        let (a, b) = (first[i], shift[j]);
        if a.start < b.start + b.count && b.start < a.start + a.count {
            return Err(format!("FIRST run at chunk {} overlaps SHIFT run at chunk {}", a.start, b.start));
        }
        if a.start < b.start { i += 1 } else { j += 1 }
    }
    for s in &shift {
        if s.src_version > h.version {
            return Err(format!("SHIFT run at chunk {} references a later version {}", s.start, s.src_version));
        }
        if h.baseline && s.src_version != h.version {
            return Err(format!("baseline references version {}", s.src_version));
        }
        s.src_start.checked_add(s.source_count()).ok_or_else(|| "SHIFT source range overflows".to_string())?;
        if s.reference.is_some() && (s.src_version != h.version || s.src_rank == h.rank) {
            return Err(format!("cross-rank reference at chunk {} must name another rank's same version", s.start));
        }
    }
    if h.dense && !(h.baseline && shift.is_empty() && first.len() == 1 && first[0].start == 0 && first[0].count == n) {
        return Err("a dense version must be a baseline holding every chunk".into());
    }
    Ok(Diff {
        version: h.version,
        rank: h.rank,
        layout,
        hash: h.hash,
        method: h.method,
        baseline: h.baseline,
        dense: h.dense,
        first,
        shift,
        encoding,
    })
}

/// The runs of set bits in `bitmap` (bit `i % 8` of byte `i / 8` is chunk
/// `i`), in order. Word by word: a word of zeros (most of a sparse diff) or
/// of ones inside a run costs one step, a mixed word one step per edge.
pub(super) fn bitmap_runs(bitmap: &[u8]) -> Vec<FirstRun> {
    let mut runs = Vec::new();
    let mut open: Option<u64> = None;
    for (w, bytes) in bitmap.chunks(8).enumerate() {
        let mut word = [0u8; 8];
        word[..bytes.len()].copy_from_slice(bytes);
        let word = u64::from_le_bytes(word);
        let (base, bits) = (w as u64 * 64, bytes.len() as u32 * 8);
        let mut at = 0u32;
        while at < bits {
            // The bits from `at` on; those shifted in from above are zeros.
            let rest = word >> at;
            match open {
                Some(start) => {
                    at = (at + rest.trailing_ones()).min(bits);
                    if at < bits {
                        runs.push(FirstRun { start, count: base + u64::from(at) - start });
                        open = None;
                    }
                }
                None => {
                    at = (at + rest.trailing_zeros()).min(bits);
                    if at < bits {
                        open = Some(base + u64::from(at));
                    }
                }
            }
        }
    }
    if let Some(start) = open {
        runs.push(FirstRun { start, count: bitmap.len() as u64 * 8 - start });
    }
    runs
}

pub(super) fn check_sorted(what: &str, runs: impl Iterator<Item = (u64, u64)>, n: u64) -> Result<(), String> {
    let mut end = 0u64;
    for (start, count) in runs {
        let e = start.checked_add(count).filter(|&e| e <= n && count > 0);
        match e {
            Some(e) if start >= end => end = e,
            _ => {
                return Err(format!("{what} run ({start}, {count}) is empty, unsorted, overlapping or past chunk {n}"));
            }
        }
    }
    Ok(())
}
