//! bench and gen.

use crate::bench::generate::{Shape, Workload};
use crate::bench::methods::{self as bench, BenchResult};
use clap::Args;
use dckpt::backend::BackendKind;
use dckpt::sizes::parse_size;
use dckpt::{Error, HashAlgo, Method, Result};
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `dckpt bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// tree, list, basic, full or all.
    #[arg(long, default_value = "all")]
    method: String,
    /// Chunk size in bytes.
    #[arg(long, default_value_t = 128)]
    chunk_size: u32,
    /// Several chunk sizes in one run (CUDA backend), e.g. 64,128,512.
    #[arg(long, value_delimiter = ',')]
    chunk_sizes: Vec<u32>,
    /// Digest algorithm.
    #[arg(long, default_value = "murmur3")]
    hash: HashAlgo,
    /// Baselines to run in the same process: all (hashing alone, zstd-1, lz4,
    /// memcpy), hash (hashing alone) or none.
    #[arg(long, default_value = "all", value_parser = ["all", "hash", "none"])]
    baselines: String,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// cpu or cuda (cuda keeps the versions in device memory and times with CUDA events).
    #[arg(long, default_value = "cpu")]
    backend: BackendKind,
    /// CUDA backend: device memory the de-duplication may hold, a multiple
    /// of the buffer (1.5x) or a size (6G); `whole` counts the versions a
    /// bound stored whole / that restarted the record.
    #[arg(long, default_value = "1.5x")]
    gpu_memory: dckpt::sizes::GpuMemory,
    /// Generate the versions instead of reading files: SHAPE:CHANGE, e.g. clustered:0.01.
    #[arg(long)]
    synthetic: Option<String>,
    /// Bytes per generated version.
    #[arg(long, default_value = "1G")]
    size: String,
    /// Number of generated versions.
    #[arg(long, default_value_t = 10)]
    versions: u32,
    /// Seed of the generated versions.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Bytes rewritten by each scattered edit.
    #[arg(long, default_value_t = crate::bench::generate::GRANULE)]
    granule: usize,
    /// CUDA backend: also checkpoint every version with Tree into a store in
    /// this directory and time a GPU restore of the last one.
    #[arg(long)]
    restore_dir: Option<PathBuf>,
    /// End to end through a store in this directory (emptied first): each
    /// checkpoint call to its return (pipeline / host work / write), reopen,
    /// restore of the last version and bytes on disk, next to copying the
    /// whole buffer and writing it with fsync. Takes --synthetic, --size,
    /// --versions, --chunk-size, --method (one), --hash and --backend
    /// (cuda: the buffer lives in device memory).
    #[arg(long, requires = "synthetic")]
    e2e: Option<PathBuf>,
    /// With --e2e: also run the versions through the asynchronous tiers
    /// (local and shared directories beside DIR) with a host cache of this
    /// size (e.g. 1G), and compare what the application waits for.
    #[arg(long, requires = "e2e")]
    tiered: Option<String>,
    /// With --tiered: compress each file on its way from the host cache to
    /// the first tier (lz4, zstd or zstd:LEVEL).
    #[arg(long, requires = "tiered")]
    compress: Option<dckpt::format::Compression>,
    /// With --tiered, CUDA: the GPU cache tier's share of --gpu-memory
    /// (auto: what the budget leaves spare; 0: none; or a size).
    #[arg(long, default_value = "auto", requires = "tiered")]
    gpu_cache: dckpt::backend::budget::GpuCache,
    /// Successive versions of one rank's buffer (same length).
    #[arg(required_unless_present = "synthetic")]
    files: Vec<PathBuf>,
}

/// Arguments of `dckpt gen`.
#[derive(Args)]
pub struct GenArgs {
    /// Bytes per version (4096, 64M, 1G, ...).
    #[arg(long)]
    size: String,
    /// Number of versions, the base included.
    #[arg(long, default_value_t = 10)]
    versions: u32,
    /// Fraction of bytes rewritten per version.
    #[arg(long, default_value_t = 0.01)]
    change: f64,
    /// clustered or scattered.
    #[arg(long, default_value = "clustered")]
    shape: Shape,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Bytes rewritten by each scattered edit.
    #[arg(long, default_value_t = crate::bench::generate::GRANULE)]
    granule: usize,
    /// Output directory (files v001.bin, v002.bin, ...).
    #[arg(long)]
    out: PathBuf,
}

fn load_versions(a: &BenchArgs) -> Result<Vec<Vec<u8>>> {
    if let Some(spec) = &a.synthetic {
        let (shape, change) = spec
            .split_once(':')
            .ok_or_else(|| Error::InvalidOption(format!("--synthetic '{spec}': expected SHAPE:CHANGE")))?;
        let change: f64 =
            change.parse().map_err(|_| Error::InvalidOption(format!("bad change fraction '{change}'")))?;
        let size = usize::try_from(parse_size(&a.size)?).map_err(|_| Error::InvalidOption("size too large".into()))?;
        let mut w = Workload::new(size, change, shape.parse()?, a.seed)?.with_granule(a.granule)?;
        let pb = crate::progress::bytes_bar(u64::from(a.versions) * size as u64, "gen");
        let mut out = Vec::new();
        for v in 0..a.versions {
            if v > 0 {
                w.advance();
            }
            out.push(w.current().to_vec());
            pb.inc(size as u64);
        }
        pb.finish_and_clear();
        return Ok(out);
    }
    let loading = crate::progress::bar(a.files.len(), "loading");
    let mut data = Vec::with_capacity(a.files.len());
    for f in &a.files {
        data.push(std::fs::read(f).map_err(|e| Error::io(f, e))?);
        loading.inc(1);
    }
    loading.finish_and_clear();
    Ok(data)
}

fn bench_cuda(a: &BenchArgs, methods: &[Method], versions: &[&[u8]]) -> Result<ExitCode> {
    let gpu = dckpt::backend::cuda::Gpu::open(0)?;
    let (d2d, d2h) = gpu.copy_ceilings(versions[0].len())?;
    let sizes = if a.chunk_sizes.is_empty() { vec![a.chunk_size] } else { a.chunk_sizes.clone() };
    let pb = crate::progress::bar(versions.len() * methods.len() * sizes.len(), "gpu");
    let mut rows = Vec::new();
    for &cs in &sizes {
        rows.extend(crate::bench::kernels::run(&gpu, methods, cs, a.hash, versions, a.gpu_memory, |_, _| pb.inc(1))?);
    }
    pb.finish_and_clear();
    println!(
        "{} ({}): {} versions x {} bytes, {}, hash {}; ceilings: D2D copy {:.0} GB/s (read+write), pinned D2H {:.1} GB/s",
        gpu.name(),
        gpu.arch(),
        versions.len(),
        versions[0].len(),
        a.synthetic.as_deref().unwrap_or("files"),
        a.hash,
        d2d,
        d2h
    );
    println!(
        "{:>5} {:>8} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>12} {:>10} {:>10} {:>7}",
        "chunk",
        "method",
        "incr-ratio",
        "incr-GB/s",
        "first-GB/s",
        "x Full",
        "dedup-ms",
        "d2h-ms",
        "metadata",
        "dev-GiB",
        "dedup-GiB",
        "whole"
    );
    for r in &rows {
        let full = rows.iter().find(|f| f.method == "full" && f.chunk_size == r.chunk_size).map(|f| f.incremental_gbs);
        println!(
            "{:>5} {:>8} {:>10.2} {:>10.1} {:>10.1} {:>10} {:>9.3} {:>9.3} {:>12} {:>10.1} {:>10.2} {:>7}",
            r.chunk_size,
            r.method,
            r.incremental_ratio,
            r.incremental_gbs,
            r.first_gbs,
            full.map_or_else(|| "-".into(), |f| format!("{:.1}", r.incremental_gbs / f)),
            r.dedup_ms,
            r.d2h_ms,
            r.metadata_bytes,
            r.device_bytes as f64 / (1u64 << 30) as f64,
            r.plan_bytes as f64 / (1u64 << 30) as f64,
            format!("{}/{}", r.stored_whole, r.record_restarts)
        );
    }
    let restore = match &a.restore_dir {
        Some(dir) => Some(gpu_restore(dir, sizes[0], a.hash, versions)?),
        None => None,
    };
    if let Some(path) = &a.json {
        let doc = serde_json::json!({
            "device": gpu.name(), "arch": gpu.arch(), "d2d_gbs": d2d, "d2h_gbs": d2h,
            "synthetic": a.synthetic, "hash": a.hash.name(), "rows": rows, "restore": restore,
        });
        crate::report::write_json(path, "bench --backend cuda", &doc)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes every version with Tree on the GPU, then restores the last on the GPU.
fn gpu_restore(dir: &std::path::Path, cs: u32, hash: HashAlgo, versions: &[&[u8]]) -> Result<serde_json::Value> {
    use dckpt::backend::cuda;
    let store = dir.join(format!("dckpt-restore-bench-{}", std::process::id()));
    let opts = dckpt::StoreOptions { chunk_size: cs, method: Method::Tree, hash, ..Default::default() };
    let len = versions[0].len() as u64;
    let mut engine = dckpt::Engine::open_with_backend(&store, 0, len, &opts, BackendKind::Cuda)?;
    for (i, v) in versions.iter().enumerate() {
        engine.checkpoint(i as u64 + 1, v)?;
    }
    drop(engine);
    let gpu = cuda::Gpu::open(0)?;
    let last = versions.len() as u64;
    let (dev, stats, t) = cuda::restore_on_gpu(&gpu, &store, 0, last)?;
    let ok = gpu.stream_clone_dtoh(&dev)? == versions[versions.len() - 1];
    let _ = std::fs::remove_dir_all(&store);
    let gbs = len as f64 / f64::from(t.h2d_ms + t.scatter_ms) / 1e6;
    println!(
        "GPU restore of version {last} (chunk {cs} B): {gbs:.1} GB/s from pinned memory (H2D {:.3} ms + scatter {:.3} ms), \
         {} files, {} bytes read, byte-exact: {ok}",
        t.h2d_ms, t.scatter_ms, stats.files_opened, stats.bytes_read
    );
    if !ok {
        return Err(Error::Gpu("GPU restore differs from the checkpointed bytes".into()));
    }
    Ok(serde_json::json!({"version": last, "chunk_size": cs, "gbs": gbs, "h2d_ms": t.h2d_ms,
        "scatter_ms": t.scatter_ms, "files": stats.files_opened, "bytes_read": stats.bytes_read}))
}

pub fn bench(a: BenchArgs) -> Result<ExitCode> {
    if let Some(dir) = &a.e2e {
        return bench_e2e(&a, dir);
    }
    let methods: Vec<Method> = if a.method == "all" { Method::ALL.to_vec() } else { vec![a.method.parse()?] };
    let data = load_versions(&a)?;
    if data.iter().any(|d| d.len() != data[0].len()) {
        return Err(Error::InvalidOption("all versions must have the same length".into()));
    }
    let versions: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    if a.backend.resolve() == BackendKind::Cuda {
        return bench_cuda(&a, &methods, &versions);
    }
    let n = versions.len();
    let mut results: Vec<BenchResult> = Vec::new();
    for m in methods {
        let pb = crate::progress::bar(n, m.name());
        results.push(bench::run_method(m, a.chunk_size, a.hash, &versions, |_| pb.inc(1))?);
        pb.finish_and_clear();
    }
    if a.baselines != "none" {
        let pb = crate::progress::bar(n, "hash");
        results.push(bench::run_hash_only(a.chunk_size, a.hash, &versions, |_| pb.inc(1))?);
        pb.finish_and_clear();
    }
    if a.baselines == "all" {
        let pb = crate::progress::bar(n, "zstd-1");
        results.push(bench::run_zstd(&versions, |_| pb.inc(1)));
        pb.finish_and_clear();
        let pb = crate::progress::bar(n, "lz4");
        results.push(bench::run_lz4(&versions, |_| pb.inc(1)));
        pb.finish_and_clear();
        let pb = crate::progress::bar(n, "memcpy");
        results.push(bench::run_memcpy(&versions, |_| pb.inc(1)));
        pb.finish_and_clear();
    }
    println!(
        "{} versions x {} bytes, chunk {} B, hash {}, {} threads",
        n,
        versions[0].len(),
        a.chunk_size,
        a.hash,
        rayon::current_num_threads()
    );
    println!(
        "{:>12} {:>8} {:>14} {:>12} {:>8} {:>10} {:>10}",
        "method", "ratio", "stored", "metadata", "GB/s", "incr-ratio", "incr-GB/s"
    );
    let opt = |x: Option<f64>, p: usize| x.map_or_else(|| "-".to_string(), |v| format!("{v:.p$}"));
    for r in &results {
        println!(
            "{:>12} {:>8.2} {:>14} {:>12} {:>8.3} {:>10} {:>10}",
            r.name,
            r.ratio(),
            r.stored_bytes,
            r.metadata_bytes,
            r.throughput_gbs(),
            opt(r.incremental_ratio(), 2),
            opt(r.incremental_gbs(), 3)
        );
    }
    if let Some(path) = a.json {
        let rows: Vec<serde_json::Value> = results
            .iter()
            .map(|r| {
                serde_json::json!({
                    "name": r.name, "versions": r.versions, "logical_bytes": r.logical_bytes,
                    "stored_bytes": r.stored_bytes, "metadata_bytes": r.metadata_bytes,
                    "seconds": r.seconds, "ratio": r.ratio(), "throughput_gbs": r.throughput_gbs(),
                    "incremental_ratio": r.incremental_ratio(), "incremental_gbs": r.incremental_gbs(),
                    "version_seconds": r.version_seconds, "version_stored": r.version_stored,
                    "chunk_size": a.chunk_size, "hash": a.hash.name(), "threads": rayon::current_num_threads(),
                })
            })
            .collect();
        crate::report::write_json(&path, "bench", &serde_json::json!({ "rows": rows }))?;
    }
    Ok(ExitCode::SUCCESS)
}

pub fn generate(a: GenArgs) -> Result<ExitCode> {
    let size = usize::try_from(parse_size(&a.size)?).map_err(|_| Error::InvalidOption("size too large".into()))?;
    std::fs::create_dir_all(&a.out).map_err(|e| Error::io(&a.out, e))?;
    let mut w = Workload::new(size, a.change, a.shape, a.seed)?.with_granule(a.granule)?;
    let pb = crate::progress::bytes_bar(u64::from(a.versions) * size as u64, "gen");
    for v in 1..=a.versions {
        if v > 1 {
            w.advance();
        }
        let path = a.out.join(format!("v{v:03}.bin"));
        std::fs::write(&path, w.current()).map_err(|e| Error::io(&path, e))?;
        pb.inc(size as u64);
    }
    pb.finish_and_clear();
    println!("wrote {} versions of {} to {}", a.versions, crate::progress::bytes(size as u64), a.out.display());
    Ok(ExitCode::SUCCESS)
}

/// `dckpt bench --e2e DIR`: prints a per-version table and a summary, and
/// writes the report as JSON with `--json`.
fn bench_e2e(a: &BenchArgs, dir: &std::path::Path) -> Result<ExitCode> {
    let spec = a.synthetic.as_deref().unwrap_or("scattered:0.01");
    let (shape, change) = spec
        .split_once(':')
        .ok_or_else(|| Error::InvalidOption(format!("--synthetic '{spec}': expected SHAPE:CHANGE")))?;
    let method: Method = if a.method == "all" { Method::Tree } else { a.method.parse()? };
    let opts = crate::bench::e2e::E2eOptions {
        size: usize::try_from(parse_size(&a.size)?).map_err(|_| Error::InvalidOption("size too large".into()))?,
        versions: a.versions.max(2),
        shape: shape.parse()?,
        change: change.parse().map_err(|_| Error::InvalidOption(format!("bad change fraction '{change}'")))?,
        granule: a.granule,
        seed: a.seed,
        store: dckpt::StoreOptions {
            chunk_size: a.chunk_size,
            method,
            hash: a.hash,
            gpu_memory: a.gpu_memory,
            ..Default::default()
        },
        backend: a.backend,
        dir: dir.to_path_buf(),
        tiered_cache_bytes: a.tiered.as_deref().map(parse_size).transpose()?,
        compression: a.compress,
        gpu_cache: a.gpu_cache,
    };
    let tiered_steps = if opts.tiered_cache_bytes.is_some() { opts.versions as usize } else { 0 };
    let pb = crate::progress::bar(opts.versions as usize + 2 + tiered_steps, "e2e");
    let r = crate::bench::e2e::run(&opts, |_| pb.inc(1))?;
    pb.finish_and_clear();
    println!(
        "end to end: {} ({}), {} bytes, {} {spec}, chunk {} B, {} versions",
        r.backend, r.device, r.size, method, a.chunk_size, opts.versions
    );
    println!(
        "{:>8} {:>12} {:>12} {:>10} {:>10} {:>14}",
        "version", "checkpoint", "pipeline", "host", "write", "file bytes"
    );
    for v in &r.versions {
        println!(
            "{:>8} {:>9.1} ms {:>9.1} ms {:>7.1} ms {:>7.1} ms {:>14}{}",
            v.version,
            v.checkpoint_ms,
            v.pipeline_ms,
            v.host_ms,
            v.write_ms,
            v.file_bytes,
            if v.baseline { " baseline" } else { "" }
        );
    }
    println!(
        "median incremental checkpoint {:.1} ms ({:.1} GB/s): pipeline {:.1} + host {:.1} + write {:.1} ms",
        r.median_checkpoint_ms, r.checkpoint_gbps, r.median_pipeline_ms, r.median_host_ms, r.median_write_ms
    );
    println!(
        "naive (copy whole buffer {:.1} ms + write + fsync {:.1} ms): checkpoint / naive = {:.3}",
        r.naive_copy_ms, r.naive_write_ms, r.ratio_to_naive
    );
    println!(
        "reopen {:.1} ms (restore {:.1} + rebuild {:.1}); restore of the last version {:.1} ms ({:.2} GB/s)",
        r.reopen_ms, r.reopen_restore_ms, r.reopen_rebuild_ms, r.restore_ms, r.restore_gbps
    );
    let st = &r.restore_stats;
    println!(
        "restore phases: resolve {:.1} ms ({} pieces, {} files), plan {:.1} ms, read {:.1} ms ({} bytes), \
         verify + copy {:.1} ms{}",
        st.resolve_seconds * 1e3,
        st.pieces,
        st.files_opened,
        st.plan_seconds * 1e3,
        st.read_seconds * 1e3,
        st.bytes_read,
        st.copy_seconds * 1e3,
        r.gpu_restore
            .map_or(String::new(), |g| format!("; GPU H2D {:.1} ms, scatter {:.1} ms", g.h2d_ms, g.scatter_ms))
    );
    println!("bytes on disk {} = diff files {} + {:.3}%", r.bytes_on_disk, r.diff_bytes, r.disk_overhead_pct);
    if let Some(t) = &r.tiered {
        let calls: Vec<String> = t.checkpoint_ms.iter().map(|m| format!("{m:.1}")).collect();
        println!(
            "tiered (host cache {} B, GPU cache {} B, local + shared): calls [{}] ms; median incremental {:.1} ms = \
             dedup {:.1} + cache copy {:.1} + waiting for room {:.1}; {} held on the GPU; {:.3}x the synchronous \
             call; durable everywhere {:.1} ms after the last call; all versions {:.1} ms vs {:.1} ms of synchronous \
             calls",
            t.host_cache_bytes,
            t.gpu_cache_bytes,
            calls.join(" "),
            t.median_checkpoint_ms,
            t.median_dedup_ms,
            t.median_cache_ms,
            t.median_backpressure_ms,
            t.held_on_gpu,
            t.ratio_to_sync,
            t.drain_ms,
            t.total_ms,
            t.sync_total_ms
        );
        println!(
            "shared tier: {} bytes ({}; synchronous store {} bytes)",
            t.shared_bytes,
            t.compression.as_deref().map_or_else(|| "plain".to_string(), |c| format!("compressed with {c}")),
            r.bytes_on_disk
        );
    }
    if let Some(path) = &a.json {
        crate::report::write_json(path, "bench --e2e", &r)?;
    }
    Ok(ExitCode::SUCCESS)
}
