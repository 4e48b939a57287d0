//! `dckpt bench-compression`: what de-duplication, compression and both
//! store for the same versions (issue #9's comparison), on the synthetic
//! edits of [`crate::bench::generate`] and the simulations of [`crate::bench::simulate`].
//!
//! For each version, in one process:
//! - **full**: the buffer's bytes;
//! - **zstd alone / lz4 alone**: the whole buffer compressed (zstd level 1;
//!   lz4 block format), what a compressing checkpointer without
//!   de-duplication stores;
//! - **de-dup**: the diff file a Tree engine writes (every byte of it);
//! - **de-dup + zstd / + lz4**: the same file compressed as the flush path
//!   compresses it ([`dckpt::format::compress_file`]).
//!
//! Sums over the versions; ratios are full bytes over stored bytes.

use crate::bench::generate::Workload;
use crate::bench::simulate::SimWorkload;
use dckpt::engine::Engine;
use dckpt::error::{Error, Result};
use dckpt::format::{Compression, compress_file};
use dckpt::store::StoreOptions;
use serde::Serialize;
use std::path::Path;
use std::time::Instant;

/// A buffer that evolves version by version.
pub enum Evolving {
    /// Synthetic edits.
    Synthetic(Workload),
    /// A simulation.
    Simulation(SimWorkload),
}

impl Evolving {
    fn current(&self) -> &[u8] {
        match self {
            Evolving::Synthetic(w) => w.current(),
            Evolving::Simulation(s) => s.current(),
        }
    }

    fn advance(&mut self) {
        match self {
            Evolving::Synthetic(w) => w.advance(),
            Evolving::Simulation(s) => s.advance(),
        }
    }
}

/// Bytes stored by each scheme over all versions, and the compressors' times.
#[derive(Clone, Debug, Serialize)]
pub struct CompressionStudy {
    /// The workload's name.
    pub workload: String,
    /// Bytes of the buffer.
    pub size: u64,
    /// Versions taken.
    pub versions: u32,
    /// Chunk size of the de-duplication.
    pub chunk_size: u32,
    /// Every version whole.
    pub full_bytes: u64,
    /// Every version compressed with zstd level 1.
    pub zstd_bytes: u64,
    /// Every version compressed with lz4.
    pub lz4_bytes: u64,
    /// The diff files.
    pub dedup_bytes: u64,
    /// Of which tables, bitmaps, digests and headers (not FIRST data).
    pub dedup_meta_bytes: u64,
    /// The diff files compressed with zstd level 1.
    pub dedup_zstd_bytes: u64,
    /// The diff files compressed with lz4.
    pub dedup_lz4_bytes: u64,
    /// Seconds compressing whole versions with zstd (one thread, as zstd's default).
    pub zstd_seconds: f64,
    /// Seconds compressing the diff files with zstd (blocks in parallel).
    pub dedup_zstd_seconds: f64,
    /// Seconds compressing the diff files with lz4 (blocks in parallel).
    pub dedup_lz4_seconds: f64,
}

impl CompressionStudy {
    /// Full bytes over stored bytes of a scheme.
    pub fn ratio(&self, stored: u64) -> f64 {
        self.full_bytes as f64 / stored.max(1) as f64
    }
}

/// Runs `versions` versions of `source` through a Tree engine in `dir`
/// (emptied first) and every compressor; calls `progress` after each.
pub fn run(
    name: &str,
    mut source: Evolving,
    versions: u32,
    store: &StoreOptions,
    dir: &Path,
    mut progress: impl FnMut(u32),
) -> Result<CompressionStudy> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    let size = source.current().len() as u64;
    let mut engine = Engine::open_or_create(dir, 0, size, store)?;
    let zstd1 = Compression::Zstd { level: 1 };
    let mut s = CompressionStudy {
        workload: name.to_string(),
        size,
        versions,
        chunk_size: store.chunk_size,
        full_bytes: 0,
        zstd_bytes: 0,
        lz4_bytes: 0,
        dedup_bytes: 0,
        dedup_meta_bytes: 0,
        dedup_zstd_bytes: 0,
        dedup_lz4_bytes: 0,
        zstd_seconds: 0.0,
        dedup_zstd_seconds: 0.0,
        dedup_lz4_seconds: 0.0,
    };
    for v in 1..=u64::from(versions) {
        if v > 1 {
            source.advance();
        }
        let data = source.current();
        s.full_bytes += size;
        let t = Instant::now();
        s.zstd_bytes += zstd::bulk::compress(data, 1).map_err(|e| Error::Internal(format!("zstd: {e}")))?.len() as u64;
        s.zstd_seconds += t.elapsed().as_secs_f64();
        s.lz4_bytes += lz4_flex::block::compress(data).len() as u64;
        engine.checkpoint(v, data)?;
        let path = engine.store().diff_path(v);
        let file = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        s.dedup_bytes += file.len() as u64;
        s.dedup_meta_bytes += dckpt::format::DiffReader::open(&path)?.metadata_bytes();
        let len = file.len() as u64;
        let compress = |how| compress_file(&[&file], len, how).map_err(|e| Error::corrupt(&path, e));
        let t = Instant::now();
        s.dedup_zstd_bytes += compress(zstd1)?.len() as u64;
        s.dedup_zstd_seconds += t.elapsed().as_secs_f64();
        let t = Instant::now();
        s.dedup_lz4_bytes += compress(Compression::Lz4)?.len() as u64;
        s.dedup_lz4_seconds += t.elapsed().as_secs_f64();
        progress(v as u32);
    }
    drop(engine);
    std::fs::remove_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    Ok(s)
}
