//! The diff file (format v1; docs/FORMAT.md has the byte map).
//!
//! ```text
//! header (96 B) | FIRST table | SHIFT table | bitmap | FIRST data | block digests | trailer (32 B)
//! ```
//!
//! The data is cut into 64 KiB blocks, each with its BLAKE3-256 digest; the
//! trailer is BLAKE3-256 over the header, the tables, the bitmap and the
//! block digests. So one hash pass covers every byte, `verify` checks the
//! whole file, and `restore` checks exactly the blocks it reads.

use super::codec::{Cursor, PutLe, table_len};
use super::compress::{Codec, Decompressor, FRAME_ENTRY_LEN, META_PREFIX_LEN};
use crate::diff::{Diff, FirstRun, RegionEncoding, ShiftRun};
use crate::hash::Digest;
use crate::layout::Layout;
use crate::storage::{Posix, ReadAt, Storage};
use crate::{Error, HashAlgo, Method, Result};
use rayon::prelude::*;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;

/// File magic.
pub const MAGIC: [u8; 8] = *b"DCKPTDIF";
/// The format version this code writes for files without repeat runs.
pub const FORMAT_VERSION: u16 = 2;
/// The format version of a file holding repeat runs (SHIFT entries that
/// fold consecutive runs of one source range into one). Only such files
/// are written as v3, so every other file stays readable by v2 readers,
/// which refuse a v3 file by its version.
pub const FORMAT_VERSION_REPEATS: u16 = 3;
/// The newest format version this code reads.
pub const NEWEST_READABLE_VERSION: u16 = FORMAT_VERSION_REPEATS;

/// The oldest format version this code still reads (v1 has no cross-rank
/// references; its header and tables are otherwise identical).
pub const OLDEST_READABLE_VERSION: u16 = 1;

/// SHIFT entry flag (format v2): the run is a collective cross-rank
/// reference whose region digest follows in the reference table.
const SHIFT_FLAG_REFERENCE: u32 = 1;
/// SHIFT entry flag (format v3): the entry stands for consecutive runs of
/// one source range of `period` chunks (the flags' bits 8 and up), the
/// range repeated to fill the entry's count; a reader expands it back.
const SHIFT_FLAG_REPEAT: u32 = 2;
/// Where a repeat entry's period starts in its flags.
const PERIOD_SHIFT: u32 = 8;
/// The longest period a repeat entry holds.
pub const MAX_PERIOD: u64 = (1 << (32 - PERIOD_SHIFT)) - 1;
/// Header length in bytes.
pub const HEADER_LEN: u64 = 96;
/// Bytes per FIRST table entry.
pub const FIRST_ENTRY_LEN: u64 = 16;
/// Bytes per SHIFT table entry.
pub const SHIFT_ENTRY_LEN: u64 = 40;
/// Bytes per reference-table entry (a region digest, format v2).
pub const REFERENCE_ENTRY_LEN: u64 = 16;
/// Bytes of data per integrity block.
pub const BLOCK_SIZE: u32 = 64 * 1024;
/// Bytes of one of the parallel reads of a restore's data window.
pub const PARALLEL_READ: usize = 1 << 20;
/// Bytes per block digest and of the trailer.
pub const DIGEST_LEN: u64 = 32;
const FLAG_BASELINE: u32 = 1;
const FLAG_DENSE: u32 = 2;
const FLAG_COMPRESSED: u32 = 4;
/// The most a compressed file's tables may expand to, per stored byte.
const MAX_TABLE_RATIO: u64 = 1 << 16;

/// The fixed-size header of a diff file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiffHeader {
    /// Method that wrote the file.
    pub method: Method,
    /// Digest algorithm of the record.
    pub hash: HashAlgo,
    /// Whether the version references nothing older.
    pub baseline: bool,
    /// Whether the version is stored densely (adds nothing to the record).
    pub dense: bool,
    /// Rank.
    pub rank: u32,
    /// Chunk size in bytes.
    pub chunk_size: u32,
    /// Version number.
    pub version: u64,
    /// Length of the protected buffer.
    pub data_len: u64,
    /// Entries in the FIRST table.
    pub first_count: u64,
    /// Entries in the SHIFT table.
    pub shift_count: u64,
    /// Bytes of the chunk bitmap (Basic).
    pub bitmap_len: u64,
    /// Bytes of FIRST data.
    pub data_bytes: u64,
    /// Bytes per integrity block.
    pub block_size: u32,
    /// SHIFT entries that are collective cross-rank references (format v2;
    /// 0 in v1 files): one 16-byte region digest each in the reference table.
    pub reference_count: u64,
    /// Format version of the file (1 or 2).
    pub format_version: u16,
    /// A compressed file's codec and stored data bytes (the frames), or
    /// `None` for plain data (`crate::format::compress`).
    pub compressed: Option<(Codec, u64)>,
}

