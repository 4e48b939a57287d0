//! `checkpoint --collective` and `bench-collective`: the commands that run
//! under `mpirun` (feature `mpi`).

use crate::bench::collective::{MixedParams, SetCase, mixed_workload, reduce_timing};
use crate::store_cmds::CheckpointArgs;
use clap::Args;
use dckpt::collective::mpi::all_agree;
use dckpt::collective::{Collective, CollectiveOptions, Overlap};
use dckpt::sizes::parse_size;
use dckpt::{Error, Result};
use mpi::traits::*;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `dckpt bench-collective`.
#[derive(Args)]
pub struct BenchCollectiveArgs {
    /// reduce (the reduction alone, synthetic sets) or mixed (whole
    /// checkpoints: collective vs local-only vs full).
    #[arg(long, default_value = "reduce", value_parser = ["reduce", "mixed"])]
    workload: String,
    /// K: entries per rank (reduce) or the threshold (mixed).
    #[arg(long, default_value_t = dckpt::collective::DEFAULT_THRESHOLD as u32,
          value_parser = clap::value_parser!(u32).range(1..=dckpt::collective::merge::MAX_THRESHOLD as i64))]
    threshold: u32,
    /// reduce: unique (worst case) or shared (best case).
    #[arg(long, default_value = "unique")]
    case: SetCase,
    /// reduce: timed repetitions.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// mixed: bytes per rank.
    #[arg(long, default_value = "64M")]
    size: String,
    /// mixed: fraction of each buffer replicated on every rank.
    #[arg(long, default_value_t = 0.5)]
    shared_fraction: f64,
    /// mixed: fraction rewritten per version.
    #[arg(long, default_value_t = 0.01)]
    change: f64,
    /// mixed: versions.
    #[arg(long, default_value_t = 5)]
    versions: u64,
    /// mixed: chunk size.
    #[arg(long, default_value_t = 128)]
    chunk_size: u32,
    /// mixed: auto, cpu or cuda (every mode uses it; ranks spread over a node's GPUs).
    #[arg(long, default_value = "auto")]
    backend: dckpt::backend::BackendKind,
    /// mixed: through the asynchronous tiers with a host cache of this size
    /// per rank (e.g. 1G): the times are what the application waited, and
    /// `drain_seconds` the flush left after the last checkpoint.
    #[arg(long)]
    tiered: Option<String>,
    /// mixed, with --tiered: compress each file on its way to the shared
    /// tier (lz4, zstd or zstd:LEVEL).
    #[arg(long, requires = "tiered")]
    compress: Option<dckpt::format::Compression>,
    /// mixed, CUDA: device memory per rank, a multiple of the buffer (1.5x)
    /// or a size.
    #[arg(long, default_value = "1.5x")]
    gpu_memory: dckpt::sizes::GpuMemory,
    /// mixed, with --tiered, CUDA: the GPU cache tier's share of
    /// --gpu-memory (auto: what the budget leaves spare; 0: none; a size).
    #[arg(long, default_value = "auto", requires = "tiered")]
    gpu_cache: dckpt::backend::budget::GpuCache,
    /// mixed, CUDA: keep the buffer in device memory, as a GPU simulation
    /// does (each version is uploaded before it is timed).
    #[arg(long)]
    resident: bool,
    /// mixed: smallest region offered (0 = every region).
    #[arg(long, default_value_t = 0)]
    min_region_bytes: u64,
    /// mixed, with --tiered: where the collective step runs: auto (a
    /// background thread, but in the call for a CPU-backend rank with fewer
    /// than two CPUs: bound to one, or oversubscribed), on (the thread) or
    /// off (in the call).
    #[arg(long, requires = "tiered", default_value = "auto")]
    overlap: Overlap,
    /// mixed, with --tiered: the same as `--overlap off`.
    #[arg(long, requires = "tiered", conflicts_with = "overlap")]
    no_overlap: bool,
    /// mixed: the modes, in order (collective, local, full; a mode may repeat).
    #[arg(long, value_delimiter = ',', default_value = "collective,local,full")]
    modes: Vec<String>,
    /// mixed: directory for the three stores (shared by the ranks).
    #[arg(long, default_value = "bench-data/collective")]
    dir: PathBuf,
}

/// Runs `body` with MPI initialized; an error on any rank is printed by that
/// rank and makes the command fail (MPI is finalized first).
pub fn with_mpi(body: impl FnOnce(&mpi::topology::SimpleCommunicator) -> Result<()>) -> Result<ExitCode> {
    let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Multiple)
        .ok_or_else(|| Error::InvalidOption("MPI could not be initialized".into()))?;
    let world = universe.world();
    let rank = world.rank();
    let result = body(&world);
    // Report before MPI_Finalize: once one rank exits with an error, mpirun
    // may kill the others, and a message printed after finalizing is lost.
    let code = match &result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dckpt: error: rank {rank}: {e}");
            ExitCode::FAILURE
        }
    };
    drop(universe);
    Ok(code)
}

