//! The end-to-end benchmark behind `dckpt bench --e2e`: what an application
//! waits for, measured through the store in one process — each checkpoint
//! call to its return (split into the de-duplication pipeline, the host work
//! after it, and the durable write), the reopen a restart pays, the restore
//! of the last version, and every byte on disk — next to the naive
//! alternative in the same run (copy the whole buffer to the host, write it,
//! fsync).

use crate::bench::generate::{Shape, Workload};
use dckpt::backend::BackendKind;
use dckpt::backend::cuda::{self, Gpu};
use dckpt::engine::{CheckpointReport, Engine};
use dckpt::error::{Error, Result};
use dckpt::memory::{DeviceRegion, Protected};
use dckpt::store::StoreOptions;
use dckpt::tiers::{TierOptions, TieredEngine};
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What to run.
#[derive(Clone, Debug)]
pub struct E2eOptions {
    /// Bytes of the protected buffer.
    pub size: usize,
    /// Versions to checkpoint (the first is the baseline).
    pub versions: u32,
    /// Edit shape.
    pub shape: Shape,
    /// Fraction of bytes rewritten per version.
    pub change: f64,
    /// Bytes per scattered edit.
    pub granule: usize,
    /// Workload seed.
    pub seed: u64,
    /// Store parameters.
    pub store: StoreOptions,
    /// `cpu` (host buffer) or `cuda` (device buffer, a `DeviceRegion`).
    pub backend: BackendKind,
    /// Store directory (emptied first).
    pub dir: PathBuf,
    /// Also run the same versions through the asynchronous tiers (host
    /// cache of this many bytes; local and shared directories beside `dir`),
    /// in the same process.
    pub tiered_cache_bytes: Option<u64>,
    /// With the tiers: compress each file on its way to the first tier.
    pub compression: Option<dckpt::format::Compression>,
    /// With the tiers (CUDA): the GPU cache tier's share of the budget.
    pub gpu_cache: dckpt::backend::budget::GpuCache,
}

/// The same versions through the asynchronous tiers ([`dckpt::tiers`]).
#[derive(Clone, Debug, Serialize)]
pub struct E2eTiered {
    /// Host cache bytes.
    pub host_cache_bytes: u64,
    /// Bytes of the GPU cache tier's arena (CUDA; 0: none).
    pub gpu_cache_bytes: u64,
    /// Versions whose diff waited in the GPU cache for room in the host cache.
    pub held_on_gpu: usize,
    /// Per version: what the application waited (call to return), ms.
    pub checkpoint_ms: Vec<f64>,
    /// Medians over the incremental versions: the call, the backend's
    /// de-duplication and serialization, the copy into the cache, and the
    /// wait for room in it.
    pub median_checkpoint_ms: f64,
    /// Median backend time.
    pub median_dedup_ms: f64,
    /// Median copy into the host cache.
    pub median_cache_ms: f64,
    /// Median wait for room (backpressure).
    pub median_backpressure_ms: f64,
    /// From the last call's return until every version was durable on both tiers.
    pub drain_ms: f64,
    /// All versions, first call to durable everywhere.
    pub total_ms: f64,
    /// The synchronous run's sum of checkpoint calls, for comparison.
    pub sync_total_ms: f64,
    /// Median incremental application-visible time over the synchronous one's.
    pub ratio_to_sync: f64,
    /// The compression on the flush path, if any.
    pub compression: Option<String>,
    /// Bytes of every file on the shared tier (compressed, if so).
    pub shared_bytes: u64,
}

/// One checkpoint as the application saw it.
#[derive(Clone, Debug, Serialize)]
pub struct E2eVersion {
    /// Version.
    pub version: u64,
    /// Whether it is a baseline.
    pub baseline: bool,
    /// The checkpoint call, start to return.
    pub checkpoint_ms: f64,
    /// The de-duplication pipeline (GPU: kernels + D2H of the diff, CUDA
    /// events; CPU: de-duplication and serialization).
    pub pipeline_ms: f64,
    /// Host work after the pipeline, before the write (GPU backend).
    pub host_ms: f64,
    /// The durable write and commit.
    pub write_ms: f64,
    /// Bytes of the diff file.
    pub file_bytes: u64,
}