impl DiffHeader {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&MAGIC);
        out.put_u16(self.format_version);
        out.put_u8(self.method.code());
        out.put_u8(self.hash.code());
        out.put_u32(
            (u32::from(self.baseline) * FLAG_BASELINE)
                | (u32::from(self.dense) * FLAG_DENSE)
                | (u32::from(self.compressed.is_some()) * FLAG_COMPRESSED),
        );
        out.put_u32(self.rank);
        out.put_u32(self.chunk_size);
        out.put_u64(self.version);
        out.put_u64(self.data_len);
        out.put_u64(self.first_count);
        out.put_u64(self.shift_count);
        out.put_u64(self.bitmap_len);
        out.put_u64(self.data_bytes);
        out.put_u32(self.block_size);
        out.put_u64(self.reference_count);
        let (codec, stored) = self.compressed.map_or((0, 0), |(c, n)| (c.code(), n));
        out.put_u8(codec);
        out.resize(out.len() + 3, 0);
        out.put_u64(stored);
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, String> {
        let mut c = Cursor::new(bytes);
        if c.take(8, "magic")? != MAGIC {
            return Err("not a dckpt diff file (bad magic)".into());
        }
        let fv = c.u16("format version")?;
        if !(OLDEST_READABLE_VERSION..=NEWEST_READABLE_VERSION).contains(&fv) {
            return Err(format!(
                "unsupported format version {fv} (this build reads {OLDEST_READABLE_VERSION} to {NEWEST_READABLE_VERSION})"
            ));
        }
        let m = c.u8("method")?;
        let method = Method::from_code(m).ok_or_else(|| format!("unknown method code {m}"))?;
        let h = c.u8("hash")?;
        let hash = HashAlgo::from_code(h).ok_or_else(|| format!("unknown hash code {h}"))?;
        let flags = c.u32("flags")?;
        if flags & !(FLAG_BASELINE | FLAG_DENSE | FLAG_COMPRESSED) != 0 {
            return Err(format!("unknown flags {flags:#x}"));
        }
        let h = DiffHeader {
            method,
            hash,
            baseline: flags & FLAG_BASELINE != 0,
            dense: flags & FLAG_DENSE != 0,
            rank: c.u32("rank")?,
            chunk_size: c.u32("chunk size")?,
            version: c.u64("version")?,
            data_len: c.u64("data length")?,
            first_count: c.u64("FIRST count")?,
            shift_count: c.u64("SHIFT count")?,
            bitmap_len: c.u64("bitmap length")?,
            data_bytes: c.u64("data bytes")?,
            block_size: c.u32("block size")?,
            reference_count: c.u64("reference count")?,
            format_version: fv,
            compressed: None,
        };
        let codec = c.u8("codec")?;
        if c.take(3, "reserved")?.iter().any(|&b| b != 0) {
            return Err("reserved header bytes are not zero".into());
        }
        let stored = c.u64("stored data bytes")?;
        let h = if flags & FLAG_COMPRESSED == 0 {
            if codec != 0 || stored != 0 {
                return Err("reserved header bytes are not zero".into());
            }
            h
        } else {
            let codec = Codec::from_code(codec).ok_or_else(|| format!("unknown codec {codec}"))?;
            if fv < 2 || stored > h.data_bytes {
                return Err(format!("{stored} stored bytes for {} bytes of data", h.data_bytes));
            }
            DiffHeader { compressed: Some((codec, stored)), ..h }
        };
        if h.reference_count > h.shift_count || (fv == 1 && h.reference_count != 0) {
            return Err(format!("{} references for {} SHIFT runs", h.reference_count, h.shift_count));
        }
        if h.block_size == 0 {
            return Err("block size is zero".into());
        }
        h.layout()?;
        Ok(h)
    }

    /// The chunk layout it describes.
    pub fn layout(&self) -> Result<Layout, String> {
        Layout::new(self.data_len, self.chunk_size).map_err(|e| e.to_string())
    }

    fn blocks(&self) -> u64 {
        self.data_bytes.div_ceil(u64::from(self.block_size))
    }

    /// Bytes of the frame table (a compressed file's stored block lengths).
    fn frames_len(&self) -> u64 {
        if self.compressed.is_some() { self.blocks() * FRAME_ENTRY_LEN } else { 0 }
    }

    /// Bytes of data as stored: compressed, or the FIRST data itself.
    pub fn stored_bytes(&self) -> u64 {
        self.compressed.map_or(self.data_bytes, |(_, n)| n)
    }

    /// Where the stored data starts, given `stored_meta`, the bytes the
    /// tables and bitmap take as stored: after the header, (compressed) their
    /// length, the tables, and (compressed) the frame table.
    fn data_start(&self, stored_meta: u64) -> u64 {
        let prefix = if self.compressed.is_some() { META_PREFIX_LEN } else { 0 };
        HEADER_LEN + prefix + stored_meta + self.frames_len()
    }

    /// Bytes of the tables and bitmap, checked against `limit`.
    pub(crate) fn meta_len(&self, limit: u64) -> Result<u64, String> {
        let f = table_len(self.first_count, FIRST_ENTRY_LEN, limit, "FIRST table")?;
        let s = table_len(self.shift_count, SHIFT_ENTRY_LEN, limit, "SHIFT table")?;
        let r = table_len(self.reference_count, REFERENCE_ENTRY_LEN, limit, "reference table")?;
        f.checked_add(s)
            .and_then(|x| x.checked_add(r))
            .and_then(|x| x.checked_add(self.bitmap_len))
            .filter(|&x| x <= limit)
            .ok_or_else(|| "tables exceed the file".to_string())
    }

    /// Total file length implied by the header of a plain file, checked
    /// against `limit`.
    pub(crate) fn file_len(&self, limit: u64) -> Result<u64, String> {
        if self.compressed.is_some() {
            return Err("a compressed file's length depends on its stored tables".into());
        }
        self.file_len_with(limit, self.meta_len(limit)?)
    }

    /// Total file length implied by the header when the tables and bitmap
    /// take `stored_meta` bytes as stored, checked against `limit`.
    fn file_len_with(&self, limit: u64, stored_meta: u64) -> Result<u64, String> {
        let blocks = table_len(self.blocks(), DIGEST_LEN, limit, "block digests")?;
        let frames = if self.compressed.is_some() {
            table_len(self.blocks(), FRAME_ENTRY_LEN, limit, "frame table")? + META_PREFIX_LEN
        } else {
            0
        };
        HEADER_LEN
            .checked_add(stored_meta)
            .and_then(|x| x.checked_add(frames))
            .and_then(|x| x.checked_add(self.stored_bytes()))
            .and_then(|x| x.checked_add(blocks))
            .and_then(|x| x.checked_add(DIGEST_LEN))
            .ok_or_else(|| "lengths overflow".to_string())
    }
}

/// The header of `diff`'s file, its SHIFT runs folded (one pass over them).
fn header_of(diff: &Diff) -> DiffHeader {
    header_with(diff, stored_shift_entries(diff))
}

/// The header of `diff`'s file with `shift_count` SHIFT entries: v3 where
/// that is fewer than its runs (some fold), v2 otherwise.
fn header_with(diff: &Diff, shift_count: u64) -> DiffHeader {
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
        format_version: match shift_count < diff.shift.len() as u64 {
            true => FORMAT_VERSION_REPEATS,
            false => FORMAT_VERSION,
        },
        compressed: None,
    }
}

