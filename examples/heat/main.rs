//! A 2-D heat (Jacobi) simulation that checkpoints through the runtime and
//! restarts from its newest checkpoint after a crash, with its plate in
//! device memory (a CUDA kernel through NVRTC, [`gpu`]) or in host memory.
//!
//! ```text
//! mpirun -np 4 target/release/examples/heat [--steps 200] [--every 20] [--rows 256] [--cols 1024]
//!        [--device auto|cpu|gpu] [--config dckpt.toml] [--dir target/heat] [--crash-at STEP] [--report FILE]
//! ```
//!
//! Each rank owns `rows` rows of a `cols`-wide plate (the rows above and
//! below are exchanged with its neighbours every step); the top edge of the
//! plate is held at 100. `--device auto` (the default) keeps the plate on
//! the rank's GPU where there is one (ranks of a node spread over its GPUs,
//! as the runtime does) and on the host otherwise; both give the same plate,
//! bit for bit. Every `every` steps the runtime checkpoints the
//! plate and the step counter (two protected regions) as one collective
//! checkpoint, asynchronously through the tiers. At start, the run restarts
//! from the newest checkpoint every rank has, if any. `--crash-at STEP`
//! aborts rank `size - 1` at that step (what SIGKILL leaves); the next run
//! continues from the last checkpoint and ends with the same plate, bit for
//! bit, as a run never interrupted: rank 0 prints its BLAKE3 digest.
//! `--report FILE`: rank 0 appends one CSV line of what the run cost
//! (`dckpt::runtime::study`, for `scripts/scaling-study.sh`).
// Protecting memory by address is `unsafe`: the runtime reads and writes the
// plate and the counter during its calls. The GPU sweep is a kernel launch.
#![allow(unsafe_code)]

#[path = "../common/mod.rs"]
mod common;
mod gpu;

use dckpt::config::{Bytes, Config};
use dckpt::runtime::{Region, Runtime};
use mpi::point_to_point as p2p;
use mpi::topology::{Process, SimpleCommunicator};
use mpi::traits::*;
use std::process::ExitCode;

/// Command-line settings.
struct Args {
    rows: usize,
    cols: usize,
    /// `--steps`, `--every`, `--config`, `--dir`, `--crash-at`, `--report`.
    run: common::RunFlags,
    device: Device,
}

/// Where the plate lives.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
enum Device {
    /// The GPU where there is one, else the host.
    Auto,
    /// The host.
    Cpu,
    /// The GPU (an error without one).
    Gpu,
}

/// A 2-D heat diffusion (Jacobi) split into row blocks over the ranks,
/// checkpointed through dckpt's runtime; killed, it goes on from its newest
/// checkpoint with the same plate, bit for bit.
#[derive(clap::Parser, Debug)]
#[command(name = "heat")]
struct Cli {
    /// Rows of the plate on each rank.
    #[arg(long, default_value_t = 256)]
    rows: usize,
    /// Columns of the plate.
    #[arg(long, default_value_t = 1024)]
    cols: usize,
    /// Where the plate lives.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    device: Device,
    #[command(flatten)]
    run: common::RunArgs,
}

fn parse() -> Result<Args, clap::Error> {
    let c = <Cli as clap::Parser>::try_parse()?;
    Ok(Args {
        rows: c.rows,
        cols: c.cols,
        device: c.device,
        run: c.run.with(common::RunFlags::new(200, 20, "target/heat")),
    })
}

fn main() -> ExitCode {
    common::main("heat", parse, run)
}

/// The configuration: the file given, else local directories under `dir`.
fn config(a: &Args) -> dckpt::Result<Config> {
    let defaults =
        Config { host_cache_size: Bytes(256 << 20), max_chain: Some(8), max_versions: Some(4), ..Config::default() };
    a.run.config(defaults)
}

/// A rank's plate (`rows` real rows between a ghost row above and below,
/// `cols` wide), where it lives.
enum Plate {
    Host { plate: Vec<f64>, next: Vec<f64> },
    Device(gpu::DevicePlate),
}

