//! Compression of a diff file's FIRST data, block by block (format v2,
//! flag bit 2; docs/FORMAT.md "Compressed data").
//!
//! ```text
//! plain:       header | tables        | data                        | block digests | trailer
//! compressed:  header | M | tables(M) | frame table | stored blocks | block digests | trailer
//! ```
//!
//! The tables (FIRST, SHIFT, references, bitmap) are compressed as one
//! frame of `M` bytes (stored as they are when that does not shrink them:
//! `M` is then their raw length, which the header's counts give); a reader
//! decodes them whole when it opens the file, as it does plain tables. Each
//! 64 KiB integrity block of data is compressed on its own, so a restore
//! still reads (and decompresses) only the blocks it needs; the frame table
//! holds each block's stored length (a block that would not shrink is stored
//! as it is: its stored length is then its raw length). The block digests
//! stay those of the raw bytes, so compressing a file hashes nothing new:
//! its trailer covers everything before the data and the block digests.
//!
//! The asynchronous tiers compress in the first tier's flush worker, off the
//! application's path ([`crate::tiers::TierOptions::compression`]).

pub use super::diff_file::header::{Codec, FRAME_ENTRY_LEN, META_PREFIX_LEN};
use super::diff_file::header::{DIGEST_LEN, DiffHeader, HEADER_LEN};
use crate::error::{Error, Result};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fmt;
use std::ops::Range;
use std::str::FromStr;

/// How a diff file's data is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// LZ4 block format (`lz4_flex`): fast, modest ratios.
    Lz4,
    /// Zstandard at `level` (1 is fast; higher levels trade speed for size).
    Zstd {
        /// The compression level (1..=22; negative levels are faster still).
        level: i32,
    },
}

impl Compression {
    /// The codec it writes.
    pub fn codec(self) -> Codec {
        match self {
            Compression::Lz4 => Codec::Lz4,
            Compression::Zstd { .. } => Codec::Zstd,
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compression::Lz4 => f.write_str("lz4"),
            Compression::Zstd { level } => write!(f, "zstd:{level}"),
        }
    }
}

impl FromStr for Compression {
    type Err = Error;
    /// `lz4`, `zstd` (level 1) or `zstd:LEVEL`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::InvalidOption(format!("unknown compression '{s}' (expected lz4, zstd or zstd:LEVEL)"));
        match s.split_once(':') {
            None if s == "lz4" => Ok(Compression::Lz4),
            None if s == "zstd" => Ok(Compression::Zstd { level: 1 }),
            Some(("zstd", level)) => {
                let level: i32 = level.parse().map_err(|_| bad())?;
                if zstd::compression_level_range().contains(&level) {
                    Ok(Compression::Zstd { level })
                } else {
                    Err(Error::InvalidOption(format!(
                        "zstd level {level} is outside {:?}",
                        zstd::compression_level_range()
                    )))
                }
            }
            _ => Err(bad()),
        }
    }
}

/// A plain diff file, given as consecutive `pieces` of `file_len` bytes in
/// all, compressed with `how`: the same file in the compressed form (its
/// last 32 bytes, the plain file's trailer, are not read, so a file handed
/// over unsealed compresses as it is). Blocks are compressed in parallel.
pub fn compress_file(pieces: &[&[u8]], file_len: u64, how: Compression) -> std::result::Result<Vec<u8>, String> {
    let file = Pieces::new(pieces);
    if file.len != file_len {
        return Err(format!("{} bytes handed over for a {file_len}-byte file", file.len));
    }
    let head = file.get(0..HEADER_LEN.min(file_len))?;
    let plain = DiffHeader::decode(&head)?;
    if plain.compressed.is_some() {
        return Err("the file is already compressed".into());
    }
    let expected = plain.file_len(file_len)?;
    if expected != file_len {
        return Err(format!("file is {file_len} bytes but its header describes {expected}"));
    }
    let data_start = HEADER_LEN + plain.meta_len(file_len)?;
    let data_end = data_start + plain.data_bytes;
    let bs = u64::from(plain.block_size);
    let blocks = plain.data_bytes.div_ceil(bs);
    let stored: Vec<Cow<'_, [u8]>> = (0..blocks)
        .into_par_iter()
        .map_init(
            || Compressor::new(how),
            |z, b| -> std::result::Result<Cow<'_, [u8]>, String> {
                let raw = file.get(data_start + b * bs..(data_start + (b + 1) * bs).min(data_end))?;
                match z.compress(&raw)? {
                    Some(small) if small.len() < raw.len() => Ok(Cow::Owned(small)),
                    _ => Ok(raw),
                }
            },
        )
        .collect::<std::result::Result<_, _>>()?;
    let stored_bytes: u64 = stored.iter().map(|b| b.len() as u64).sum();
    let header = DiffHeader { compressed: Some((how.codec(), stored_bytes)), ..plain };
    let raw_meta = file.get(HEADER_LEN..data_start)?;
    let meta = match Compressor::new(how).compress(&raw_meta)? {
        Some(small) if small.len() < raw_meta.len() => Cow::Owned(small),
        _ => raw_meta,
    };
    let digests = file.get(data_end..file_len - DIGEST_LEN)?;
    let frames_len = (blocks * FRAME_ENTRY_LEN) as usize;
    let total =
        (HEADER_LEN + META_PREFIX_LEN) as usize + meta.len() + frames_len + stored_bytes as usize + digests.len() + 32;
    let mut out = Vec::with_capacity(total);
    header.encode(&mut out);
    out.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    out.extend_from_slice(&meta);
    for b in &stored {
        // Each stored block is at most one block (64 KiB): it fits a u32.
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    }
    let data_at = out.len();
    for b in &stored {
        out.extend_from_slice(b);
    }
    let digests_at = out.len();
    out.extend_from_slice(&digests);
    let trailer = super::diff_file::trailer_of_parts(&[&out[..data_at], &out[digests_at..]]);
    out.extend_from_slice(&trailer);
    debug_assert_eq!(out.len(), total);
    Ok(out)
}

