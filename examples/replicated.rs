//! A replicated-data application: every rank holds the same large table
//! (think of a lookup table, a mesh or a dictionary every process keeps a
//! copy of) beside a small state of its own, and checkpoints both through
//! the runtime. The collective step stores each of the table's regions once
//! for all ranks (one owner; the others reference it), so the job stores
//! about one table, not one per rank.
//!
//! ```text
//! mpirun -np 4 target/release/examples/replicated [--steps 60] [--every 10] [--table 4M]
//!        [--local 64K] [--config dckpt.toml] [--dir target/replicated] [--crash-at STEP] [--report FILE]
//! ```
//!
//! Every step changes a few KiB of the table (the same change on every
//! rank) and of each rank's own state; every `every` steps the runtime
//! checkpoints the table, the state and the step counter. At start the run
//! restarts from the newest checkpoint every rank has. Rank 0 prints what
//! the checkpoints stored against what they protected, and a digest of the
//! final data: a run killed with `--crash-at` (rank `size - 1` aborts at that
//! step) and started again prints the digest of a run never interrupted.
//! `--report FILE`: rank 0 appends a CSV line of what the run cost
//! (`dckpt::runtime::study`).
// Protecting memory by address is `unsafe`: the runtime reads and writes the
// regions during its calls.
#![allow(unsafe_code)]

#[path = "common/mod.rs"]
mod common;

use dckpt::config::{Bytes, Config};
use dckpt::runtime::{Region, Runtime};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::process::ExitCode;

/// Command-line settings.
struct Args {
    table: usize,
    local: usize,
    /// `--steps`, `--every`, `--config`, `--dir`, `--crash-at`, `--report`.
    run: common::RunFlags,
}

/// Replicated data: a table every rank holds alike (stored once for all
/// ranks by the collective step) beside each rank's own state.
#[derive(clap::Parser, Debug)]
#[command(name = "replicated")]
struct Cli {
    /// Bytes of the table every rank holds (4M, 64K, ...).
    #[arg(long, value_parser = common::size, default_value = "4M")]
    table: usize,
    /// Bytes of each rank's own state.
    #[arg(long, value_parser = common::size, default_value = "64K")]
    local: usize,
    #[command(flatten)]
    run: common::RunArgs,
}

fn parse() -> Result<Args, clap::Error> {
    let c = <Cli as clap::Parser>::try_parse()?;
    Ok(Args {
        table: c.table.max(4096),
        local: c.local.max(4096),
        run: c.run.with(common::RunFlags::new(60, 10, "target/replicated")),
    })
}

fn main() -> ExitCode {
    common::main("replicated", parse, run)
}

/// xorshift64*: the same bytes on every machine.
fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let v = x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

/// Step `step`'s change: 4 KiB of `buf` at a place that depends on the step and `salt`.
fn change(buf: &mut [u8], step: u64, salt: u64) {
    let span = 4096.min(buf.len());
    let at = ((step.wrapping_mul(7919).wrapping_add(salt * 104_729)) as usize % (buf.len() / span)) * span;
    fill(&mut buf[at..at + span], step * 1000 + salt);
}

fn run(world: &SimpleCommunicator, a: &Args) -> dckpt::Result<()> {
    let (rank, size) = (world.rank(), world.size());
    let config = a.run.config(Config { host_cache_size: Bytes(64 << 20), max_chain: Some(8), ..Config::default() })?;
    let mut table = vec![0u8; a.table];
    fill(&mut table, 1); // the same on every rank
    let mut local = vec![0u8; a.local];
    fill(&mut local, 1000 + rank as u64);
    let mut step = [0u64; 1];
    let mut rt = Runtime::init(world, config);
    // SAFETY: the three buffers outlive every runtime call, are never
    // reallocated, and nothing touches them while one runs.
    unsafe {
        rt.protect(0, Region::host(&mut table))?;
        rt.protect(1, Region::host(&mut local))?;
        rt.protect(2, Region::Host { ptr: step.as_mut_ptr().cast(), len: 8 })?;
    }
    // The newest version every rank restores (an older one where the
    // newest is damaged on every tier; none: from the start).
    let restarted = rt.restart_latest("replicated")?.is_some();
    if restarted && rank == 0 {
        println!("replicated: restarted from the checkpoint of step {}", step[0]);
    }
    let mut compute = 0f64;
    while step[0] < a.run.steps {
        if a.run.crashes_at(world, step[0]) {
            std::process::abort(); // what SIGKILL leaves
        }
        let started = std::time::Instant::now();
        change(&mut table, step[0], 0);
        change(&mut local, step[0], 1 + rank as u64);
        step[0] += 1;
        compute += started.elapsed().as_secs_f64();
        if step[0] % a.run.every == 0 {
            rt.checkpoint("replicated", step[0])?;
        }
    }
    let stats = common::finish(world, rt, &a.run, "replicated", compute)?;
    let mine = [stats.stored_bytes, stats.protected_bytes, stats.referenced_bytes];
    let mut sums = [0u64; 3];
    world.all_reduce_into(&mine[..], &mut sums[..], mpi::collective::SystemOperation::sum());
    // The digest: the table (the same everywhere, checked) and every rank's state.
    let digest = *blake3::hash(&[table.as_slice(), local.as_slice()].concat()).as_bytes();
    let mut all = vec![0u8; 32 * size as usize];
    world.all_gather_into(&digest[..], &mut all[..]);
    let table_digest = blake3::hash(&table);
    let mut tables = vec![0u8; 32 * size as usize];
    world.all_gather_into(table_digest.as_bytes(), &mut tables[..]);
    if tables.chunks(32).any(|d| d != table_digest.as_bytes()) {
        return Err(dckpt::Error::Internal("the ranks' tables differ".into()));
    }
    if rank == 0 {
        let [stored, protected, referenced] = sums;
        println!(
            "replicated: {size} ranks, table {} B + state {} B each; this run's checkpoints stored {stored} of \
             {protected} protected bytes ({:.3}), {referenced} bytes referenced across ranks instead of stored",
            a.table,
            a.local,
            stored as f64 / protected.max(1) as f64
        );
        println!("replicated: {size} ranks, {} steps, digest {}", a.run.steps, blake3::hash(&all).to_hex());
    }
    Ok(())
}