impl Plate {
    fn new(world: &impl Communicator, a: &Args) -> dckpt::Result<Plate> {
        let gpus = if a.device == Device::Cpu { 0 } else { dckpt::backend::cuda::device_count() };
        let on_gpu = match a.device {
            Device::Cpu => false,
            Device::Gpu if gpus == 0 => return Err(dckpt::Error::Gpu("--device gpu: no usable CUDA device".into())),
            Device::Gpu => true,
            Device::Auto => gpus > 0 && dckpt::backend::cuda::available(),
        };
        if on_gpu {
            // The runtime's rule: ranks of a node spread over its GPUs.
            let local = world.split_shared(0).rank().max(0) as usize;
            return Ok(Plate::Device(gpu::DevicePlate::new(local % gpus, a.rows, a.cols)?));
        }
        let plate = vec![0f64; (a.rows + 2) * a.cols];
        Ok(Plate::Host { next: plate.clone(), plate })
    }

    /// The region the runtime protects.
    fn region(&mut self) -> Region {
        match self {
            Plate::Host { plate, .. } => Region::Host { ptr: plate.as_mut_ptr().cast(), len: plate.len() * 8 },
            Plate::Device(d) => {
                let (ptr, len) = d.region();
                Region::Device { ptr, len }
            }
        }
    }

    /// One step: the halo exchange (first real row up, last real row down;
    /// the top edge of the whole plate held at 100), then one Jacobi sweep
    /// over the real rows (the side columns stay fixed).
    fn step(
        &mut self,
        up: Option<&Process<'_>>,
        down: Option<&Process<'_>>,
        rows: usize,
        cols: usize,
    ) -> dckpt::Result<()> {
        match self {
            Plate::Host { plate, next } => {
                let (top, rest) = plate.split_at_mut(cols);
                let (body, bottom) = rest.split_at_mut(rows * cols);
                match up {
                    Some(p) => {
                        p2p::send_receive_into(&body[..cols], p, top, p);
                    }
                    None => top.fill(100.0), // the hot edge
                }
                if let Some(p) = down {
                    p2p::send_receive_into(&body[(rows - 1) * cols..], p, bottom, p);
                }
                for i in 1..=rows {
                    for j in 1..cols - 1 {
                        let at = i * cols + j;
                        next[at] = 0.25 * (plate[at - cols] + plate[at + cols] + plate[at - 1] + plate[at + 1]);
                    }
                }
                for i in 1..=rows {
                    let r = i * cols + 1..(i + 1) * cols - 1;
                    plate[r.clone()].copy_from_slice(&next[r]);
                }
                Ok(())
            }
            Plate::Device(d) => {
                // The exchange runs on the host: two rows cross the bus each way.
                let (first, last) = d.edge_rows()?;
                let mut ghost = vec![100f64; cols];
                if let Some(p) = up {
                    p2p::send_receive_into(&first[..], p, &mut ghost[..], p);
                }
                d.set_rows(0, &ghost)?;
                if let Some(p) = down {
                    p2p::send_receive_into(&last[..], p, &mut ghost[..], p);
                    d.set_rows(rows + 1, &ghost)?;
                }
                d.sweep()
            }
        }
    }

    /// Waits for the device (before the runtime reads or writes the plate).
    fn settle(&self) -> dckpt::Result<()> {
        match self {
            Plate::Host { .. } => Ok(()),
            Plate::Device(d) => d.synchronize(),
        }
    }

    /// The real rows, on the host.
    fn real_rows(&self, rows: usize, cols: usize) -> dckpt::Result<Vec<f64>> {
        match self {
            Plate::Host { plate, .. } => Ok(plate[cols..(rows + 1) * cols].to_vec()),
            Plate::Device(d) => d.real_rows(),
        }
    }

    /// Writes `values` into the plate from row `row` on (row 0 is the top ghost row).
    fn set_rows(&mut self, row: usize, cols: usize, values: &[f64]) -> dckpt::Result<()> {
        match self {
            Plate::Host { plate, .. } => {
                plate[row * cols..row * cols + values.len()].copy_from_slice(values);
                Ok(())
            }
            Plate::Device(d) => d.set_rows(row, values),
        }
    }

    fn on_gpu(&self) -> bool {
        matches!(self, Plate::Device(_))
    }
}

