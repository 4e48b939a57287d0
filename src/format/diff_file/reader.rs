//! Reading a diff file where it is stored: its metadata first, then only
//! the FIRST data a restore needs, block by block, each block checked
//! against its digest (and decompressed, for a compressed file).

use super::super::codec::Cursor;
use super::super::compress::Decompressor;
use super::header::*;
use super::tables::*;
use crate::diff::{Diff, FirstRun};
use crate::error::{Error, Result};
use crate::storage::{Posix, ReadAt, Storage};
use rayon::prelude::*;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;

/// Fills `buf` from `file` at `offset` in pieces of [`PARALLEL_READ`]
/// bytes, in parallel: one thread copies from the page cache at a fraction
/// of what the cores do together, and a device serves several requests at
/// once.
pub(super) fn read_parallel(file: &dyn ReadAt, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    buf.par_chunks_mut(PARALLEL_READ)
        .enumerate()
        .try_for_each(|(i, piece)| file.read_exact_at(piece, offset + (i * PARALLEL_READ) as u64))
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
    pub(super) fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.handle()?.read_exact_at(buf, offset).map_err(|e| Error::io(&self.path, e))
    }

    /// The open file (reopened if it was released). The lock is held only
    /// to take it: reads, and the parallel work on what they return, run
    /// without it.
    pub(super) fn handle(&self) -> Result<Arc<dyn ReadAt>> {
        let mut guard = crate::sync::lock(&self.file);
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
    pub(super) fn with_bytes<R>(
        &self,
        offset: u64,
        len: usize,
        buf: &mut Vec<u8>,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
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
        *crate::sync::lock(&self.file) = None;
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
    pub(super) fn locate_from(&self, mut k: usize, range: Range<u64>, mut f: impl FnMut(u64, u64)) -> Result<usize> {
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
    pub(super) fn block_span(&self, blocks: &Range<u64>) -> Result<(u64, usize, usize)> {
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
    pub(super) fn verify_each<T: Send>(
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
    pub(super) fn read_compressed(
        &self,
        codec: Codec,
        offsets: &[u64],
        blocks: Range<u64>,
        buf: &mut [u8],
    ) -> Result<()> {
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
pub(super) fn frame_offsets(h: &DiffHeader, table: &[u8]) -> Result<Vec<u64>, String> {
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
