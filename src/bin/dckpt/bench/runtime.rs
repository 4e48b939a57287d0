//! `dckpt bench-runtime`: what an application waits for when it calls the
//! [`Runtime`] under `mpirun`, measured the way it calls it — one region
//! (host or device memory), the configuration a job gets with no file (the
//! defaults and `DCKPT_<KEY>`), synthetic versions — and, in the same run,
//! what the layers and the naive alternative take on the same data:
//!
//! - every call (the slowest rank's time per version), the first call (open
//!   and baseline) apart;
//! - the drain (`wait` on the last version) and every byte on every tier;
//! - `latest` + `restart` of the last version, checked byte for byte;
//! - the naive alternative: copy the buffer to host memory, write it to a
//!   file, fsync;
//! - [`TieredEngine::checkpoint`](dckpt::tiers::TieredEngine::checkpoint) on
//!   the same versions (the layer beneath; each rank its own, no
//!   collective step).

use crate::bench::e2e::{Buffer, median, ms};
use crate::bench::generate::{Shape, Workload};
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::*;
use dckpt::backend::BackendKind;
use dckpt::config::Config;
use dckpt::error::{Error, Result};
use dckpt::runtime::{Region, Runtime};
use dckpt::tiers::TieredEngine;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Where the protected region lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RegionMemory {
    /// Device memory where the backend is CUDA, host memory otherwise.
    Auto,
    /// Host memory.
    Host,
    /// Device memory (CUDA backend).
    Device,
}

impl std::str::FromStr for RegionMemory {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(RegionMemory::Auto),
            "host" => Ok(RegionMemory::Host),
            "device" => Ok(RegionMemory::Device),
            _ => Err(Error::InvalidOption(format!("unknown memory '{s}' (expected auto, host or device)"))),
        }
    }
}

/// What `bench-runtime` runs.
#[derive(Clone, Debug)]
pub struct BenchRuntimeOptions {
    /// Bytes protected per rank.
    pub size: usize,
    /// Fraction of the bytes rewritten per version.
    pub change: f64,
    /// Shape of the changes.
    pub shape: Shape,
    /// Versions taken.
    pub versions: u64,
    /// Where the region lives.
    pub memory: RegionMemory,
    /// Collective (`Some(true)`), local-only (`Some(false)`), or what the
    /// configuration says.
    pub collective: Option<bool>,
    /// Every rank starts from the same bytes and changes them alike (what
    /// the collective step de-duplicates across ranks).
    pub shared_base: bool,
    /// Directory of the run (emptied first); the stores go under it unless
    /// the configuration names directories.
    pub dir: PathBuf,
    /// Seed of the synthetic versions.
    pub seed: u64,
    /// Also time `TieredEngine` on the same versions.
    pub engine: bool,
    /// Time `TieredEngine` before the runtime (after it by default).
    pub engine_first: bool,
    /// The application's compute between two calls: a pause after each
    /// version is loaded, before its call (none by default).
    pub interval: std::time::Duration,
}

/// What `bench-runtime` measured (rank 0 has it).
#[derive(Clone, Debug, Serialize)]
pub struct BenchRuntimeReport {
    /// Ranks.
    pub ranks: u32,
    /// Backend in use.
    pub backend: String,
    /// Where the region lived.
    pub memory: String,
    /// The device (or `cpu`).
    pub device: String,
    /// Bytes per rank.
    pub size: u64,
    /// Fraction changed per version.
    pub change: f64,
    /// Whether the collective step ran (not local-only).
    pub collective: bool,
    /// Whether the collective step ran on its thread.
    pub overlapped: bool,
    /// Per version, the slowest rank's call (ms).
    pub calls_ms: Vec<f64>,
    /// The first call (open + baseline), slowest rank (ms).
    pub first_ms: f64,
    /// Median of the other calls (ms).
    pub median_ms: f64,
    /// Slowest of the other calls (ms).
    pub max_ms: f64,
    /// The pause before each call (`--interval`), seconds.
    pub interval_s: f64,
    /// Calls whose diff was spilled outside the host cache (any rank).
    pub spilled_calls: u64,
    /// Seconds all calls waited for room (slowest rank, summed), in ms.
    pub backpressure_ms: f64,
    /// `wait` on the last version after its call (ms).
    pub drain_ms: f64,
    /// `latest` (ms).
    pub latest_ms: f64,
    /// `restart` of the latest version (ms); the bytes were checked.
    pub restart_ms: f64,
    /// A new job's `latest` (a new Runtime in the same process, nothing
    /// open: the manifests only), ms.
    pub cold_latest_ms: f64,
    /// That new job's `restart` of the same version (opening the engine,
    /// one restore, the state rebuilt from it), ms.
    pub cold_restart_ms: f64,
    /// `dckpt restore`'s library call on the same version (read, verify,
    /// into host memory; no placing), ms.
    pub restore_only_ms: f64,
    /// Bytes on each tier after the drain, `(tier, bytes)`: every rank's
    /// files in the tier's directory as rank 0 sees it (on one node, all).
    pub tier_bytes: Vec<(String, u64)>,
    /// The naive alternative per rank, slowest rank (ms): copy to host memory.
    pub naive_copy_ms: f64,
    /// The naive alternative: write + fsync (ms).
    pub naive_write_ms: f64,
    /// `TieredEngine::checkpoint` per version on the same data, slowest rank (ms).
    pub engine_calls_ms: Vec<f64>,
    /// Median of the engine's calls after the first (ms).
    pub engine_median_ms: f64,
    /// The configuration the runtime ran with.
    pub config: String,
}