fn run(world: &SimpleCommunicator, a: &Args) -> dckpt::Result<()> {
    let (rank, size) = (world.rank(), world.size());
    let (rows, cols) = (a.rows, a.cols);
    let mut plate = Plate::new(world, a)?;
    let mut step = [0u64; 1];
    let mut rt = Runtime::init(world, config(a)?);
    // SAFETY: the plate (host or device memory) and the counter outlive
    // every runtime call, and nothing touches them while one runs: this loop
    // is single-threaded and waits for the device before each call.
    unsafe {
        rt.protect(0, plate.region())?;
        rt.protect(1, Region::Host { ptr: step.as_mut_ptr().cast(), len: 8 })?;
    }
    if rank == 0 {
        println!("heat: the plate is in {} memory", if plate.on_gpu() { "GPU" } else { "host" });
    }
    // The checkpoints of a job of this size are "heat" (or "heat-P" when a
    // job of another size wrote "heat" first).
    // Every rank takes the same name: an old job seen by any rank counts
    // (a rank on a node that lost its directory sees none).
    let old = match rt.old_regions("heat") {
        Ok(old) => old,
        // One that this job cannot read (refused on every rank): say why.
        Err(e) if e.kind() == dckpt::ErrorKind::InvalidOption => return Err(e),
        // Anything else: the restart below rebuilds it or names it.
        Err(_) => Vec::new(),
    };
    let mut old_ranks = 0u64;
    world.all_reduce_into(&(old.len() as u64), &mut old_ranks, mpi::collective::SystemOperation::max());
    let resized = old_ranks > 0 && old_ranks != size as u64;
    let name = if resized { format!("heat-{size}") } else { "heat".to_string() };
    // The newest version every rank restores (an older one where the
    // newest is damaged on every tier; none: from the start).
    if rt.restart_latest(&name)?.is_some() {
        if rank == 0 {
            println!("heat: restarted from the checkpoint of step {}", step[0]);
        }
    } else if resized {
        // A job of another size wrote "heat": read this rank's rows of the
        // plate out of the old ranks' regions at their newest version.
        let version = rt.committed_versions("heat")?.last().copied();
        if let Some(v) = version {
            let read = redistribute(&rt, &old, v, (rank as usize, size as usize), rows, cols, &mut plate, &mut step);
            // Every rank goes on, or none does (the others would wait in the halo exchange).
            let mut failed = 0u8;
            world.all_reduce_into(&u8::from(read.is_err()), &mut failed, mpi::collective::SystemOperation::max());
            read?;
            if failed == 1 {
                let why = "another rank could not read its rows of the old job's plate (its message is above)";
                return Err(dckpt::Error::InvalidOption(why.into()));
            }
            if rank == 0 {
                println!(
                    "heat: restarted on {size} ranks from the {} ranks' checkpoint of step {}",
                    old.len(),
                    step[0]
                );
            }
        }
    }
    // Seconds this rank computed (halo exchange included); the runtime
    // keeps what its checkpoint calls cost.
    let mut compute = 0f64;
    let up = (rank > 0).then(|| world.process_at_rank(rank - 1));
    let down = (rank + 1 < size).then(|| world.process_at_rank(rank + 1));
    // Asked once before the first step too: the signals are watched from
    // here on (a scheduler's signal in the first step is not lost).
    if step[0] < a.run.steps && rt.should_exit()? {
        if rank == 0 {
            let why = rt.halt_reason().map(ToString::to_string).unwrap_or_default();
            println!("heat: stopping before step {} ({why}); nothing new to checkpoint", step[0] + 1);
        }
        common::finish(world, rt, &a.run, "heat", compute)?;
        return Ok(());
    }
    while step[0] < a.run.steps {
        if a.run.crashes_at(world, step[0]) {
            std::process::abort(); // what SIGKILL leaves
        }
        let started = std::time::Instant::now();
        plate.step(up.as_ref(), down.as_ref(), rows, cols)?;
        step[0] += 1;
        let checkpoint_now = step[0] % a.run.every == 0;
        if checkpoint_now {
            plate.settle()?;
        }
        compute += started.elapsed().as_secs_f64();
        if checkpoint_now {
            rt.checkpoint(&name, step[0])?;
        }
        if step[0] < a.run.steps
            && common::stop_if_asked(&mut rt, ("heat", &name), step[0], checkpoint_now, || plate.settle())?
        {
            common::finish(world, rt, &a.run, "heat", compute)?;
            return Ok(());
        }
    }
    plate.settle()?;
    let stats = common::finish(world, rt, &a.run, "heat", compute)?;
    let mut held = 0u64;
    world.all_reduce_into(&stats.held_on_gpu, &mut held, mpi::collective::SystemOperation::sum());
    if rank == 0 && held > 0 {
        println!("heat: {held} checkpoint calls returned with their diff held on the GPU (the host cache was full)");
    }
    // How far the node-local tier's copies on other nodes lagged behind
    // (with `redundancy`): the worst rank's.
    let lag = [stats.max_copy_lag_seen, stats.copy_waits, (stats.copy_wait_seconds * 1e6) as u64];
    let mut worst = [0u64; 3];
    world.all_reduce_into(&lag[..], &mut worst[..], mpi::collective::SystemOperation::max());
    if rank == 0 && worst[0] > 0 {
        println!(
            "heat: the copies lagged at most {} version(s) behind a call; {} call(s) waited for them, {:.1} ms",
            worst[0],
            worst[1],
            worst[2] as f64 / 1e3
        );
    }
    // The plate's digest, the same however it is split over ranks (and
    // wherever it lives): the digests of its rows, in global order, hashed
    // on rank 0.
    let mine: Vec<u8> = plate
        .real_rows(rows, cols)?
        .chunks(cols)
        .flat_map(|row| *blake3::hash(&row.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()).as_bytes())
        .collect();
    let mut all = vec![0u8; mine.len() * size as usize];
    world.all_gather_into(&mine[..], &mut all[..]);
    if rank == 0 {
        println!("heat: {size} ranks, {} steps, plate digest {}", a.run.steps, blake3::hash(&all).to_hex());
    }
    Ok(())
}

