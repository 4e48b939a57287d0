//! An adjoint run as reverse-time migration (RTM) does it: a forward pass
//! checkpoints the source wavefield every few steps; the backward pass
//! restores those versions in reverse order, telling the runtime which
//! versions come next (prefetch hints), and correlates each with the
//! receiver wavefield into an image.
//!
//! ```text
//! mpirun -np 4 target/release/examples/adjoint [--steps 200] [--every 10] [--n 256]
//!        [--hints none|next|all] [--config dckpt.toml] [--dir target/adjoint] [--crash-at STEP]
//!        [--report FILE]
//! ```
//!
//! Each rank migrates its own shot (as RTM codes spread shots over ranks):
//! a 2-D acoustic wave equation on an `n × n` grid (f32, second order in
//! time, a Ricker source whose position depends on the rank). Forward:
//! `steps` steps, and every `every` steps a collective checkpoint of the two
//! time levels and the step counter. Backward: the receiver wavefield runs
//! from the last step to the first (its source, time-reversed, at the
//! receiver); at each checkpointed step the run restores that version and
//! adds `p · q` to the image. `--hints all` enqueues every version the
//! backward pass will restore, newest first, before it starts; `next` hints
//! only the next one before each restore; `none` gives no hint. A run that
//! took the forward pass itself checks every restored version against the
//! digest it had when it was checkpointed.
//!
//! At start the run restarts from the newest checkpoint every rank has
//! (the forward pass goes on from there, or the backward pass starts if the
//! forward pass was done). `--crash-at STEP` aborts rank `size - 1` at that
//! step (`steps + b` is the backward pass's step `b`): the next run ends
//! with the same image, bit for bit, as a run never interrupted (rank 0
//! prints its digest). `--report FILE`: rank 0 appends a CSV line of what
//! the checkpoints cost (`dckpt::runtime::study`).
// Protecting memory by address is `unsafe`: the runtime reads and writes the
// wavefield and the counter during its calls.
#![allow(unsafe_code)]

#[path = "common/mod.rs"]
mod common;

use dckpt::config::{Bytes, Config};
use dckpt::runtime::{Region, Runtime};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Instant;

/// The checkpoint's name.
const NAME: &str = "adjoint";

/// Which versions the backward pass announces.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
enum Hints {
    /// None: every restore reads the disks.
    None,
    /// The next version only.
    Next,
    /// Every version, in the order it will be read.
    All,
}

/// Command-line settings.
struct Args {
    n: usize,
    hints: Hints,
    /// `--steps`, `--every`, `--config`, `--dir`, `--crash-at`, `--report`.
    run: common::RunFlags,
}

/// An adjoint (RTM-like) run: a forward pass checkpointing a wavefield, a
/// backward pass restoring the versions in reverse, with prefetch hints.
#[derive(clap::Parser, Debug)]
#[command(name = "adjoint")]
struct Cli {
    /// The wavefield's side (n x n doubles on each rank).
    #[arg(long, default_value_t = 256)]
    n: usize,
    /// Which versions the backward pass announces to the prefetcher.
    #[arg(long, value_enum, default_value_t = Hints::All)]
    hints: Hints,
    #[command(flatten)]
    run: common::RunArgs,
}

fn parse() -> Result<Args, clap::Error> {
    let c = <Cli as clap::Parser>::try_parse()?;
    Ok(Args { n: c.n.max(16), hints: c.hints, run: c.run.with(common::RunFlags::new(200, 10, "target/adjoint")) })
}

fn main() -> ExitCode {
    common::main("adjoint", parse, run)
}

/// The configuration: the file given, else local directories under `dir`,
/// every version kept (the backward pass needs them all) and a prefetch
/// cache.
fn config(a: &Args) -> dckpt::Result<Config> {
    let defaults = Config {
        host_cache_size: Bytes(64 << 20),
        prefetch_cache_size: Bytes(64 << 20),
        max_chain: Some(8),
        ..Config::default()
    };
    a.run.config(defaults)
}

/// The Ricker wavelet (peak frequency about 1/25 of the step rate) at step `t`.
fn ricker(t: u64) -> f32 {
    let x = (t as f32 - 40.0) / 12.0;
    (1.0 - 2.0 * x * x) * (-x * x).exp()
}

/// One step of the wave equation: `next = 2 p - prev + r² ∇²p` inside the
/// grid (the edges stay 0), plus `source` at `at`.
fn wave_step(n: usize, p: &[f32], prev: &[f32], next: &mut [f32], at: usize, source: f32) {
    const R2: f32 = 0.2;
    for i in 1..n - 1 {
        for j in 1..n - 1 {
            let k = i * n + j;
            let lap = p[k - 1] + p[k + 1] + p[k - n] + p[k + n] - 4.0 * p[k];
            next[k] = 2.0 * p[k] - prev[k] + R2 * lap;
        }
    }
    next[at] += source;
}

fn digest(field: &[f32]) -> [u8; 32] {
    *blake3::hash(&field.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()).as_bytes()
}

