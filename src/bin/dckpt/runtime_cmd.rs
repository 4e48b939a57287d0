//! `bench-runtime` (under `mpirun`) and `kernels`: thin layers over
//! `crate::bench::runtime` and `dckpt::backend::cuda::kernels`.

use crate::bench::generate::Shape;
use crate::bench::runtime::{BenchRuntimeOptions, BenchRuntimeReport, RegionMemory};
use clap::Args;
use dckpt::sizes::parse_size;
use dckpt::{Error, Result};
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `dckpt bench-runtime`.
#[derive(Args)]
pub struct BenchRuntimeArgs {
    /// Bytes protected per rank (e.g. 256M, 4G).
    #[arg(long, default_value = "256M")]
    size: String,
    /// Fraction of the bytes rewritten per version.
    #[arg(long, default_value_t = 0.01)]
    change: f64,
    /// clustered or scattered changes.
    #[arg(long, default_value = "scattered")]
    shape: Shape,
    /// Versions taken.
    #[arg(long, default_value_t = 10)]
    versions: u64,
    /// Where the region lives: auto (device memory with the CUDA backend), host or device.
    #[arg(long, default_value = "auto")]
    memory: RegionMemory,
    /// Local-only (no collective step), whatever the configuration says.
    #[arg(long, conflicts_with = "collective")]
    local_only: bool,
    /// The collective step, whatever the configuration says.
    #[arg(long)]
    collective: bool,
    /// Every rank starts from the same bytes and changes them alike.
    #[arg(long)]
    shared_base: bool,
    /// Skip timing `TieredEngine` on the same versions.
    #[arg(long)]
    no_engine: bool,
    /// Time `TieredEngine` before the runtime (after it by default).
    #[arg(long, conflicts_with = "no_engine")]
    engine_first: bool,
    /// Seconds of "compute" before each call (a pause after the version is
    /// loaded): what an application does between checkpoints.
    #[arg(long, default_value_t = 0.0)]
    interval: f64,
    /// Seed of the synthetic versions.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Directory of the run (emptied first).
    #[arg(long, default_value = "bench-data/runtime")]
    dir: PathBuf,
    /// Also write the report as JSON to this file (rank 0).
    #[arg(long)]
    json: Option<PathBuf>,
}

/// `mpirun -np P dckpt bench-runtime ...`: rank 0 prints a table (and JSON).
pub fn bench(a: BenchRuntimeArgs) -> Result<ExitCode> {
    let size = usize::try_from(parse_size(&a.size)?).map_err(|_| Error::InvalidOption("size too large".into()))?;
    let o = BenchRuntimeOptions {
        size,
        change: a.change,
        shape: a.shape,
        versions: a.versions.max(2),
        memory: a.memory,
        collective: match (a.collective, a.local_only) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        },
        shared_base: a.shared_base,
        dir: a.dir,
        seed: a.seed,
        engine: !a.no_engine,
        engine_first: a.engine_first,
        interval: std::time::Duration::try_from_secs_f64(a.interval)
            .map_err(|e| Error::InvalidOption(format!("--interval {}: {e}", a.interval)))?,
    };
    let json = a.json;
    crate::collective_cmd::with_mpi(|world| {
        let bar = indicatif::ProgressBar::new(o.versions + 3);
        let shown = mpi::traits::Communicator::rank(world) == 0;
        if !shown {
            bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        }
        let report = crate::bench::runtime::run(world, &o, |step| {
            bar.set_message(step.to_string());
            bar.inc(1);
        })?;
        bar.finish_and_clear();
        if let Some(r) = report {
            print!("{}", table(&r));
            if let Some(path) = &json {
                crate::report::write_json(path, "bench-runtime", &r)?;
            }
        }
        Ok(())
    })
}