/// The whole run.
#[derive(Clone, Debug, Serialize)]
pub struct E2eReport {
    /// Backend used.
    pub backend: String,
    /// Device name (GPU) or "cpu".
    pub device: String,
    /// Buffer bytes.
    pub size: u64,
    /// Per version.
    pub versions: Vec<E2eVersion>,
    /// Medians over the incremental versions (all but the first).
    pub median_checkpoint_ms: f64,
    /// Median pipeline time.
    pub median_pipeline_ms: f64,
    /// Median host work.
    pub median_host_ms: f64,
    /// Median write time.
    pub median_write_ms: f64,
    /// Application-visible rate of the median incremental checkpoint (buffer bytes / time).
    pub checkpoint_gbps: f64,
    /// Naive alternative: copy the buffer to host memory (GPU: D2H into a
    /// new vector; CPU: memcpy).
    pub naive_copy_ms: f64,
    /// Naive alternative: write the copy to a file and fsync it.
    pub naive_write_ms: f64,
    /// Median incremental checkpoint over the naive copy + write (< 1: dckpt is faster).
    pub ratio_to_naive: f64,
    /// Reopening the store (a restart): total.
    pub reopen_ms: f64,
    /// Of which restoring the latest version.
    pub reopen_restore_ms: f64,
    /// Of which rebuilding the de-duplication state.
    pub reopen_rebuild_ms: f64,
    /// Restore of the last version into memory (GPU: onto the device).
    pub restore_ms: f64,
    /// Its rate.
    pub restore_gbps: f64,
    /// Where the restore's time went (host side).
    pub restore_stats: dckpt::restore::RestoreStats,
    /// The GPU restore's device side (H2D, scatter), CUDA backend.
    pub gpu_restore: Option<cuda::GpuRestoreTimings>,
    /// Sum of the diff files.
    pub diff_bytes: u64,
    /// Every byte of every file under the store directory.
    pub bytes_on_disk: u64,
    /// bytes_on_disk / diff_bytes − 1, in percent.
    pub disk_overhead_pct: f64,
    /// The asynchronous tiers, when asked for.
    pub tiered: Option<E2eTiered>,
}

/// The median of `v` (the upper one of an even count; 0 when empty).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Milliseconds since `t`.
pub(crate) fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// The buffer being protected, on the host or on the device.
pub(crate) enum Buffer {
    /// Host memory.
    Host(Vec<u8>),
    /// Device memory.
    Device(std::sync::Arc<Gpu>, cudarc::driver::CudaSlice<u8>),
}

impl Buffer {
    /// A buffer holding `bytes` where `backend` works (the device for
    /// CUDA), and the device's name (`cpu` on the host).
    pub(crate) fn new(backend: BackendKind, bytes: &[u8]) -> Result<(Self, String)> {
        Self::on(backend, bytes, 0)
    }

    /// As [`Buffer::new`], on CUDA device `ordinal`.
    pub(crate) fn on(backend: BackendKind, bytes: &[u8], ordinal: usize) -> Result<(Self, String)> {
        Ok(match backend {
            BackendKind::Cuda => {
                let gpu = Gpu::open(ordinal)?;
                let d = cuda::upload(&gpu, bytes)?;
                let name = gpu.name().to_string();
                (Buffer::Device(gpu, d), name)
            }
            _ => (Buffer::Host(bytes.to_vec()), "cpu".to_string()),
        })
    }

    /// Overwrites the buffer with `bytes` (the application's next state).
    pub(crate) fn load(&mut self, bytes: &[u8]) -> Result<()> {
        match self {
            Buffer::Host(v) => v.copy_from_slice(bytes),
            Buffer::Device(gpu, d) => cuda::upload_into(gpu, bytes, d)?,
        }
        Ok(())
    }

    /// The buffer as checkpoint input.
    pub(crate) fn protected(&self) -> Result<Protected<'_>> {
        Ok(match self {
            Buffer::Host(v) => Protected::Host(v),
            Buffer::Device(_, d) => Protected::Device(DeviceRegion::of(d)?),
        })
    }

    fn checkpoint(&self, engine: &mut Engine, version: u64) -> Result<CheckpointReport> {
        engine.checkpoint(version, self.protected()?)
    }

    /// The buffer as a restore's destination.
    pub(crate) fn protected_mut(&mut self) -> Result<dckpt::memory::ProtectedMut<'_>> {
        Ok(match self {
            Buffer::Host(v) => dckpt::memory::ProtectedMut::Host(v),
            Buffer::Device(_, d) => dckpt::memory::ProtectedMut::Device(DeviceRegion::of_mut(d)?),
        })
    }

    /// The naive copy to host memory.
    pub(crate) fn copy_out(&self) -> Result<Vec<u8>> {
        match self {
            Buffer::Host(v) => Ok(v.clone()),
            Buffer::Device(gpu, d) => gpu.stream_clone_dtoh(d),
        }
    }
}

