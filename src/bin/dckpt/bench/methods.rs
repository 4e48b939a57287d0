//! The in-memory benchmark behind `dckpt bench`: every method over the same
//! successive versions, with zstd-1, lz4, hashing alone and memcpy measured
//! in the same process as baselines.

use dckpt::dedup::{DedupInput, DedupState};
use dckpt::error::Result;
use dckpt::format::encode_diff;
use dckpt::hash::HashAlgo;
use dckpt::layout::Layout;
use dckpt::method::Method;
use rayon::prelude::*;
use serde::Serialize;
use std::time::Instant;

/// Result of one method or baseline over all versions.
#[derive(Clone, Debug, Serialize)]
pub struct BenchResult {
    /// Method or baseline name.
    pub name: String,
    /// Versions processed.
    pub versions: usize,
    /// Sum of the versions' sizes.
    pub logical_bytes: u64,
    /// Sum of what would be stored.
    pub stored_bytes: u64,
    /// Part of `stored_bytes` that is not data (methods only).
    pub metadata_bytes: u64,
    /// Total seconds.
    pub seconds: f64,
    /// Seconds of each version, in order.
    pub version_seconds: Vec<f64>,
    /// Stored bytes of each version, in order.
    pub version_stored: Vec<u64>,
}

impl BenchResult {
    /// Cumulative de-duplication (or compression) ratio.
    pub fn ratio(&self) -> f64 {
        self.logical_bytes as f64 / self.stored_bytes.max(1) as f64
    }

    /// Throughput in GB/s (10^9 bytes) over all versions.
    pub fn throughput_gbs(&self) -> f64 {
        self.logical_bytes as f64 / self.seconds.max(1e-12) / 1e9
    }

    /// Throughput in GB/s over the incremental versions only (all but the
    /// first), as the paper reports it. `None` with a single version.
    pub fn incremental_gbs(&self) -> Option<f64> {
        let n = self.version_seconds.len();
        if n < 2 {
            return None;
        }
        let per = self.logical_bytes as f64 / n as f64;
        let secs: f64 = self.version_seconds[1..].iter().sum();
        Some(per * (n - 1) as f64 / secs.max(1e-12) / 1e9)
    }

    /// De-duplication ratio over the incremental versions only.
    pub fn incremental_ratio(&self) -> Option<f64> {
        let n = self.version_stored.len();
        if n < 2 {
            return None;
        }
        let per = self.logical_bytes as f64 / n as f64;
        let stored: u64 = self.version_stored[1..].iter().sum();
        Some(per * (n - 1) as f64 / stored.max(1) as f64)
    }

    fn empty(name: &str) -> Self {
        BenchResult {
            name: name.into(),
            versions: 0,
            logical_bytes: 0,
            stored_bytes: 0,
            metadata_bytes: 0,
            seconds: 0.0,
            version_seconds: Vec::new(),
            version_stored: Vec::new(),
        }
    }

    fn add(&mut self, seconds: f64, logical: u64, stored: u64) {
        self.seconds += seconds;
        self.versions += 1;
        self.logical_bytes += logical;
        self.stored_bytes += stored;
        self.version_seconds.push(seconds);
        self.version_stored.push(stored);
    }
}

/// Runs `method` over `versions` (all the same length), as a checkpoint would:
/// de-duplicate, serialize into one buffer, commit the state.
pub fn run_method(
    method: Method,
    chunk_size: u32,
    hash: HashAlgo,
    versions: &[&[u8]],
    mut progress: impl FnMut(usize),
) -> Result<BenchResult> {
    let len = versions.first().map_or(0, |v| v.len());
    let layout = Layout::new(len as u64, chunk_size)?;
    let mut state = DedupState::new(layout, hash, 0);
    let mut r = BenchResult::empty(method.name());
    for (i, data) in versions.iter().enumerate() {
        let t = Instant::now();
        let input = DedupInput { data, version: i as u64 + 1, baseline: i == 0 };
        let outcome = method.deduplicator().deduplicate(&state, &input)?;
        let file = encode_diff(&outcome.diff, data);
        let data_bytes = outcome.diff.data_bytes();
        state.commit(outcome.pending);
        r.add(t.elapsed().as_secs_f64(), data.len() as u64, file.len() as u64);
        r.metadata_bytes += file.len() as u64 - data_bytes;
        progress(i);
    }
    Ok(r)
}

fn baseline(
    name: &str,
    versions: &[&[u8]],
    mut f: impl FnMut(&[u8]) -> u64,
    mut progress: impl FnMut(usize),
) -> BenchResult {
    let mut r = BenchResult::empty(name);
    for (i, data) in versions.iter().enumerate() {
        let t = Instant::now();
        let stored = f(data);
        r.add(t.elapsed().as_secs_f64(), data.len() as u64, stored);
        progress(i);
    }
    r
}

/// zstd level 1 of each version (single-threaded, as zstd's default).
pub fn run_zstd(versions: &[&[u8]], progress: impl FnMut(usize)) -> BenchResult {
    baseline("zstd-1", versions, |d| zstd::bulk::compress(d, 1).map_or(d.len() as u64, |c| c.len() as u64), progress)
}

/// lz4 (lz4_flex block format) of each version.
pub fn run_lz4(versions: &[&[u8]], progress: impl FnMut(usize)) -> BenchResult {
    baseline("lz4", versions, |d| lz4_flex::block::compress(d).len() as u64, progress)
}

/// Hashing every chunk and nothing else: the floor of any hashing method.
pub fn run_hash_only(
    chunk_size: u32,
    hash: HashAlgo,
    versions: &[&[u8]],
    progress: impl FnMut(usize),
) -> Result<BenchResult> {
    let len = versions.first().map_or(0, |v| v.len());
    let layout = Layout::new(len as u64, chunk_size)?;
    let cs = layout.chunk_size() as usize;
    let hash_all = |d: &[u8]| {
        let folded = d
            .par_chunks(cs * 4096)
            .map(|block| block.chunks(cs).fold(0u128, |acc, c| acc ^ hash.leaf(c).0))
            .reduce(|| 0, |a, b| a ^ b);
        std::hint::black_box(folded);
        layout.chunks() * 16
    };
    Ok(baseline(&format!("hash-{hash}"), versions, hash_all, progress))
}

/// A memcpy of each version into a reused buffer: the ceiling of any method
/// that must look at every byte (and the cost of a Full checkpoint's copy).
pub fn run_memcpy(versions: &[&[u8]], progress: impl FnMut(usize)) -> BenchResult {
    let mut buf = vec![0u8; versions.first().map_or(0, |v| v.len())];
    baseline(
        "memcpy",
        versions,
        |d| {
            buf.copy_from_slice(d);
            std::hint::black_box(&buf);
            d.len() as u64
        },
        progress,
    )
}