/// `mpirun -np P dckpt checkpoint --collective ... FILE` (`{rank}` in FILE is
/// each rank's number).
pub fn checkpoint(a: CheckpointArgs, config: &dckpt::config::Config) -> Result<ExitCode> {
    let store = config.store_options();
    let copts = config.collective_options();
    with_mpi(|world| {
        let rank = world.rank();
        let file = PathBuf::from(a.file.to_string_lossy().replace("{rank}", &rank.to_string()));
        let data = std::fs::read(&file).map_err(|e| Error::io(&file, e));
        // Every rank learns whether every rank could read its input.
        let data = all_agree(world, "reading the input", 0, data)?;
        if let Some(tiers) = a.tier_options(config, data.len() as u64) {
            let mut ckpt = dckpt::collective::TieredCollective::open(world, &tiers, data.len() as u64, &store, &copts)?;
            for w in &ckpt.engine().open_report().warnings {
                eprintln!("dckpt: warning: {w}");
            }
            ckpt.checkpoint(a.version, &data)?;
            ckpt.wait(a.version)?;
            // The settled report (the collective step may have run in the background).
            let r = ckpt.take_settled().pop().ok_or_else(|| Error::Internal("no settled report".into()))?;
            ckpt.finalize()?;
            println!(
                "rank {} version {}: {}, {} regions referenced on other ranks, returned after {:.3} s, durable on every tier{}",
                r.rank,
                r.checkpoint.version,
                crate::progress::bytes(r.checkpoint.file_bytes),
                r.regions_referenced,
                r.total_seconds,
                if r.checkpoint.baseline { ", baseline" } else { "" }
            );
            return Ok(());
        }
        let mut ckpt = Collective::open(world, &a.dir, data.len() as u64, &store, &copts)?;
        for w in &ckpt.engine().open_report().warnings {
            eprintln!("dckpt: warning: {w}");
        }
        let r = ckpt.checkpoint(a.version, &data)?;
        let c = &r.checkpoint;
        println!(
            "rank {} version {}: {} -> {} ({:.1}x), {} regions referenced on other ranks ({}), reduce {:.3} s{}",
            r.rank,
            c.version,
            crate::progress::bytes(data.len() as u64),
            crate::progress::bytes(c.file_bytes),
            data.len() as f64 / c.file_bytes as f64,
            r.regions_referenced,
            crate::progress::bytes(r.bytes_referenced),
            r.reduce_seconds,
            if c.baseline { ", baseline" } else { "" }
        );
        Ok(())
    })
}

/// `mpirun -np P dckpt bench-collective ...`: rank 0 prints one JSON line.
pub fn bench(a: BenchCollectiveArgs) -> Result<ExitCode> {
    with_mpi(|world| {
        let line = match a.workload.as_str() {
            "mixed" => {
                let p = MixedParams {
                    size: parse_size(&a.size)? as usize,
                    shared_fraction: a.shared_fraction,
                    change: a.change,
                    versions: a.versions,
                    chunk_size: a.chunk_size,
                    tiered_cache_bytes: a.tiered.as_deref().map(parse_size).transpose()?,
                    compression: a.compress,
                    gpu_memory: a.gpu_memory,
                    gpu_cache: a.gpu_cache,
                    resident: a.resident,
                    modes: a.modes.clone(),
                };
                let cleared = if world.rank() == 0 && a.dir.exists() {
                    std::fs::remove_dir_all(&a.dir).map_err(|e| Error::io(&a.dir, e))
                } else {
                    Ok(())
                };
                all_agree(world, "clearing the directory", 0, cleared)?;
                let copts = CollectiveOptions {
                    threshold: a.threshold as usize,
                    backend: a.backend,
                    min_region_bytes: a.min_region_bytes,
                    overlap: if a.no_overlap { Overlap::Off } else { a.overlap },
                    ..CollectiveOptions::default()
                };
                let modes = mixed_workload(world, &a.dir, &p, &copts)?;
                serde_json::json!({ "workload": "mixed", "ranks": world.size(), "params": p, "modes": modes })
            }
            _ => serde_json::to_value(reduce_timing(world, a.threshold as usize, a.case, a.repeat))
                .map_err(|e| Error::InvalidOption(e.to_string()))?,
        };
        if world.rank() == 0 {
            crate::report::print_json_line("bench-collective", &line)?;
        }
        Ok(())
    })
}