/// Runs the benchmark; `progress` is called after each step with a label.
pub fn run(o: &E2eOptions, mut progress: impl FnMut(&str)) -> Result<E2eReport> {
    if o.dir.exists() {
        std::fs::remove_dir_all(&o.dir).map_err(|e| Error::io(&o.dir, e))?;
    }
    let backend = o.backend.resolve();
    let mut w = Workload::new(o.size, o.change, o.shape, o.seed)?.with_granule(o.granule)?;
    let (mut buf, device) = Buffer::new(backend, w.current())?;
    let len = o.size as u64;
    let mut engine = Engine::open_with_backend(&o.dir, 0, len, &o.store, backend)?;
    let mut versions = Vec::new();
    for v in 1..=u64::from(o.versions) {
        if v > 1 {
            w.advance();
            buf.load(w.current())?;
        }
        let t = Instant::now();
        let r = buf.checkpoint(&mut engine, v)?;
        let checkpoint_ms = ms(t);
        let (pipeline_ms, host_ms) = match &r.gpu {
            Some(g) => {
                let p = f64::from(g.h2d_ms + g.dedup_ms + g.d2h_ms);
                (p, (r.dedup_seconds * 1e3 - p).max(0.0))
            }
            None => (r.dedup_seconds * 1e3, 0.0),
        };
        versions.push(E2eVersion {
            version: v,
            baseline: r.baseline,
            checkpoint_ms,
            pipeline_ms,
            host_ms,
            write_ms: r.write_seconds * 1e3,
            file_bytes: r.file_bytes,
        });
        progress("checkpoint");
    }
    drop(engine);
    let tiered = match o.tiered_cache_bytes {
        Some(cache) => {
            let sync_total_ms = versions.iter().map(|v| v.checkpoint_ms).sum();
            let sync_median = median(versions.iter().skip(1).map(|v| v.checkpoint_ms).collect());
            Some(run_tiered(o, cache, backend, &mut buf, sync_total_ms, sync_median, &mut progress)?)
        }
        None => None,
    };
    // The naive alternative, twice (the median of two is the faster one: page cache warm-up).
    let naive_path = o.dir.join("naive.bin");
    let (mut copies, mut writes) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        let t = Instant::now();
        let host = buf.copy_out()?;
        copies.push(ms(t));
        let t = Instant::now();
        write_fsync(&naive_path, &host)?;
        writes.push(ms(t));
        std::fs::remove_file(&naive_path).map_err(|e| Error::io(&naive_path, e))?;
    }
    progress("naive");
    let t = Instant::now();
    let engine = Engine::open_with_backend(&o.dir, 0, len, &o.store, backend)?;
    let reopen_ms = ms(t);
    let opened = engine.open_report().clone();
    drop(engine);
    progress("reopen");
    let last = u64::from(o.versions);
    let t = Instant::now();
    match &buf {
        Buffer::Host(want) => {
            let (got, stats) = dckpt::restore::restore_with_stats(&o.dir, 0, last)?;
            let restore = (ms(t), stats, None);
            if got != *want {
                return Err(Error::Internal("the restored bytes differ from the last version".into()));
            }
            drop(got);
            let r = finish(o, backend, device, versions, (copies, writes), (reopen_ms, &opened), restore);
            Ok(E2eReport { tiered, ..r })
        }
        Buffer::Device(gpu, want) => {
            let (got, stats, timings) = cuda::restore_on_gpu(gpu, &o.dir, 0, last)?;
            let restore = (ms(t), stats, Some(timings));
            if gpu.stream_clone_dtoh(&got)? != gpu.stream_clone_dtoh(want)? {
                return Err(Error::Internal("the restored bytes differ from the last version".into()));
            }
            let r = finish(o, backend, device, versions, (copies, writes), (reopen_ms, &opened), restore);
            Ok(E2eReport { tiered, ..r })
        }
    }
}

