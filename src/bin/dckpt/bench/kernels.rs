//! The GPU benchmark behind `dckpt bench --backend cuda`: every method over
//! the same versions held in device memory, timed with CUDA events, with the
//! device-to-device copy and the pinned D2H bandwidth measured in the same
//! process as ceilings ([`Gpu::copy_ceilings`]).

use dckpt::backend::budget::GpuCache;
use dckpt::backend::cuda::{self, Gpu, GpuDedup};
use dckpt::error::Result;
use dckpt::hash::HashAlgo;
use dckpt::layout::Layout;
use dckpt::memory::{DeviceRegion, Protected};
use dckpt::method::Method;
use serde::Serialize;
use std::sync::Arc;

/// One method over all versions.
#[derive(Clone, Debug, Serialize)]
pub struct GpuBenchRow {
    /// Method name.
    pub method: String,
    /// Chunk size.
    pub chunk_size: u32,
    /// Versions measured.
    pub versions: usize,
    /// Bytes per version.
    pub version_bytes: u64,
    /// logical / stored over the incremental versions (all but the first).
    pub incremental_ratio: f64,
    /// Data size / (de-dup + serialize + D2H), incremental versions, GB/s.
    pub incremental_gbs: f64,
    /// The same for the first version.
    pub first_gbs: f64,
    /// Metadata bytes over the incremental versions.
    pub metadata_bytes: u64,
    /// Mean milliseconds of de-dup + serialize per incremental version.
    pub dedup_ms: f64,
    /// Mean milliseconds of the D2H copy per incremental version.
    pub d2h_ms: f64,
    /// Device memory in use at the end (all buffers), bytes.
    pub device_bytes: u64,
    /// Record entries and table bytes at the end.
    pub record_entries: u64,
    /// Bytes of device memory the record table occupies.
    pub record_bytes: u64,
    /// Device memory the de-duplication state holds (its plan within the budget).
    pub plan_bytes: u64,
    /// Incremental versions a bound of the budget stored whole.
    pub stored_whole: u64,
    /// Incremental versions that restarted the record to stay within it.
    pub record_restarts: u64,
}

/// Runs `methods` over `versions` (host copies; each is uploaded to one device
/// buffer before it is checkpointed, untimed) at `chunk_size`.
pub fn run(
    gpu: &Arc<Gpu>,
    methods: &[Method],
    chunk_size: u32,
    hash: HashAlgo,
    versions: &[&[u8]],
    budget: dckpt::sizes::GpuMemory,
    mut progress: impl FnMut(&str, usize),
) -> Result<Vec<GpuBenchRow>> {
    let len = versions.first().map_or(0, |v| v.len());
    let layout = Layout::new(len as u64, chunk_size)?;
    let mut data = cuda::upload(gpu, &vec![0u8; len])?;
    let mut dev = GpuDedup::with_budget(gpu.clone(), layout, hash, Method::Tree, 0, budget, GpuCache::NONE)?;
    let mut rows = Vec::new();
    for &method in methods {
        dev.reset(method)?;
        let mut bounds = dev.bounds_hit();
        let (mut first_s, mut incr_s, mut stored, mut meta, mut dedup, mut d2h) = (0.0, 0.0, 0u64, 0u64, 0.0, 0.0);
        for (i, v) in versions.iter().enumerate() {
            cuda::upload_into(gpu, v, &mut data)?;
            let c = dev.compute(i as u64 + 1, Protected::Device(DeviceRegion::of(&data)?), i == 0)?;
            let (body, data_start, t) = (c.data_start + c.data_len, c.data_start, c.timings);
            dev.commit()?;
            if i == 0 {
                bounds = dev.bounds_hit();
            }
            let secs = f64::from(t.dedup_ms + t.d2h_ms) / 1e3;
            if i == 0 {
                first_s = secs;
            } else {
                incr_s += secs;
                let d = (body - data_start) as u64;
                let file = body as u64 + 32 * d.div_ceil(65536) + 32;
                stored += file;
                meta += file - d;
                dedup += f64::from(t.dedup_ms);
                d2h += f64::from(t.d2h_ms);
            }
            progress(method.name(), i);
        }
        let incr = versions.len().saturating_sub(1).max(1) as f64;
        let (free, total) = gpu.memory()?;
        rows.push(GpuBenchRow {
            method: method.name().into(),
            chunk_size,
            versions: versions.len(),
            version_bytes: len as u64,
            incremental_ratio: incr * len as f64 / stored.max(1) as f64,
            incremental_gbs: incr * len as f64 / incr_s.max(1e-12) / 1e9,
            first_gbs: len as f64 / first_s.max(1e-12) / 1e9,
            metadata_bytes: meta,
            dedup_ms: dedup / incr,
            d2h_ms: d2h / incr,
            device_bytes: (total - free) as u64,
            record_entries: dev.record_entries(),
            record_bytes: dev.record_bytes(),
            plan_bytes: dev.plan().device_bytes(),
            stored_whole: dev.bounds_hit().stored_whole - bounds.stored_whole,
            record_restarts: dev.bounds_hit().record_restarts - bounds.record_restarts,
        });
    }
    Ok(rows)
}
