//! The diff file's frame: its constants, the fixed header (96 bytes), and
//! the trailer that seals it (BLAKE3-256 over the metadata and the block
//! digests). What lies between, the tables, is `tables`'s.

use super::super::codec::{Cursor, PutLe, table_len};
use crate::error::Result;
use crate::hash::HashAlgo;
use crate::layout::Layout;
use crate::method::Method;
use rayon::prelude::*;

/// The codec recorded in a compressed file's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    /// LZ4 block format.
    Lz4,
    /// Zstandard frames.
    Zstd,
}

impl Codec {
    /// The byte stored in the header.
    pub fn code(self) -> u8 {
        match self {
            Codec::Lz4 => 1,
            Codec::Zstd => 2,
        }
    }

    /// The codec of a header byte.
    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Codec::Lz4),
            2 => Some(Codec::Zstd),
            _ => None,
        }
    }
}

/// Bytes per frame-table entry (a block's stored length, u32).
pub const FRAME_ENTRY_LEN: u64 = 4;
/// Bytes of the stored tables' length `M` (u64) after a compressed file's header.
pub const META_PREFIX_LEN: u64 = 8;

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
pub(super) const SHIFT_FLAG_REFERENCE: u32 = 1;

/// SHIFT entry flag (format v3): the entry stands for consecutive runs of
/// one source range of `period` chunks (the flags' bits 8 and up), the
/// range repeated to fill the entry's count; a reader expands it back.
pub(super) const SHIFT_FLAG_REPEAT: u32 = 2;

/// Where a repeat entry's period starts in its flags.
pub(super) const PERIOD_SHIFT: u32 = 8;

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

pub(super) const FLAG_BASELINE: u32 = 1;

pub(super) const FLAG_DENSE: u32 = 2;

pub(super) const FLAG_COMPRESSED: u32 = 4;

/// The most a compressed file's tables may expand to, per stored byte.
pub(super) const MAX_TABLE_RATIO: u64 = 1 << 16;

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

    pub(super) fn blocks(&self) -> u64 {
        self.data_bytes.div_ceil(u64::from(self.block_size))
    }

    /// Bytes of the frame table (a compressed file's stored block lengths).
    pub(super) fn frames_len(&self) -> u64 {
        if self.compressed.is_some() { self.blocks() * FRAME_ENTRY_LEN } else { 0 }
    }

    /// Bytes of data as stored: compressed, or the FIRST data itself.
    pub fn stored_bytes(&self) -> u64 {
        self.compressed.map_or(self.data_bytes, |(_, n)| n)
    }

    /// Where the stored data starts, given `stored_meta`, the bytes the
    /// tables and bitmap take as stored: after the header, (compressed) their
    /// length, the tables, and (compressed) the frame table.
    pub(super) fn data_start(&self, stored_meta: u64) -> u64 {
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
    pub(super) fn file_len_with(&self, limit: u64, stored_meta: u64) -> Result<u64, String> {
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

/// The file length a header describes (uncompressed).
pub(super) fn file_len_from(h: &DiffHeader) -> u64 {
    let meta = h.first_count * FIRST_ENTRY_LEN
        + h.shift_count * SHIFT_ENTRY_LEN
        + h.reference_count * REFERENCE_ENTRY_LEN
        + h.bitmap_len;
    HEADER_LEN + meta + h.data_bytes + (h.blocks() + 1) * DIGEST_LEN
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
pub(super) fn copy_range(pieces: &[&[u8]], range: std::ops::Range<u64>, f: &mut dyn FnMut(u64, &[u8])) {
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

/// The little-endian `u64` of an 8-byte slice.
pub(super) fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_le_bytes(a)
}