/// The same versions again (the workload regenerated from its seed), through
/// the asynchronous tiers beside `o.dir`; the last version is checked on the
/// shared tier.
fn run_tiered(
    o: &E2eOptions,
    cache: u64,
    backend: BackendKind,
    buf: &mut Buffer,
    sync_total_ms: f64,
    sync_median_ms: f64,
    progress: &mut impl FnMut(&str),
) -> Result<E2eTiered> {
    let base = o.dir.with_extension("tiered");
    if base.exists() {
        std::fs::remove_dir_all(&base).map_err(|e| Error::io(&base, e))?;
    }
    let tiers = TierOptions {
        local: Some(base.join("local")),
        shared: Some(base.join("shared")),
        host_cache_bytes: cache,
        compression: o.compression,
        gpu_cache: o.gpu_cache,
        ..TierOptions::default()
    };
    let mut w = Workload::new(o.size, o.change, o.shape, o.seed)?.with_granule(o.granule)?;
    buf.load(w.current())?;
    let mut e = TieredEngine::open(0, o.size as u64, &o.store, &tiers, backend)?;
    let gpu_cache_bytes = e.device_plan().map_or(0, |p| p.cache_bytes);
    let mut reports = Vec::new();
    let start = Instant::now();
    for v in 1..=u64::from(o.versions) {
        if v > 1 {
            w.advance();
            buf.load(w.current())?;
        }
        reports.push(e.checkpoint(v, buf.protected()?)?);
        progress("tiered checkpoint");
    }
    let t = Instant::now();
    e.wait_all()?;
    let drain_ms = ms(t);
    let total_ms = ms(start);
    e.finalize()?;
    let shared = base.join("shared");
    let last = dckpt::restore::restore_version(&shared, 0, u64::from(o.versions))?;
    if last != w.current() {
        return Err(Error::Internal("the shared tier's last version differs".into()));
    }
    let shared_bytes = dckpt::inspect::bytes_on_disk(&shared);
    std::fs::remove_dir_all(&base).map_err(|e| Error::io(&base, e))?;
    let inc = || reports.iter().skip(1);
    let median_checkpoint_ms = median(inc().map(|r| r.total_seconds * 1e3).collect());
    Ok(E2eTiered {
        host_cache_bytes: cache,
        gpu_cache_bytes,
        held_on_gpu: reports.iter().filter(|r| r.held_on_gpu).count(),
        checkpoint_ms: reports.iter().map(|r| r.total_seconds * 1e3).collect(),
        median_checkpoint_ms,
        median_dedup_ms: median(inc().map(|r| r.dedup_seconds * 1e3).collect()),
        median_cache_ms: median(inc().map(|r| r.cache_seconds * 1e3).collect()),
        median_backpressure_ms: median(inc().map(|r| r.backpressure_seconds * 1e3).collect()),
        drain_ms,
        total_ms,
        sync_total_ms,
        ratio_to_sync: median_checkpoint_ms / sync_median_ms,
        compression: o.compression.map(|c| c.to_string()),
        shared_bytes,
    })
}

fn finish(
    o: &E2eOptions,
    backend: BackendKind,
    device: String,
    versions: Vec<E2eVersion>,
    (copies, writes): (Vec<f64>, Vec<f64>),
    (reopen_ms, opened): (f64, &dckpt::engine::OpenReport),
    (restore_ms, restore_stats, gpu_restore): (f64, dckpt::restore::RestoreStats, Option<cuda::GpuRestoreTimings>),
) -> E2eReport {
    let inc: Vec<&E2eVersion> = versions.iter().skip(1).collect();
    let med = |f: fn(&E2eVersion) -> f64| median(inc.iter().map(|v| f(v)).collect());
    let median_checkpoint_ms = med(|v| v.checkpoint_ms);
    let diff_bytes: u64 = versions.iter().map(|v| v.file_bytes).sum();
    let bytes_on_disk = dckpt::inspect::bytes_on_disk(&o.dir);
    let naive_copy_ms = median(copies);
    let naive_write_ms = median(writes);
    let gb = o.size as f64 / 1e9;
    E2eReport {
        backend: backend.to_string(),
        device,
        size: o.size as u64,
        median_checkpoint_ms,
        median_pipeline_ms: med(|v| v.pipeline_ms),
        median_host_ms: med(|v| v.host_ms),
        median_write_ms: med(|v| v.write_ms),
        checkpoint_gbps: gb / (median_checkpoint_ms / 1e3),
        naive_copy_ms,
        naive_write_ms,
        ratio_to_naive: median_checkpoint_ms / (naive_copy_ms + naive_write_ms),
        reopen_ms,
        reopen_restore_ms: opened.restore_seconds * 1e3,
        reopen_rebuild_ms: opened.rebuild_seconds * 1e3,
        restore_ms,
        restore_gbps: gb / (restore_ms / 1e3),
        restore_stats,
        gpu_restore,
        diff_bytes,
        bytes_on_disk,
        disk_overhead_pct: (bytes_on_disk as f64 / diff_bytes.max(1) as f64 - 1.0) * 100.0,
        versions,
        tiered: None,
    }
}

fn write_fsync(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(|e| Error::io(path, e))
}