/// The checkpoint name the benchmark uses.
const NAME: &str = "bench";

/// Runs the benchmark on every rank of `world` (collective); rank 0 gets
/// the report. `progress` is called on rank 0 after each step.
pub fn run(
    world: &SimpleCommunicator,
    o: &BenchRuntimeOptions,
    mut progress: impl FnMut(&str),
) -> Result<Option<BenchRuntimeReport>> {
    let rank = world.rank().max(0) as u32;
    if rank == 0 && o.dir.exists() {
        std::fs::remove_dir_all(&o.dir).map_err(|e| Error::io(&o.dir, e))?;
    }
    world.barrier();
    std::fs::create_dir_all(&o.dir).map_err(|e| Error::io(&o.dir, e))?;
    // The defaults and DCKPT_<KEY>; the run's directory where none is named.
    let named = ["DCKPT_SCRATCH", "DCKPT_PERSISTENT"].iter().any(|k| std::env::var_os(k).is_some());
    dckpt::config::check_variable_names(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()))?;
    let here = o.dir.join("persistent").display().to_string();
    let mut config = Config::load_with(None, |key| match key {
        "DCKPT_PERSISTENT" if !named => Some(here.clone()),
        _ => std::env::var(key).ok(),
    })?;
    if let Some(c) = o.collective {
        config.collective = c;
    }
    let backend = config.backend.resolve();
    let on_device = match o.memory {
        RegionMemory::Auto => backend == BackendKind::Cuda,
        RegionMemory::Host => false,
        RegionMemory::Device => true,
    };
    if on_device && backend != BackendKind::Cuda {
        return Err(Error::InvalidOption("a device region needs the CUDA backend".into()));
    }
    // The pool sized as `Runtime::init` sizes it, before the workload's
    // generation starts it (an application's init comes first).
    dckpt::runtime::placement::size_the_pool(world);
    let seed = if o.shared_base { o.seed } else { o.seed + u64::from(rank) };
    let workload = || Workload::new(o.size, o.change, o.shape, seed);
    let w = workload()?;
    let ordinal = local_rank(world) % dckpt::backend::cuda::device_count().max(1);
    let (mut buf, device) =
        Buffer::on(if on_device { BackendKind::Cuda } else { BackendKind::Cpu }, w.current(), ordinal)?;

    // The layer beneath on the same versions, first where asked (an
    // order effect would show as the two swapping).
    let store = config.store_options();
    let engine_run = |buf: &mut Buffer| -> Result<Vec<f64>> {
        match o.engine {
            true => engine_calls(world, o, &config, backend, ordinal, &store, buf, seed),
            false => Ok(Vec::new()),
        }
    };
    let mut engine_calls = if o.engine_first { engine_run(&mut buf)? } else { Vec::new() };
    if o.engine_first && rank == 0 {
        progress("engine");
    }
    let mut w = workload()?;
    buf.load(w.current())?;

    // The runtime, as an application holds it.
    let mut rt = Runtime::init(world, config.clone());
    protect(&mut rt, &mut buf)?;
    let (mut spilled, mut waited) = (0u64, 0.0f64);
    let calls = timed_versions(world, o, &mut w, &mut buf, |v, _| {
        let r = rt.checkpoint(NAME, v)?;
        spilled += u64::from(r.checkpoint.spilled);
        waited += r.checkpoint.backpressure_seconds * 1e3;
        if rank == 0 {
            progress("checkpoint");
        }
        Ok(())
    })?;
    let overlapped = rt.stats().overlapped_calls > 0;
    let t = Instant::now();
    rt.wait(NAME, o.versions)?;
    let drain_ms = ms(t);
    world.barrier(); // every rank drained: the directories are whole
    let nodes = world.size().max(1) as u32;
    let tier_bytes = tiers_of(&config).into_iter().map(|(n, d)| (n, node_bytes(&d, nodes))).collect::<Vec<_>>();
    // latest + restart, into a poisoned region: in this job, then in a new
    // one (nothing open), then the plain restore.
    let want = buf.copy_out()?;
    let (latest, latest_ms, restart_ms) = latest_and_restart(world, &mut rt, &mut buf, &want, 0xa5, "the job")?;
    rt.finalize()?;
    if rank == 0 {
        progress("restart");
    }
    let mut rt = Runtime::init(world, config.clone());
    protect(&mut rt, &mut buf)?;
    let (_, cold_latest_ms, cold_restart_ms) = latest_and_restart(world, &mut rt, &mut buf, &want, 0x5a, "a new job")?;
    drop(want);
    rt.finalize()?;
    world.barrier();
    // A node-local directory per node ({node}) holds only its ranks' files.
    let root = tiers_of(&config).into_iter().map(|(_, d)| d).find(|d| !d.to_string_lossy().contains("{node}"));
    let t = Instant::now();
    if let Some(root) = root {
        dckpt::restore::restore_version(&root, rank, latest)?;
    }
    let restore_only_ms = ms(t);
    if rank == 0 {
        progress("cold restart");
    }

    // The naive alternative, twice (the faster: the page cache warmed up).
    let naive_path = o.dir.join(format!("naive-{rank}.bin"));
    let (mut copy_ms, mut write_ms) = (f64::MAX, f64::MAX);
    for _ in 0..2 {
        world.barrier();
        let t = Instant::now();
        let host = buf.copy_out()?;
        copy_ms = copy_ms.min(ms(t));
        let t = Instant::now();
        write_fsync(&naive_path, &host)?;
        write_ms = write_ms.min(ms(t));
        std::fs::remove_file(&naive_path).map_err(|e| Error::io(&naive_path, e))?;
    }
    if rank == 0 {
        progress("naive");
    }

    if !o.engine_first {
        engine_calls = engine_run(&mut buf)?;
        if rank == 0 {
            progress("engine");
        }
    }

    // The slowest rank's figures.
    let slowest = |mine: &[f64]| -> Vec<f64> {
        let mut all = vec![0.0f64; mine.len() * world.size() as usize];
        world.all_gather_into(mine, &mut all[..]);
        (0..mine.len()).map(|i| all.iter().skip(i).step_by(mine.len().max(1)).copied().fold(0.0, f64::max)).collect()
    };
    let calls_ms = slowest(&calls);
    let engine_calls_ms = if engine_calls.is_empty() { Vec::new() } else { slowest(&engine_calls) };
    let [
        drain_ms,
        latest_ms,
        restart_ms,
        naive_copy_ms,
        naive_write_ms,
        waited,
        cold_latest_ms,
        cold_restart_ms,
        restore_only_ms,
    ]: [f64; 9] = slowest(&[
        drain_ms,
        latest_ms,
        restart_ms,
        copy_ms,
        write_ms,
        waited,
        cold_latest_ms,
        cold_restart_ms,
        restore_only_ms,
    ])
    .try_into()
    .map_err(|_| Error::Internal("gathered figures".into()))?;
    let mut spilled_all = 0u64;
    world.all_reduce_into(&spilled, &mut spilled_all, ::mpi::collective::SystemOperation::sum());
    if rank != 0 {
        return Ok(None);
    }
    let rest = |c: &[f64]| c.get(1..).map(<[f64]>::to_vec).unwrap_or_default();
    Ok(Some(BenchRuntimeReport {
        ranks: world.size() as u32,
        backend: backend.to_string(),
        memory: if on_device { "device" } else { "host" }.into(),
        device,
        size: o.size as u64,
        change: o.change,
        collective: config.collective && world.size() > 1,
        overlapped,
        first_ms: calls_ms.first().copied().unwrap_or(0.0),
        median_ms: median(rest(&calls_ms)),
        max_ms: rest(&calls_ms).into_iter().fold(0.0, f64::max),
        calls_ms,
        interval_s: o.interval.as_secs_f64(),
        spilled_calls: spilled_all,
        backpressure_ms: waited,
        drain_ms,
        latest_ms,
        restart_ms,
        cold_latest_ms,
        cold_restart_ms,
        restore_only_ms,
        tier_bytes,
        naive_copy_ms,
        naive_write_ms,
        engine_median_ms: median(rest(&engine_calls_ms)),
        engine_calls_ms,
        config: config.to_toml()?,
    }))
}

