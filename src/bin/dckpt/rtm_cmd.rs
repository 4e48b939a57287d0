//! `dckpt bench-rtm`: an adjoint run's checkpoints and restores through the
//! synchronous store and the asynchronous tiers (every eviction policy ×
//! hint mode), as HPDC'23 measures them.

use crate::bench::rtm::{self as bench_rtm, Hints, Order, RtmOptions, RtmReport, Sizes};
use clap::Args;
use dckpt::backend::BackendKind;
use dckpt::sizes::parse_size;
use dckpt::tiers::arena::Policy;
use dckpt::{Error, Method, Result, StoreOptions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `dckpt bench-rtm`.
#[derive(Args)]
pub struct RtmArgs {
    /// Bytes of the buffer.
    #[arg(long, default_value = "256M")]
    size: String,
    /// Versions of the forward pass.
    #[arg(long, default_value_t = 16)]
    versions: u32,
    /// uniform (every version rewrites the buffer) or variable (1–100%).
    #[arg(long, default_value = "uniform")]
    sizes: Sizes,
    /// reverse or irregular.
    #[arg(long, default_value = "reverse")]
    order: Order,
    /// Eviction policies to compare.
    #[arg(long, value_delimiter = ',', default_value = "fifo,lru,gap-aware")]
    policies: Vec<Policy>,
    /// Hint modes to compare.
    #[arg(long, value_delimiter = ',', default_value = "none,one,all")]
    hints: Vec<Hints>,
    /// Compute interval between checkpoints and before each restore, ms.
    #[arg(long, default_value_t = 50)]
    compute_ms: u64,
    /// Host cache of the tiers (write side); default: 4 buffers.
    #[arg(long)]
    host_cache: Option<String>,
    /// Restore cache of the tiers; default: 4 buffers.
    #[arg(long)]
    restore_cache: Option<String>,
    /// Also flush to a shared tier (else the local directory only).
    #[arg(long)]
    shared: bool,
    /// Drop the tiers' page cache before each restore (reads from the device).
    #[arg(long)]
    cold: bool,
    /// Chunk size (Tree).
    #[arg(long, default_value_t = 128)]
    chunk_size: u32,
    /// Longest chain before a baseline.
    #[arg(long, default_value_t = 4)]
    max_chain: u64,
    /// cpu, cuda or auto.
    #[arg(long, default_value = "auto")]
    backend: BackendKind,
    /// CUDA backend: device memory dckpt may hold, a multiple of the buffer
    /// (1.5x) or a size (6G).
    #[arg(long, default_value = "1.5x")]
    gpu_memory: dckpt::sizes::GpuMemory,
    /// CUDA backend: the tiers' GPU cache tier, its share of --gpu-memory
    /// (auto: what the budget leaves spare; 0: none; or a size).
    #[arg(long, default_value = "auto")]
    gpu_cache: dckpt::backend::budget::GpuCache,
    /// Scratch directory (emptied first, removed after).
    #[arg(long, default_value = "bench-data/rtm")]
    dir: PathBuf,
    /// Workload seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print CSV rows (with the header line first when this is "header").
    #[arg(long)]
    csv: Option<String>,
    /// Also write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// The CSV columns, in order.
const HEADER: &str = "device,backend,size,versions,sizes,order,compute_ms,host_cache,restore_cache,cold,engine,hints,\
checkpoint_s,backpressure_s,restore_s,checkpoint_gbps,restore_gbps,wall_s,ckpt_speedup,restore_speedup,hit_bytes,\
miss_bytes,prefetched,retained,evicted,inflight_bytes";

/// Runs the comparison and prints a table (or CSV rows).
pub fn run(a: RtmArgs) -> Result<ExitCode> {
    let size = usize::try_from(parse_size(&a.size)?).map_err(|_| Error::InvalidOption("size too large".into()))?;
    let bytes_or = |s: &Option<String>| s.as_deref().map_or(Ok(4 * size as u64), parse_size);
    let o = RtmOptions {
        size,
        versions: a.versions,
        sizes: a.sizes,
        order: a.order,
        policies: a.policies,
        hints: a.hints,
        compute: Duration::from_millis(a.compute_ms),
        host_cache_bytes: bytes_or(&a.host_cache)?,
        restore_cache_bytes: bytes_or(&a.restore_cache)?,
        shared: a.shared,
        cold: a.cold,
        store: StoreOptions {
            chunk_size: a.chunk_size,
            method: Method::Tree,
            max_chain: Some(a.max_chain),
            gpu_memory: a.gpu_memory,
            ..StoreOptions::default()
        },
        gpu_cache: a.gpu_cache,
        backend: a.backend,
        dir: a.dir,
        seed: a.seed,
    };
    let steps = 2 * o.versions as usize * (1 + o.policies.len() * o.hints.len());
    let pb = crate::progress::bar(steps, "steps");
    let r = bench_rtm::run(&o, |_| pb.inc(1))?;
    pb.finish_and_clear();
    if let Some(path) = &a.json {
        crate::report::write_json(path, "bench-rtm", &r)?;
    }
    match a.csv.as_deref() {
        Some(mode) => print_csv(&r, mode == "header"),
        None => print_table(&r),
    }
    Ok(ExitCode::SUCCESS)
}

fn print_csv(r: &RtmReport, header: bool) {
    if header {
        println!("{HEADER}");
    }
    let base = &r.runs[0];
    for run in &r.runs {
        println!(
            "{},{},{},{},{:?},{:?},{},{},{},{},{},{},{:.4},{:.4},{:.4},{:.3},{:.3},{:.3},{:.2},{:.2},{},{},{},{},{},{}",
            r.device.replace(',', " "),
            r.backend,
            r.size,
            r.versions,
            r.sizes,
            r.order,
            r.compute_ms,
            r.host_cache_bytes,
            r.restore_cache_bytes,
            r.cold,
            run.engine,
            run.hints,
            run.checkpoint_seconds,
            run.backpressure_seconds,
            run.restore_seconds,
            run.checkpoint_gbps,
            run.restore_gbps,
            run.wall_seconds,
            base.checkpoint_seconds / run.checkpoint_seconds.max(1e-9),
            base.restore_seconds / run.restore_seconds.max(1e-9),
            run.cache.hit_bytes,
            run.cache.miss_bytes,
            run.cache.prefetched_files,
            run.cache.retained_files,
            run.cache.evicted_files,
            run.cache.inflight_bytes
        );
    }
}

fn print_table(r: &RtmReport) {
    println!(
        "{} ({}): {} versions of {} bytes, {:?} sizes ({} bytes of diffs), {:?} restores, compute {} ms, \
         host cache {} B, restore cache {} B{}",
        r.device,
        r.backend,
        r.versions,
        r.size,
        r.sizes,
        r.diff_bytes,
        r.order,
        r.compute_ms,
        r.host_cache_bytes,
        r.restore_cache_bytes,
        if r.cold { ", cold reads" } else { "" }
    );
    println!(
        "{:<10} {:<5} {:>9} {:>8} {:>9} {:>8} {:>8} {:>8} {:>8} {:>7} {:>6} {:>6}",
        "engine",
        "hints",
        "ckpt GB/s",
        "x sync",
        "rest GB/s",
        "x sync",
        "wall s",
        "hit MB",
        "fly MB",
        "miss MB",
        "pref",
        "evict"
    );
    let base = &r.runs[0];
    for run in &r.runs {
        println!(
            "{:<10} {:<5} {:>9.2} {:>8.2} {:>9.2} {:>8.2} {:>8.2} {:>8.0} {:>8.0} {:>7.0} {:>6} {:>6}",
            run.engine,
            run.hints,
            run.checkpoint_gbps,
            base.checkpoint_seconds / run.checkpoint_seconds.max(1e-9),
            run.restore_gbps,
            base.restore_seconds / run.restore_seconds.max(1e-9),
            run.wall_seconds,
            run.cache.hit_bytes as f64 / 1e6,
            run.cache.inflight_bytes as f64 / 1e6,
            run.cache.miss_bytes as f64 / 1e6,
            run.cache.prefetched_files,
            run.cache.evicted_files
        );
    }
}