/// Fills this rank's rows (`rank * rows ..`) of the plate and the step
/// counter from the checkpoint `version` of a job of `old.len()` ranks
/// (their regions 0: plate with ghost rows; 1: the counter), reading only
/// the rows it needs.
#[allow(clippy::too_many_arguments)]
fn redistribute(
    rt: &Runtime,
    old: &[dckpt::runtime::table::RegionTable],
    version: u64,
    (rank, size): (usize, usize),
    rows: usize,
    cols: usize,
    plate: &mut Plate,
    step: &mut [u64; 1],
) -> dckpt::Result<()> {
    let row_bytes = (cols * 8) as u64;
    // Every old rank held the same number of rows (its plate: rows + 2 ghosts).
    let old_rows = old
        .first()
        .and_then(|t| t.get(0))
        .map(|e| (e.len / row_bytes).saturating_sub(2) as usize)
        .ok_or_else(|| dckpt::Error::InvalidOption("the old job left no plate".into()))?;
    let total = old_rows * old.len();
    if total != rows * size {
        let hint =
            if total.is_multiple_of(size) { format!(": run with --rows {}", total / size) } else { String::new() };
        return Err(dckpt::Error::InvalidOption(format!(
            "the old job's plate has {total} rows of {cols} ({} ranks × {old_rows}); this job's is {} ({size} × {rows}){hint}",
            old.len(),
            rows * size
        )));
    }
    // My global rows, one read per old rank that held some of them.
    let (first, end) = (rank * rows, (rank + 1) * rows);
    let mut global = first;
    while global < end {
        let owner = global / old_rows;
        let upto = end.min((owner + 1) * old_rows);
        let at = (global - owner * old_rows) as u64;
        let from = (at + 1) * row_bytes; // past the owner's top ghost row
        let bytes =
            rt.read_region("heat", owner as u32, 0, version, from..from + (upto - global) as u64 * row_bytes)?;
        let values: Vec<f64> =
            bytes.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap_or_default())).collect();
        plate.set_rows(global - first + 1, cols, &values)?;
        global = upto;
    }
    let counter = rt.read_region("heat", 0, 1, version, 0..8)?;
    step[0] = u64::from_le_bytes(counter.as_slice().try_into().unwrap_or_default());
    Ok(())
}