/// `latest` and `restart` of it through `rt` into `buf` poisoned with
/// `poison` first, checked against `want`: the version and the two times
/// (ms). `who` names the job in errors.
fn latest_and_restart(
    world: &SimpleCommunicator,
    rt: &mut Runtime,
    buf: &mut Buffer,
    want: &[u8],
    poison: u8,
    who: &str,
) -> Result<(u64, f64, f64)> {
    buf.load(&vec![poison; want.len()])?;
    world.barrier();
    let t = Instant::now();
    let latest = rt.latest(NAME)?;
    let latest_ms = ms(t);
    let t = Instant::now();
    let Some(v) = latest else {
        return Err(Error::Internal(format!("{who} found no version to restart from after the drain")));
    };
    rt.restart(NAME, v)?;
    let restart_ms = ms(t);
    if buf.copy_out()? != want {
        return Err(Error::Internal(format!("rank {}: {who}'s restart differs from the last version", rt.rank())));
    }
    Ok((v, latest_ms, restart_ms))
}

/// `TieredEngine::checkpoint` of the same versions, each rank its own
/// store beside the runtime's (no collective step): each call's time (ms).
#[allow(clippy::too_many_arguments)]
fn engine_calls(
    world: &SimpleCommunicator,
    o: &BenchRuntimeOptions,
    config: &Config,
    backend: BackendKind,
    ordinal: usize,
    store: &dckpt::store::StoreOptions,
    buf: &mut Buffer,
    seed: u64,
) -> Result<Vec<f64>> {
    let rank = world.rank().max(0) as u32;
    let mut tiers = config.tier_options(NAME);
    tiers.local = tiers.local.map(|d| d.with_file_name(format!("{NAME}-engine-{rank}")));
    tiers.shared = tiers.shared.map(|d| d.with_file_name(format!("{NAME}-engine-{rank}")));
    let mut engine = TieredEngine::open_on(rank, o.size as u64, store, &tiers, backend, ordinal)?;
    let mut w = Workload::new(o.size, o.change, o.shape, seed)?;
    buf.load(w.current())?;
    let calls = timed_versions(world, o, &mut w, buf, |v, buf| engine.checkpoint(v, buf.protected()?).map(|_| ()))?;
    engine.wait_all()?;
    engine.finalize()?;
    Ok(calls)
}