fn run(world: &SimpleCommunicator, a: &Args) -> dckpt::Result<()> {
    let (rank, size) = (world.rank(), world.size());
    let n = a.n;
    // This rank's shot and the receiver it is migrated with.
    let shot = (n / 3) * n + n / 8 + (rank as usize * 7) % (n / 2);
    let receiver = (n / 3) * n + n - 1 - n / 8;
    let (mut p, mut prev, mut next) = (vec![0f32; n * n], vec![0f32; n * n], vec![0f32; n * n]);
    let mut step = [0u64; 1];
    let mut rt = Runtime::init(world, config(a)?);
    // SAFETY: the two time levels and the counter outlive every runtime
    // call, are never reallocated (a step copies into them), and nothing
    // touches them while one runs: this loop is single-threaded.
    unsafe {
        rt.protect(0, Region::Host { ptr: p.as_mut_ptr().cast(), len: p.len() * 4 })?;
        rt.protect(1, Region::Host { ptr: prev.as_mut_ptr().cast(), len: prev.len() * 4 })?;
        rt.protect(2, Region::Host { ptr: step.as_mut_ptr().cast(), len: 8 })?;
    }
    // The newest version every rank restores (an older one where the
    // newest is damaged on every tier; none: from the start).
    let restarted = rt.restart_latest(NAME)?.is_some();
    if restarted && rank == 0 {
        println!("adjoint: restarted from the checkpoint of step {}", step[0]);
    }
    // Forward: the digests of the versions this process checkpointed.
    let mut taken: HashMap<u64, [u8; 32]> = HashMap::new();
    let mut compute = 0f64;
    while step[0] < a.run.steps {
        if a.run.crashes_at(world, step[0]) {
            std::process::abort(); // what SIGKILL leaves
        }
        let t = Instant::now();
        wave_step(n, &p, &prev, &mut next, shot, ricker(step[0]));
        prev.copy_from_slice(&p);
        p.copy_from_slice(&next);
        step[0] += 1;
        compute += t.elapsed().as_secs_f64();
        if step[0] % a.run.every == 0 {
            rt.checkpoint(NAME, step[0])?;
            taken.insert(step[0], digest(&p));
        }
    }
    // Backward: the versions, newest first (the last one is in memory).
    let versions: Vec<u64> = (1..a.run.steps).rev().filter(|s| s % a.run.every == 0).collect();
    if a.hints == Hints::All {
        versions.iter().try_for_each(|&v| rt.prefetch_enqueue(NAME, v))?;
        rt.prefetch_start(NAME)?;
    }
    let (mut q, mut q_prev) = (vec![0f32; n * n], vec![0f32; n * n]);
    let mut image = vec![0f64; n * n];
    let mut restores = Vec::with_capacity(versions.len());
    for b in 0..a.run.steps {
        if a.run.crashes_at(world, a.run.steps + b) {
            std::process::abort();
        }
        let time = a.run.steps - 1 - b; // the receiver's source, time-reversed
        let t = Instant::now();
        wave_step(n, &q, &q_prev, &mut next, receiver, ricker(time));
        q_prev.copy_from_slice(&q);
        q.copy_from_slice(&next);
        compute += t.elapsed().as_secs_f64();
        if time == 0 || !time.is_multiple_of(a.run.every) {
            continue;
        }
        let k = versions.iter().position(|&v| v == time);
        if a.hints == Hints::Next {
            if k == Some(0) {
                rt.prefetch_enqueue(NAME, time)?;
            }
            if let Some(&after) = k.and_then(|k| versions.get(k + 1)) {
                rt.prefetch_enqueue(NAME, after)?;
            }
            rt.prefetch_start(NAME)?;
        }
        let t = Instant::now();
        rt.restart(NAME, time)?;
        restores.push(t.elapsed().as_secs_f64());
        if let Some(want) = taken.get(&time)
            && (digest(&p) != *want || step[0] != time)
        {
            return Err(dckpt::Error::Internal(format!("version {time} restored other bytes")));
        }
        for (acc, (&s, &r)) in image.iter_mut().zip(p.iter().zip(&q)) {
            *acc += f64::from(s) * f64::from(r);
        }
    }
    let prefetch = rt.prefetch_stats(NAME).unwrap_or_default();
    common::finish(world, rt, &a.run, "adjoint", compute)?;
    // What the restores cost (the slowest rank's) and where their bytes came from.
    let restored: f64 = restores.iter().sum();
    let slowest_one = restores.iter().copied().fold(0f64, f64::max);
    let mut worst = [0f64; 2];
    world.all_reduce_into(&[restored, slowest_one][..], &mut worst[..], mpi::collective::SystemOperation::max());
    let bytes = [prefetch.hit_bytes, prefetch.miss_bytes + prefetch.inflight_bytes];
    let mut sums = [0u64; 2];
    world.all_reduce_into(&bytes[..], &mut sums[..], mpi::collective::SystemOperation::sum());
    let mine = *blake3::hash(&image.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()).as_bytes();
    let mut all = vec![0u8; 32 * size as usize];
    world.all_gather_into(&mine[..], &mut all[..]);
    if rank == 0 {
        println!(
            "adjoint: {size} ranks, hints {:?}: {} restores in {:.1} ms (slowest rank; slowest restore {:.2} ms), \
             {} of {} bytes read from the prefetch cache",
            a.hints,
            restores.len(),
            worst[0] * 1e3,
            worst[1] * 1e3,
            sums[0],
            sums[0] + sums[1]
        );
        println!("adjoint: {size} ranks, {} steps, image digest {}", a.run.steps, blake3::hash(&all).to_hex());
    }
    Ok(())
}