/// The report as a short table.
fn table(r: &BenchRuntimeReport) -> String {
    let naive = r.naive_copy_ms + r.naive_write_ms;
    let mut s = format!(
        "bench-runtime: {} rank(s), {} region of {} bytes on {} ({}), change {}, {}{}{}\n",
        r.ranks,
        r.memory,
        r.size,
        r.device,
        r.backend,
        r.change,
        if r.collective { "collective" } else { "local-only" },
        if r.overlapped { " (step on its thread)" } else { "" },
        if r.interval_s > 0.0 { format!(", {} s before each call", r.interval_s) } else { String::new() }
    );
    s += &format!("  call (median / max, ms)      {:10.2} / {:.2}\n", r.median_ms, r.max_ms);
    s += &format!("  first call (ms)              {:10.2}\n", r.first_ms);
    if !r.engine_calls_ms.is_empty() {
        s += &format!(
            "  TieredEngine call (median)   {:10.2}   runtime/engine {:.2}x\n",
            r.engine_median_ms,
            r.median_ms / r.engine_median_ms.max(1e-9)
        );
    }
    s += &format!(
        "  naive copy + write + fsync   {:10.2}   ({:.2} + {:.2}); call/naive {:.3}x, first/naive {:.2}x\n",
        naive,
        r.naive_copy_ms,
        r.naive_write_ms,
        r.median_ms / naive.max(1e-9),
        r.first_ms / naive.max(1e-9)
    );
    s += &format!("  drain after the last call    {:10.2}\n", r.drain_ms);
    s += &format!(
        "  latest + restart (ms)        {:10.2}   ({:.2} + {:.2})\n",
        r.latest_ms + r.restart_ms,
        r.latest_ms,
        r.restart_ms
    );
    s += &format!(
        "  a new job's latest + restart  {:10.2}   ({:.2} + {:.2}); the restore alone {:.2}\n",
        r.cold_latest_ms + r.cold_restart_ms,
        r.cold_latest_ms,
        r.cold_restart_ms,
        r.restore_only_ms
    );
    s += &format!("  spilled calls / waited (ms)  {:10} / {:.2}\n", r.spilled_calls, r.backpressure_ms);
    for (tier, bytes) in &r.tier_bytes {
        s += &format!("  bytes on {tier:<19} {bytes:12}\n");
    }
    s
}

/// Arguments of `dckpt kernels`.
#[derive(Args)]
pub struct KernelsArgs {
    /// Compile the kernels ahead of time into this directory (what the
    /// build embeds from kernels/prebuilt/); needs libnvrtc, not a GPU.
    #[arg(long)]
    emit: Option<PathBuf>,
    /// Architectures to compile for (with --emit).
    #[arg(long, value_delimiter = ',', default_values_t = dckpt::backend::cuda::kernels::PREBUILT_ARCHS.map(String::from))]
    archs: Vec<String>,
    /// Print JSON (with a schema version) instead of text.
    #[arg(long)]
    json: bool,
}

/// `dckpt kernels`: lists the kernels built into this binary and the node's
/// cache; `--emit DIR` compiles them ahead of time.
pub fn kernels(a: KernelsArgs) -> Result<ExitCode> {
    use dckpt::backend::cuda::kernels;
    if let Some(dir) = a.emit {
        let archs: Vec<&str> = a.archs.iter().map(String::as_str).collect();
        for path in kernels::emit(&dir, &archs)? {
            println!("{}", path.display());
        }
        return Ok(ExitCode::SUCCESS);
    }
    if a.json {
        #[derive(serde::Serialize)]
        struct BuiltIn {
            name: String,
            bytes: usize,
            current: bool,
        }
        #[derive(serde::Serialize)]
        struct Kernels {
            built_in: Vec<BuiltIn>,
            cache: PathBuf,
            expected: Vec<(String, String)>,
        }
        let built_in = kernels::prebuilt()
            .iter()
            .map(|(name, bytes)| BuiltIn {
                name: name.to_string(),
                bytes: bytes.len(),
                current: kernels::PREBUILT_ARCHS.iter().any(|arch| kernels::cubin_name(arch) == *name),
            })
            .collect();
        let expected = kernels::PREBUILT_ARCHS.iter().map(|a| (a.to_string(), kernels::cubin_name(a))).collect();
        crate::report::print_json("kernels", &Kernels { built_in, cache: kernels::cache_dir(), expected })?;
        return Ok(ExitCode::SUCCESS);
    }
    for (name, bytes) in kernels::prebuilt() {
        let current = kernels::PREBUILT_ARCHS.iter().any(|arch| kernels::cubin_name(arch) == *name);
        println!("built in: {name} ({} bytes){}", bytes.len(), if current { "" } else { " (stale: another source)" });
    }
    println!("cache: {}", kernels::cache_dir().display());
    for arch in kernels::PREBUILT_ARCHS {
        println!("expected for {arch}: {}", kernels::cubin_name(arch));
    }
    Ok(ExitCode::SUCCESS)
}