/// Versions 1..=`o.versions` of `w` loaded into `buf` one by one, each
/// followed (every rank at once) by `call`; each call's time (ms).
fn timed_versions(
    world: &SimpleCommunicator,
    o: &BenchRuntimeOptions,
    w: &mut Workload,
    buf: &mut Buffer,
    mut call: impl FnMut(u64, &Buffer) -> Result<()>,
) -> Result<Vec<f64>> {
    let mut calls = Vec::new();
    for v in 1..=o.versions {
        if v > 1 {
            w.advance();
            buf.load(w.current())?;
        }
        std::thread::sleep(o.interval);
        world.barrier();
        let t = Instant::now();
        call(v, buf)?;
        calls.push(ms(t));
    }
    Ok(calls)
}

/// Protects the benchmark's buffer as region 0 (what an application does
/// with its own memory).
#[allow(unsafe_code)]
fn protect(rt: &mut Runtime, buf: &mut Buffer) -> Result<()> {
    let region = region_of(buf)?;
    // SAFETY: `run` keeps `buf` alive until after `rt.finalize()`, and
    // changes it only between `rt`'s calls (never while one runs).
    unsafe { rt.protect(0, region) }
}

/// The benchmark's buffer as a protected region.
fn region_of(buf: &mut Buffer) -> Result<Region> {
    Ok(match buf {
        Buffer::Host(v) => Region::host(v),
        Buffer::Device(..) => match buf.protected()? {
            dckpt::memory::Protected::Device(d) => Region::Device { ptr: d.ptr(), len: d.len() },
            dckpt::memory::Protected::Host(_) => return Err(Error::Internal("a device buffer in host memory".into())),
        },
    })
}

/// This rank's index among its node's ranks.
fn local_rank(world: &SimpleCommunicator) -> usize {
    world.split_shared(0).rank().max(0) as usize
}

/// The tiers a configuration names, fastest first, with the benchmark's
/// directory on each.
fn tiers_of(config: &Config) -> Vec<(String, PathBuf)> {
    let t = config.tier_options(NAME);
    [("local", t.local), ("shared", t.shared)].into_iter().filter_map(|(n, d)| Some((n.to_string(), d?))).collect()
}

/// Bytes under `dir`, summed over nodes `0..nodes` where it holds `{node}`.
fn node_bytes(dir: &Path, nodes: u32) -> u64 {
    match dir.to_string_lossy().contains("{node}") {
        true => (0..nodes).map(|n| dir_bytes(&dckpt::redundancy::on_node(dir, n))).sum(),
        false => dir_bytes(dir),
    }
}

/// Bytes of the files under `dir` (every rank's; 0 when it is missing).
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else { return 0 };
    rd.filter_map(|e| e.ok())
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

fn write_fsync(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(|e| Error::io(path, e))
}