/// One SHIFT table entry as stored: a run (`period` 0), or consecutive runs
/// of one source range folded into one (`period` chunks, repeated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ShiftEntry {
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
fn shift_entries(shift: &[ShiftRun]) -> impl Iterator<Item = ShiftEntry> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        let first = *shift.get(i)?;
        i += 1;
        let p = first.count;
        if first.reference.is_some() || p > MAX_PERIOD {
            return Some(ShiftEntry { run: first, period: 0 });
        }
        let mut total = p;
        while let Some(next) = shift.get(i) {
            let repeats = next.reference.is_none()
                && next.start == first.start + total
                && (next.src_rank, next.src_version, next.src_start)
                    == (first.src_rank, first.src_version, first.src_start)
                && next.count <= p;
            if !repeats {
                break;
            }
            total += next.count;
            i += 1;
            if next.count < p {
                break; // a shorter run ends the repeat
            }
        }
        Some(match total == p {
            true => ShiftEntry { run: first, period: 0 },
            false => ShiftEntry { run: ShiftRun { count: total, ..first }, period: p },
        })
    })
}

/// The runs a repeat entry of `period` chunks stands for, pushed onto
/// `out`: its source range once per period, the last copy cut short.
fn expand_repeat(entry: ShiftRun, period: u64, out: &mut Vec<ShiftRun>) {
    let mut at = 0;
    while at < entry.count {
        let count = period.min(entry.count - at);
        out.push(ShiftRun { start: entry.start + at, count, ..entry });
        at += count;
    }
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

/// The file length a header describes (uncompressed).
fn file_len_from(h: &DiffHeader) -> u64 {
    let meta = h.first_count * FIRST_ENTRY_LEN
        + h.shift_count * SHIFT_ENTRY_LEN
        + h.reference_count * REFERENCE_ENTRY_LEN
        + h.bitmap_len;
    HEADER_LEN + meta + h.data_bytes + (h.blocks() + 1) * DIGEST_LEN
}

/// The length of `diff`'s file with `shift_entries` SHIFT entries, as a
/// device writes it before the encoder's fold (every coalesced run of plain
/// roots an entry, and every repeat node: `dedup`'s `device_shift_entries`):
/// the bound on a device's output buffer is taken on this length, by both
/// backends alike, so that both store the same versions whole.
pub fn device_file_len(diff: &Diff, shift_entries: u64) -> u64 {
    file_len_from(&header_with(diff, shift_entries))
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
    let diff = decode_tables(&header, &meta[HEADER_LEN as usize..])?;
    // The FIRST runs must cover the data exactly (what a reader checks).
    if diff.data_bytes() != data_bytes {
        return Err(format!("the FIRST runs cover {} bytes, the data is {data_bytes}", diff.data_bytes()));
    }
    Ok(diff)
}

/// The trailer of a file whose metadata (header, tables, bitmap) is `meta`
/// and whose block digests are `digests`: BLAKE3-256 of both, in that order.
pub fn trailer_of(meta: &[u8], digests: &[u8]) -> [u8; 32] {
    trailer_of_parts(&[meta, digests])
}

/// BLAKE3-256 of `parts` in order (a trailer: everything before the data,
/// then the block digests).
pub(crate) fn trailer_of_parts(parts: &[&[u8]]) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    for part in parts {
        if part.len() >= 1 << 20 {
            hasher.update_rayon(part);
        } else {
            hasher.update(part);
        }
    }
    *hasher.finalize().as_bytes()
}

/// The trailer of a complete diff file of `file_len` bytes given as
/// consecutive `pieces` (its last 32 bytes, the trailer's place, are not
/// read): the same digest as [`trailer_of`], for a consumer that seals a file
/// the GPU wrote without one (the asynchronous tiers). Checks that the
/// header describes exactly `file_len` bytes.
pub fn seal(pieces: &[&[u8]], file_len: u64) -> Result<[u8; 32], String> {
    let mut head = [0u8; HEADER_LEN as usize];
    copy_range(pieces, 0..HEADER_LEN, &mut |at, p| head[at as usize..at as usize + p.len()].copy_from_slice(p));
    let header = DiffHeader::decode(&head)?;
    let expected = header.file_len(file_len)?;
    if expected != file_len {
        return Err(format!("file is {file_len} bytes but its header describes {expected}"));
    }
    let data_start = header.data_start(header.meta_len(file_len)?);
    let data_end = data_start + header.data_bytes;
    let mut hasher = blake3::Hasher::new();
    for range in [0..data_start, data_end..file_len - DIGEST_LEN] {
        copy_range(pieces, range, &mut |_, p| {
            if p.len() >= 1 << 20 {
                hasher.update_rayon(p);
            } else {
                hasher.update(p);
            }
        });
    }
    Ok(*hasher.finalize().as_bytes())
}

/// Where the FIRST data of an uncompressed diff file of `file_len` bytes
/// starts, from its header (its first [`HEADER_LEN`] bytes).
pub fn data_start_of(header: &[u8], file_len: u64) -> Result<u64, String> {
    let header = DiffHeader::decode(header)?;
    if header.compressed.is_some() {
        return Err("a compressed diff file".into());
    }
    Ok(header.data_start(header.meta_len(file_len)?))
}

/// Calls `f(offset in range, bytes)` for the parts of `pieces` (consecutive)
/// that fall in `range`, in order.
fn copy_range(pieces: &[&[u8]], range: std::ops::Range<u64>, f: &mut dyn FnMut(u64, &[u8])) {
    let mut at = 0u64;
    for p in pieces {
        let (lo, hi) = (at, at + p.len() as u64);
        at = hi;
        let (s, e) = (range.start.max(lo), range.end.min(hi));
        if s < e {
            f(s - range.start, &p[(s - lo) as usize..(e - lo) as usize]);
        }
    }
}

/// Fills `buf` from `file` at `offset` in pieces of [`PARALLEL_READ`]
/// bytes, in parallel: one thread copies from the page cache at a fraction
/// of what the cores do together, and a device serves several requests at
/// once.
fn read_parallel(file: &dyn ReadAt, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    buf.par_chunks_mut(PARALLEL_READ)
        .enumerate()
        .try_for_each(|(i, piece)| file.read_exact_at(piece, offset + (i * PARALLEL_READ) as u64))
}

/// Appends the block digests and the trailer to a body whose data starts at
/// `data_start`, completing the file.
pub fn finish_body(mut body: Vec<u8>, data_start: usize) -> Vec<u8> {
    let digests: Vec<[u8; 32]> =
        body[data_start..].par_chunks(BLOCK_SIZE as usize).map(|b| *blake3::hash(b).as_bytes()).collect();
    let data_end = body.len();
    body.reserve(digests.len() * DIGEST_LEN as usize + DIGEST_LEN as usize);
    for d in &digests {
        body.extend_from_slice(d);
    }
    let mut hasher = blake3::Hasher::new();
    hasher.update(&body[..data_start]);
    hasher.update(&body[data_end..]);
    let trailer = *hasher.finalize().as_bytes();
    body.extend_from_slice(&trailer);
    body
}