/// One thread's compressor.
enum Compressor {
    Lz4,
    Zstd(std::result::Result<zstd::bulk::Compressor<'static>, String>),
}

impl Compressor {
    fn new(how: Compression) -> Self {
        match how {
            Compression::Lz4 => Compressor::Lz4,
            Compression::Zstd { level } => {
                Compressor::Zstd(zstd::bulk::Compressor::new(level).map_err(|e| format!("zstd: {e}")))
            }
        }
    }

    /// The compressed block (`None` when the codec gave up).
    fn compress(&mut self, raw: &[u8]) -> std::result::Result<Option<Vec<u8>>, String> {
        match self {
            Compressor::Lz4 => Ok(Some(lz4_flex::block::compress(raw))),
            Compressor::Zstd(Ok(z)) => Ok(z.compress(raw).ok()),
            Compressor::Zstd(Err(e)) => Err(e.clone()),
        }
    }
}

/// One thread's decompressor (the reader keeps one per rayon job).
pub(crate) enum Decompressor {
    /// LZ4 needs no state.
    Lz4,
    /// A zstd context, if one could be made.
    Zstd(Option<zstd::bulk::Decompressor<'static>>),
}

impl Decompressor {
    /// A decompressor for `codec`.
    pub(crate) fn new(codec: Codec) -> Self {
        match codec {
            Codec::Lz4 => Decompressor::Lz4,
            Codec::Zstd => Decompressor::Zstd(zstd::bulk::Decompressor::new().ok()),
        }
    }

    /// Decompresses `stored` into exactly `out.len()` bytes; the reason when
    /// it cannot (damaged bytes, or another length).
    pub(crate) fn decompress(&mut self, stored: &[u8], out: &mut [u8]) -> std::result::Result<(), String> {
        let n = match self {
            Decompressor::Lz4 => lz4_flex::block::decompress_into(stored, out).map_err(|e| e.to_string())?,
            Decompressor::Zstd(Some(z)) => z.decompress_to_buffer(stored, out).map_err(|e| e.to_string())?,
            Decompressor::Zstd(None) => return Err("no zstd context".into()),
        };
        if n == out.len() { Ok(()) } else { Err(format!("it holds {n} bytes, not {}", out.len())) }
    }
}

/// A file given as consecutive pieces, read by byte range.
struct Pieces<'a> {
    pieces: &'a [&'a [u8]],
    starts: Vec<u64>,
    len: u64,
}

impl<'a> Pieces<'a> {
    fn new(pieces: &'a [&'a [u8]]) -> Self {
        let mut starts = Vec::with_capacity(pieces.len());
        let mut at = 0u64;
        for p in pieces {
            starts.push(at);
            at += p.len() as u64;
        }
        Pieces { pieces, starts, len: at }
    }

    /// The bytes of `range`: borrowed when one piece holds them, else copied.
    fn get(&self, range: Range<u64>) -> std::result::Result<Cow<'a, [u8]>, String> {
        if range.start > range.end || range.end > self.len {
            return Err(format!("bytes {range:?} lie past the file's {} bytes", self.len));
        }
        let k = self.starts.partition_point(|&s| s <= range.start).saturating_sub(1);
        let (lo, p) = (self.starts.get(k).copied().unwrap_or(0), self.pieces.get(k).copied().unwrap_or(&[]));
        if range.end - lo <= p.len() as u64 {
            return Ok(Cow::Borrowed(&p[(range.start - lo) as usize..(range.end - lo) as usize]));
        }
        let mut out = Vec::with_capacity((range.end - range.start) as usize);
        for (s, p) in self.starts[k..].iter().zip(&self.pieces[k..]) {
            let (a, b) = (range.start.max(*s), range.end.min(s + p.len() as u64));
            if a < b {
                out.extend_from_slice(&p[(a - s) as usize..(b - s) as usize]);
            }
            if s + p.len() as u64 >= range.end {
                break;
            }
        }
        Ok(Cow::Owned(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_names_parse_and_print() {
        for (s, c) in [("lz4", Compression::Lz4), ("zstd", Compression::Zstd { level: 1 })] {
            assert_eq!(s.parse::<Compression>().unwrap(), c);
        }
        assert_eq!("zstd:7".parse::<Compression>().unwrap(), Compression::Zstd { level: 7 });
        assert_eq!(Compression::Zstd { level: 3 }.to_string(), "zstd:3");
        for bad in ["gzip", "zstd:x", "zstd:99", "lz4:1", ""] {
            assert!(bad.parse::<Compression>().is_err(), "{bad}");
        }
    }

    #[test]
    fn pieces_read_ranges_across_boundaries() {
        let whole: Vec<u8> = (0..=255).collect();
        let parts: Vec<&[u8]> = vec![&whole[..10], &whole[10..10], &whole[10..100], &whole[100..]];
        let p = Pieces::new(&parts);
        for (a, b) in [(0, 0), (0, 10), (5, 15), (10, 100), (99, 101), (0, 256), (255, 256)] {
            assert_eq!(&*p.get(a..b).unwrap(), &whole[a as usize..b as usize], "{a}..{b}");
        }
        assert!(p.get(250..257).is_err());
    }
}