/// An open, metadata-verified diff file. Data blocks are verified as they are read.
#[derive(Debug)]
pub struct DiffReader {
    storage: Arc<dyn Storage>,
    rel: PathBuf,
    path: PathBuf,
    /// Open while in use; [`DiffReader::release_file`] closes it (the
    /// restore catalog bounds open files) and the next read reopens it.
    file: Mutex<Option<Arc<dyn ReadAt>>>,
    /// The header.
    pub header: DiffHeader,
    /// The decoded regions.
    pub diff: Diff,
    first_data_offsets: Vec<u64>,
    block_digests: Vec<[u8; 32]>,
    /// A compressed file's codec and each block's stored offset (one more
    /// than blocks: the last is the end).
    frames: Option<(Codec, Vec<u64>)>,
    data_start: u64,
    trailer: [u8; 32],
    file_len: u64,
}

impl DiffReader {
    /// Opens `path`, checks its length, the trailer and every table.
    pub fn open(path: &Path) -> Result<Self> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let name = path.file_name().ok_or_else(|| Error::io(path, std::io::ErrorKind::InvalidInput.into()))?;
        Self::open_in(Arc::new(Posix::at(dir)), Path::new(name))
    }

    /// As [`DiffReader::open`], for file `rel` of `storage`.
    pub fn open_in(storage: Arc<dyn Storage>, rel: &Path) -> Result<Self> {
        let path = &storage.locate(rel);
        let file = storage.open(rel)?;
        let file_len = file.len();
        let corrupt = |r: String| Error::corrupt(path, r);
        if file_len < HEADER_LEN + DIGEST_LEN {
            return Err(corrupt(format!("file is {file_len} bytes, shorter than a header")));
        }
        let mut head = vec![0u8; HEADER_LEN as usize];
        file.read_exact_at(&mut head, 0).map_err(|e| Error::io(path, e))?;
        let header = DiffHeader::decode(&head).map_err(corrupt)?;
        // Compressed tables may decode to more than the file holds; this
        // bound (far above any codec's ratio on tables) only stops a
        // damaged header from asking for an absurd buffer.
        let limit = if header.compressed.is_some() { file_len.saturating_mul(MAX_TABLE_RATIO) } else { file_len };
        let chunks = header.layout().map_err(corrupt)?.chunks();
        if header.first_count > chunks || header.shift_count > chunks {
            return Err(corrupt(format!(
                "{} FIRST and {} SHIFT runs for {chunks} chunks",
                header.first_count, header.shift_count
            )));
        }
        let meta_len = header.meta_len(limit).map_err(corrupt)?;
        // A compressed file's tables may be stored compressed: their stored
        // length follows the header.
        let stored_meta = match header.compressed {
            None => meta_len,
            Some(_) => {
                let mut b = [0u8; META_PREFIX_LEN as usize];
                file.read_exact_at(&mut b, HEADER_LEN).map_err(|e| Error::io(path, e))?;
                let n = u64::from_le_bytes(b);
                if n > meta_len || (n == 0) != (meta_len == 0) {
                    return Err(corrupt(format!("tables of {meta_len} bytes stored in {n}")));
                }
                n
            }
        };
        let expected = header.file_len_with(file_len, stored_meta).map_err(corrupt)?;
        if expected != file_len {
            return Err(corrupt(format!("file is {file_len} bytes but its header describes {expected}")));
        }
        let data_start = header.data_start(stored_meta);
        // Tables, bitmap and (compressed) the frame table, in one read.
        let mut meta = vec![0u8; (data_start - HEADER_LEN) as usize];
        file.read_exact_at(&mut meta, HEADER_LEN).map_err(|e| Error::io(path, e))?;
        let tail_start = data_start + header.stored_bytes();
        let mut tail = vec![0u8; (file_len - tail_start) as usize];
        file.read_exact_at(&mut tail, tail_start).map_err(|e| Error::io(path, e))?;
        let (digest_bytes, trailer_bytes) = tail.split_at(tail.len() - DIGEST_LEN as usize);
        let mut hasher = blake3::Hasher::new();
        hasher.update(&head);
        hasher.update(&meta);
        hasher.update(digest_bytes);
        let mut trailer = [0u8; 32];
        trailer.copy_from_slice(trailer_bytes);
        if *hasher.finalize().as_bytes() != trailer {
            return Err(corrupt("checksum mismatch in header, tables or block digests".into()));
        }
        let block_digests = digest_bytes
            .chunks_exact(32)
            .map(|c| {
                let mut d = [0u8; 32];
                d.copy_from_slice(c);
                d
            })
            .collect();
        let (diff, frames) = match header.compressed {
            None => (decode_tables(&header, &meta).map_err(corrupt)?, None),
            Some((codec, _)) => {
                let (stored, frame_table) = meta[META_PREFIX_LEN as usize..].split_at(stored_meta as usize);
                let tables = if stored_meta == meta_len {
                    std::borrow::Cow::Borrowed(stored)
                } else {
                    let mut raw = vec![0u8; meta_len as usize];
                    Decompressor::new(codec)
                        .decompress(stored, &mut raw)
                        .map_err(|why| corrupt(format!("the tables cannot be decompressed: {why}")))?;
                    std::borrow::Cow::Owned(raw)
                };
                let diff = decode_tables(&header, &tables).map_err(corrupt)?;
                (diff, Some((codec, frame_offsets(&header, frame_table).map_err(corrupt)?)))
            }
        };
        let mut first_data_offsets = Vec::with_capacity(diff.first.len());
        let mut at = 0u64;
        for r in &diff.first {
            first_data_offsets.push(at);
            let b = diff.layout.chunk_bytes(r.start..r.start + r.count);
            at += b.end - b.start;
        }
        if at != header.data_bytes {
            return Err(corrupt(format!("FIRST runs cover {at} bytes but the file holds {}", header.data_bytes)));
        }
        Ok(DiffReader {
            storage,
            rel: rel.to_path_buf(),
            path: path.clone(),
            file: Mutex::new(Some(Arc::from(file))),
            header,
            diff,
            first_data_offsets,
            block_digests,
            frames,
            data_start,
            trailer,
            file_len,
        })
    }

    /// Reads `buf.len()` bytes at `offset`, reopening the file if it was released.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.handle()?.read_exact_at(buf, offset).map_err(|e| Error::io(&self.path, e))
    }

    /// The open file (reopened if it was released). The lock is held only
    /// to take it: reads, and the parallel work on what they return, run
    /// without it.
    fn handle(&self) -> Result<Arc<dyn ReadAt>> {
        let mut guard = self.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(f) = guard.as_ref() {
            return Ok(Arc::clone(f));
        }
        let f: Arc<dyn ReadAt> = Arc::from(self.storage.open(&self.rel)?);
        if f.len() != self.file_len {
            return Err(Error::corrupt(&self.path, "the file changed while it was being read"));
        }
        *guard = Some(Arc::clone(&f));
        Ok(f)
    }

    /// Hands `f` the file's bytes `offset..offset + len`: borrowed where the
    /// file lives in memory ([`ReadAt::borrow_at`]), else read into `buf`
    /// ([`read_parallel`]).
    fn with_bytes<R>(&self, offset: u64, len: usize, buf: &mut Vec<u8>, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        let file = self.handle()?;
        if let Some(bytes) = file.borrow_at(offset, len) {
            return Ok(f(bytes));
        }
        buf.resize(len, 0);
        read_parallel(file.as_ref(), buf, offset).map_err(|e| Error::io(&self.path, e))?;
        Ok(f(buf))
    }

    /// Closes the file handle (metadata stays; the next read reopens it).
    pub fn release_file(&self) {
        *self.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The trailer (the file's integrity digest).
    pub fn trailer(&self) -> [u8; 32] {
        self.trailer
    }

    /// The file's length in bytes.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// Bytes that are not (stored) FIRST data.
    pub fn metadata_bytes(&self) -> u64 {
        self.file_len - self.header.stored_bytes()
    }

    /// Maps chunks `range` (which must lie inside FIRST runs) to pieces
    /// `(first chunk, data offset, byte length)` of this file's data.
    pub fn locate(&self, range: Range<u64>) -> Result<Vec<(u64, u64, u64)>> {
        let mut out = Vec::new();
        let mut at = range.start;
        self.locate_each(range, |off, len| {
            out.push((at, off, len));
            at += len.div_ceil(u64::from(self.diff.layout.chunk_size()));
        })?;
        Ok(out)
    }

    /// As [`DiffReader::locate`], handing each piece `(data offset, byte
    /// length)` to `f` in chunk order (no allocation).
    pub fn locate_each(&self, range: Range<u64>, f: impl FnMut(u64, u64)) -> Result<()> {
        self.locate_each_near(range, &mut 0, f)
    }

    /// As [`DiffReader::locate_each`], for ranges asked in rising order:
    /// the search for the FIRST run holding `range.start` starts at `*near`
    /// (a few steps forward, then a binary search of the rest; from the
    /// start if `range` lies before it), and `*near` is left at the last
    /// run used, for the next range.
    pub fn locate_each_near(&self, range: Range<u64>, near: &mut usize, f: impl FnMut(u64, u64)) -> Result<()> {
        /// Runs stepped over one by one before searching.
        const STEPS: usize = 8;
        let (runs, at) = (&self.diff.first, range.start);
        let ends_before = |r: &FirstRun| r.start + r.count <= at;
        let before = |k: usize| runs.get(k).is_some_and(ends_before);
        let k = match runs.get(*near) {
            // Runs are sorted and disjoint: every run before `near` ends before `at`.
            Some(r) if r.start <= at => {
                let mut k = *near;
                while before(k) && k - *near < STEPS {
                    k += 1;
                }
                if before(k) { k + runs[k..].partition_point(ends_before) } else { k }
            }
            _ => runs.partition_point(ends_before),
        };
        *near = self.locate_from(k, range, f)?.saturating_sub(1);
        Ok(())
    }

    /// The pieces of `range` from FIRST run `k` on (the first run not
    /// ending before `range.start`); returns the run after the last used.
    fn locate_from(&self, mut k: usize, range: Range<u64>, mut f: impl FnMut(u64, u64)) -> Result<usize> {
        let layout = self.diff.layout;
        let mut at = range.start;
        while at < range.end {
            let Some(r) = self.diff.first.get(k).filter(|r| r.start <= at) else {
                return Err(Error::BrokenReference {
                    path: self.path.clone(),
                    reason: format!("chunk {at} of version {} is not stored in this file", self.header.version),
                });
            };
            let end = (r.start + r.count).min(range.end);
            let run_bytes = layout.chunk_bytes(r.start..end);
            let piece = layout.chunk_bytes(at..end);
            f(self.first_data_offsets[k] + (piece.start - run_bytes.start), piece.end - piece.start);
            at = end;
            k += 1;
        }
        Ok(k)
    }

    /// The bytes of chunks `range` (inside FIRST runs), read through verified blocks.
    pub fn read_chunks(&self, range: Range<u64>) -> Result<Vec<u8>> {
        let bs = u64::from(self.header.block_size);
        let mut out = Vec::new();
        for (_, off, len) in self.locate(range)? {
            let first = off / bs;
            let buf = self.read_blocks(first..(off + len).div_ceil(bs))?;
            let at = (off - first * bs) as usize;
            out.extend_from_slice(&buf[at..at + len as usize]);
        }
        Ok(out)
    }

    /// Reads blocks `blocks` of the data, verifying each; returns their bytes.
    pub fn read_blocks(&self, blocks: Range<u64>) -> Result<Vec<u8>> {
        let mut buf = Vec::new();
        self.read_blocks_into(blocks, &mut buf)?;
        Ok(buf)
    }

    /// As [`DiffReader::read_blocks`], into a reused buffer (resized to the bytes read).
    pub fn read_blocks_into(&self, blocks: Range<u64>, buf: &mut Vec<u8>) -> Result<()> {
        let (start, len, count) = self.block_span(&blocks)?;
        buf.resize(len, 0);
        match &self.frames {
            None => read_parallel(self.handle()?.as_ref(), buf, self.data_start + start)
                .map_err(|e| Error::io(&self.path, e))?,
            Some((codec, offsets)) => self.read_compressed(*codec, offsets, blocks.clone(), buf)?,
        }
        self.verify_each(blocks.start, buf, vec![(); count], |_, ()| {})
    }

    /// Where data blocks `blocks` lie: `(first data byte, bytes, blocks)`.
    fn block_span(&self, blocks: &Range<u64>) -> Result<(u64, usize, usize)> {
        let bs = u64::from(self.header.block_size);
        let start = blocks.start * bs;
        let end = (blocks.end * bs).min(self.header.data_bytes);
        if start > end || blocks.end > self.block_count() {
            return Err(Error::Internal(format!("blocks {blocks:?} past the file's {}", self.block_count())));
        }
        Ok((start, (end - start) as usize, (blocks.end - blocks.start) as usize))
    }

    /// Checks each block of `bytes` (data blocks from `first` on) against its
    /// digest, in parallel, handing each one that matches to `per_block`
    /// with its item of `work`; an error names the first that does not.
    fn verify_each<T: Send>(
        &self,
        first: u64,
        bytes: &[u8],
        work: Vec<T>,
        per_block: impl Fn(&[u8], T) + Sync,
    ) -> Result<()> {
        let digests = &self.block_digests;
        let bad = bytes
            .par_chunks(self.header.block_size as usize)
            .zip(work)
            .enumerate()
            .filter_map(|(i, (b, w))| {
                let at = first as usize + i;
                if digests.get(at).is_some_and(|d| blake3::hash(b).as_bytes() == d) {
                    per_block(b, w);
                    None
                } else {
                    Some(at)
                }
            })
            .min();
        match bad {
            Some(b) => Err(Error::corrupt(&self.path, format!("data block {b} fails its checksum"))),
            None => Ok(()),
        }
    }

    /// Verifies data blocks `blocks` and hands each verified block, with its
    /// item of `work` (one per block, in order), to `per_block`, the blocks
    /// in parallel: each block is hashed and used while it is in the core's
    /// cache, in one pass over the bytes. The bytes are borrowed where the
    /// file lives in memory ([`ReadAt::borrow_at`]: no copy), else read or
    /// decompressed into `buf`. A block that fails its checksum is an error
    /// naming the first such block (`per_block` may have run for others, and
    /// never for a failed one). Returns the time spent getting the bytes
    /// (reading or decompressing; none when they were borrowed).
    pub fn for_each_verified_block<T: Send>(
        &self,
        blocks: Range<u64>,
        buf: &mut Vec<u8>,
        work: Vec<T>,
        per_block: impl Fn(&[u8], T) + Sync,
    ) -> Result<std::time::Duration> {
        let (start, len, count) = self.block_span(&blocks)?;
        if work.len() != count {
            return Err(Error::Internal(format!("{} work items for blocks {blocks:?}", work.len())));
        }
        let t = std::time::Instant::now();
        let mut read = std::time::Duration::ZERO;
        match &self.frames {
            None => self.with_bytes(self.data_start + start, len, buf, |bytes| {
                read = t.elapsed();
                self.verify_each(blocks.start, bytes, work, per_block)
            })??,
            Some((codec, offsets)) => {
                buf.resize(len, 0);
                self.read_compressed(*codec, offsets, blocks.clone(), buf)?;
                read = t.elapsed();
                self.verify_each(blocks.start, buf, work, per_block)?;
            }
        }
        Ok(read)
    }

    /// Reads the stored blocks `blocks` of a compressed file and
    /// decompresses them into `buf` (sized to their raw bytes), in parallel.
    fn read_compressed(&self, codec: Codec, offsets: &[u64], blocks: Range<u64>, buf: &mut [u8]) -> Result<()> {
        let (lo, hi) = (blocks.start as usize, blocks.end as usize);
        let (Some(&from), Some(&to)) = (offsets.get(lo), offsets.get(hi)) else {
            return Err(Error::Internal(format!("blocks {blocks:?} past the file's {}", self.block_count())));
        };
        let mut stored = vec![0u8; (to - from) as usize];
        self.read_at(&mut stored, self.data_start + from)?;
        let bs = self.header.block_size as usize;
        let failed = buf
            .par_chunks_mut(bs)
            .enumerate()
            .map_init(
                || Decompressor::new(codec),
                |z, (i, out)| {
                    let (a, b) = (offsets[lo + i] - from, offsets[lo + i + 1] - from);
                    let src = &stored[a as usize..b as usize];
                    if src.len() == out.len() {
                        out.copy_from_slice(src); // stored as it is
                        return None;
                    }
                    z.decompress(src, out).err().map(|why| (lo + i, why))
                },
            )
            .find_first(Option::is_some)
            .flatten();
        match failed {
            Some((b, why)) => Err(Error::corrupt(&self.path, format!("data block {b} cannot be decompressed: {why}"))),
            None => Ok(()),
        }
    }

    /// The codec of a compressed file (`None`: plain data).
    pub fn codec(&self) -> Option<Codec> {
        self.frames.as_ref().map(|(c, _)| *c)
    }

    /// Number of data blocks.
    pub fn block_count(&self) -> u64 {
        self.block_digests.len() as u64
    }

    /// Reads and verifies every data block.
    pub fn verify_data(&self) -> Result<()> {
        let step = 256;
        let mut b = 0;
        while b < self.block_count() {
            let e = (b + step).min(self.block_count());
            self.read_blocks(b..e)?;
            b = e;
        }
        Ok(())
    }
}

/// Each block's stored offset from a compressed file's frame table (one
/// more than blocks). Every stored length is at least 1 and at most its raw
/// block's length (equal: stored as it is); they add up to the header's
/// stored bytes.
fn frame_offsets(h: &DiffHeader, table: &[u8]) -> Result<Vec<u64>, String> {
    let blocks = h.blocks();
    let bs = u64::from(h.block_size);
    let mut c = Cursor::new(table);
    let mut offsets = Vec::with_capacity(blocks as usize + 1);
    let mut at = 0u64;
    offsets.push(0);
    for b in 0..blocks {
        let raw = bs.min(h.data_bytes - b * bs);
        let len = u64::from(c.u32("frame table")?);
        if len == 0 || len > raw {
            return Err(format!("block {b} is stored in {len} bytes, its data is {raw}"));
        }
        at += len;
        offsets.push(at);
    }
    if c.remaining() != 0 || Some(at) != h.compressed.map(|(_, n)| n) {
        return Err(format!("the frame table covers {at} stored bytes, the header says {}", h.stored_bytes()));
    }
    Ok(offsets)
}

fn decode_tables(h: &DiffHeader, meta: &[u8]) -> Result<Diff, String> {
    let layout = h.layout()?;
    let n = layout.chunks();
    let mut c = Cursor::new(meta);
    // Each table taken whole (its length checked once), then decoded entry
    // by entry from fixed offsets.
    fn table<'m>(c: &mut Cursor<'m>, count: u64, entry: u64, what: &str) -> Result<&'m [u8], String> {
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
                expand_repeat(s, period, &mut shift);
                expanded = true;
            } else if flags >> PERIOD_SHIFT != 0 {
                return Err(format!("SHIFT run at chunk {} has a period but no repeat flag", s.start));
            } else {
                shift.push(s);
            }
        } else {
            shift.push(s);
        }
        if shift.len() as u64 > n {
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
        shift.dedup_by(|next, prev| {
            let merge = prev.extended_by(next);
            if merge {
                prev.count += next.count;
            }
            merge
        });
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
        s.src_start.checked_add(s.count).ok_or_else(|| "SHIFT source range overflows".to_string())?;
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
fn bitmap_runs(bitmap: &[u8]) -> Vec<FirstRun> {
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

/// The little-endian `u64` of an 8-byte slice.
fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_le_bytes(a)
}

fn check_sorted(what: &str, runs: impl Iterator<Item = (u64, u64)>, n: u64) -> Result<(), String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The runs of set bits, one bit at a time (the oracle).
    fn runs_bit_by_bit(bitmap: &[u8]) -> Vec<FirstRun> {
        let mut runs: Vec<FirstRun> = Vec::new();
        for i in 0..bitmap.len() as u64 * 8 {
            if bitmap[(i / 8) as usize] & (1 << (i % 8)) != 0 {
                match runs.last_mut() {
                    Some(r) if r.start + r.count == i => r.count += 1,
                    _ => runs.push(FirstRun { start: i, count: 1 }),
                }
            }
        }
        runs
    }

    proptest! {
        /// Word-wise decoding finds the runs a bit-by-bit scan finds, with
        /// runs across words, whole words of ones and zeros, and a short
        /// last word.
        #[test]
        fn bitmap_runs_match_a_bit_by_bit_scan(
            bytes in proptest::collection::vec(prop_oneof![Just(0u8), Just(0xff), any::<u8>()], 0..80)
        ) {
            prop_assert_eq!(bitmap_runs(&bytes), runs_bit_by_bit(&bytes));
        }
    }

    /// A diff whose SHIFT runs come from `(count, source)` pieces laid one
    /// after another (source `None`: a gap of FIXED chunks).
    fn diff_of(pieces: &[(u64, Option<u64>)]) -> Diff {
        let n: u64 = pieces.iter().map(|p| p.0).sum::<u64>() + 8;
        let mut shift = Vec::new();
        let mut at = 8; // chunks 0..8 are FIRST: the sources
        for &(count, src) in pieces {
            if let Some(src_start) = src {
                shift.push(ShiftRun { start: at, count, src_version: 1, src_rank: 0, src_start, reference: None });
            }
            at += count;
        }
        Diff {
            version: 1,
            rank: 0,
            layout: Layout::new(n * 64, 64).expect("layout"),
            hash: HashAlgo::Murmur3,
            // Runs as given, not coalesced: as List makes them.
            method: Method::List,
            baseline: true,
            dense: false,
            first: vec![FirstRun { start: 0, count: 8 }],
            shift,
            encoding: RegionEncoding::Table,
        }
    }

    /// Up to 60 pieces of 1–4 chunks, each a gap or a copy of one of three
    /// sources: runs in a row that repeat, with shorter tails, between gaps.
    fn pieces() -> impl Strategy<Value = Vec<(u64, Option<u64>)>> {
        proptest::collection::vec((1u64..5, prop_oneof![Just(None), (0u64..3).prop_map(Some)]), 0..60)
    }

    /// `diff`'s metadata with every SHIFT run an entry of its own, as a
    /// device writes it.
    fn unfolded_meta(diff: &Diff) -> Vec<u8> {
        let mut out = Vec::new();
        header_with(diff, diff.shift.len() as u64).encode(&mut out);
        for r in &diff.first {
            out.put_u64(r.start);
            out.put_u64(r.count);
        }
        for s in &diff.shift {
            for v in [s.start, s.count, s.src_start, s.src_version] {
                out.put_u64(v);
            }
            out.put_u32(s.src_rank);
            out.put_u32(0);
        }
        out
    }

    /// A device-made file's metadata from `segments`, each `(count, source,
    /// copies)` laid one after another: a gap (no source), a plain root
    /// (one copy; coalesced with the plain root before it where it extends
    /// it), or a repeat node (its source of `count` chunks, `copies` ≥ 2
    /// times; one entry of its own). Also the diff a CPU makes of the same
    /// roots: every copy a run, coalesced.
    fn device_meta(segments: &[(u64, Option<u64>, u64)]) -> (Vec<u8>, Diff) {
        let mut entries: Vec<(ShiftRun, u64)> = Vec::new();
        let mut pieces = Vec::new();
        for &(count, src, copies) in segments {
            pieces.extend(std::iter::repeat_n((count, src), copies as usize));
        }
        let mut cpu = Diff { method: Method::Tree, ..diff_of(&pieces) };
        let mut at = 8;
        for &(count, src, copies) in segments {
            if let Some(src_start) = src {
                let run = ShiftRun {
                    start: at,
                    count: count * copies,
                    src_version: 1,
                    src_rank: 0,
                    src_start,
                    reference: None,
                };
                match entries.last_mut() {
                    Some((prev, 0)) if copies == 1 && prev.extended_by(&run) => prev.count += run.count,
                    _ => entries.push((run, if copies > 1 { count } else { 0 })),
                }
            }
            at += count * copies;
        }
        cpu.coalesce();
        let mut out = Vec::new();
        let mut header = header_with(&cpu, entries.len() as u64);
        header.format_version = match entries.iter().any(|e| e.1 > 0) {
            true => FORMAT_VERSION_REPEATS,
            false => FORMAT_VERSION,
        };
        header.encode(&mut out);
        for r in &cpu.first {
            out.put_u64(r.start);
            out.put_u64(r.count);
        }
        for (s, period) in &entries {
            for v in [s.start, s.count, s.src_start, s.src_version] {
                out.put_u64(v);
            }
            out.put_u32(s.src_rank);
            out.put_u32(if *period > 0 { SHIFT_FLAG_REPEAT | (*period as u32) << PERIOD_SHIFT } else { 0 });
        }
        (out, cpu)
    }

    proptest! {
        /// A device's file, with a repeat node an entry of its own that the
        /// encoder would merge with its neighbours, decodes to the runs the
        /// CPU makes of the same roots; the in-place scan flags it, and its
        /// rewrite (decode, encode) is the CPU's file.
        #[test]
        fn a_device_file_with_repeat_nodes_decodes_to_the_cpu_runs(
            segments in proptest::collection::vec(
                (1u64..5, prop_oneof![Just(None), (0u64..4).prop_map(Some)], prop_oneof![Just(1u64), 2u64..9]),
                0..40,
            )
        ) {
            let (device, cpu) = device_meta(&segments);
            let back = decode_meta(&device, cpu.data_bytes()).expect("decodes");
            prop_assert_eq!(&back.shift, &cpu.shift);
            let repeats = segments.iter().any(|s| s.1.is_some() && s.2 > 1);
            if repeats {
                prop_assert!(runs_fold(&device).expect("scans"));
            }
            prop_assert_eq!(encode_meta(&back), encode_meta(&cpu));
        }
    }

    proptest! {
        /// The in-place scan finds a fold exactly where the encoder folds:
        /// in a device-like file (which decodes to the same runs), never in
        /// the encoder's own.
        #[test]
        fn the_in_place_scan_finds_exactly_the_folds(
            pieces in pieces()
        ) {
            let diff = diff_of(&pieces);
            let device = unfolded_meta(&diff);
            prop_assert_eq!(&decode_meta(&device, diff.data_bytes()).expect("decodes").shift, &diff.shift);
            let folds = stored_shift_entries(&diff) < diff.shift.len() as u64;
            prop_assert_eq!(runs_fold(&device).expect("scans"), folds);
            // The encoder's own file: flagged exactly where it holds a repeat entry.
            prop_assert_eq!(runs_fold(&encode_meta(&diff)).expect("scans"), folds);
            prop_assert_eq!(device_file_len(&diff, diff.shift.len() as u64) - file_len_of(&diff),
                (diff.shift.len() as u64 - stored_shift_entries(&diff)) * SHIFT_ENTRY_LEN);
        }

        /// Folding repeats and expanding them gives the runs back exactly,
        /// whatever the mix of repeats, shorter tails, gaps and plain runs;
        /// a file with a fold is v3, one without stays v2.
        #[test]
        fn folded_runs_decode_to_the_runs_encoded(
            pieces in pieces()
        ) {
            let diff = diff_of(&pieces);
            let meta = encode_meta(&diff);
            let back = decode_meta(&meta, diff.data_bytes()).expect("decodes");
            prop_assert_eq!(&back.shift, &diff.shift);
            let header = DiffHeader::decode(&meta[..HEADER_LEN as usize]).expect("header");
            let folds = header.shift_count < diff.shift.len() as u64;
            prop_assert_eq!(header.format_version, if folds { FORMAT_VERSION_REPEATS } else { FORMAT_VERSION });
        }
    }

    #[test]
    fn a_repeated_chunk_is_one_entry() {
        // 1000 copies of chunk 3, then 10 of chunks 4..6 (period 2), the last
        // cut short, then one more copy of chunk 3.
        let mut pieces = vec![(1, Some(3)); 1000];
        pieces.extend(vec![(2, Some(4)); 10]);
        pieces.push((1, Some(4)));
        pieces.push((1, Some(3)));
        let diff = diff_of(&pieces);
        assert_eq!(stored_shift_entries(&diff), 3);
        assert_eq!(device_file_len(&diff, 1012), file_len_of(&diff) + (1012 - 3) * SHIFT_ENTRY_LEN);
        let meta = encode_meta(&diff);
        assert_eq!(meta.len() as u64, HEADER_LEN + FIRST_ENTRY_LEN + 3 * SHIFT_ENTRY_LEN);
        assert_eq!(decode_meta(&meta, diff.data_bytes()).expect("decodes").shift, diff.shift);
    }

    #[test]
    fn repeat_entries_that_cannot_be_are_refused() {
        let diff = diff_of(&[(1, Some(3)), (1, Some(3)), (1, Some(3))]);
        let meta = encode_meta(&diff);
        let flags_at = (HEADER_LEN + FIRST_ENTRY_LEN + 36) as usize;
        let with_flags = |flags: u32, version: Option<u16>| {
            let mut m = meta.clone();
            m[flags_at..flags_at + 4].copy_from_slice(&flags.to_le_bytes());
            if let Some(v) = version {
                // The format version follows the magic.
                m[8..10].copy_from_slice(&v.to_le_bytes());
            }
            decode_meta(&m, diff.data_bytes())
        };
        assert!(with_flags(SHIFT_FLAG_REPEAT | (1 << PERIOD_SHIFT), None).is_ok());
        let refused = [
            (SHIFT_FLAG_REPEAT | (1 << PERIOD_SHIFT), Some(2), "unknown flags"),
            (SHIFT_FLAG_REPEAT, None, "period of 0"),
            (SHIFT_FLAG_REPEAT | (3 << PERIOD_SHIFT), None, "period of 3"),
            (1 << PERIOD_SHIFT, None, "no repeat flag"),
            (SHIFT_FLAG_REPEAT | SHIFT_FLAG_REFERENCE | (1 << PERIOD_SHIFT), None, "a reference with flags"),
        ];
        for (flags, version, why) in refused {
            let e = with_flags(flags, version).expect_err(why);
            assert!(e.contains(why), "{flags:#x}: {e}");
        }
    }

    #[test]
    fn bitmap_runs_of_edge_words() {
        assert!(bitmap_runs(&[]).is_empty());
        assert_eq!(bitmap_runs(&[0xff; 16]), vec![FirstRun { start: 0, count: 128 }]);
        let mut b = [0u8; 17];
        b[7] = 0x80; // bit 63
        b[8] = 0x01; // bit 64: one run across the word boundary
        b[16] = 0x80; // bit 135, the last
        assert_eq!(bitmap_runs(&b), vec![FirstRun { start: 63, count: 2 }, FirstRun { start: 135, count: 1 }]);
    }
}
