//! Graph analytics with sparse per-vertex updates: label propagation on a
//! mesh-like graph, checkpointed through the runtime and restarted from its
//! newest checkpoint after a crash.
//!
//! ```text
//! mpirun -np 4 target/release/examples/labels [--steps 200] [--every 10] [--rows 128] [--cols 512]
//!        [--wave 40] [--config dckpt.toml] [--dir target/labels] [--crash-at STEP] [--report FILE]
//! ```
//!
//! The graph is a grid of `ranks × rows` by `cols` vertices (each linked to
//! its four neighbours) plus a few long edges inside each rank's part, as a
//! mesh with shortcuts. Each rank owns `rows` rows and stores its vertices
//! along a Z-order curve, as graph partitioners number them, each as
//! `(label u32, hops u32)`. Every `wave` iterations a new seed vertex takes a
//! label smaller than all before; each iteration a vertex takes the
//! smallest `(label, hops + 1)` its neighbours offer (the rows above and
//! below a rank's part are exchanged with its neighbours first). So only the
//! vertices on the waves' fronts change: sparse updates scattered over the
//! state, the case de-duplication is for. Every `every` iterations the
//! runtime checkpoints the vertices and the iteration counter.
//!
//! At start the run restarts from the newest checkpoint every rank has.
//! `--crash-at STEP` aborts rank `size - 1` at that iteration (what SIGKILL
//! leaves); the next run ends with the same vertices, bit for bit, as a run
//! never interrupted: rank 0 prints their BLAKE3 digest. `--report FILE`:
//! rank 0 appends a CSV line of what the run cost (`dckpt::runtime::study`).
// Protecting memory by address is `unsafe`: the runtime reads and writes the
// vertices and the counter during its calls.
#![allow(unsafe_code)]

#[path = "common/mod.rs"]
mod common;

use dckpt::config::{Bytes, Config};
use dckpt::runtime::{Region, Runtime};
use mpi::point_to_point as p2p;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::process::ExitCode;

/// A vertex no wave has reached: its label and its hops.
const UNREACHED: u32 = u32::MAX;

/// Command-line settings.
struct Args {
    rows: usize,
    cols: usize,
    wave: u64,
    /// `--steps`, `--every`, `--config`, `--dir`, `--crash-at`, `--report`.
    run: common::RunFlags,
}

/// Label propagation over a grid of vertices split into row blocks: sparse
/// per-vertex updates, checkpointed through dckpt's runtime.
#[derive(clap::Parser, Debug)]
#[command(name = "labels")]
struct Cli {
    /// Rows of vertices on each rank.
    #[arg(long, default_value_t = 128)]
    rows: usize,
    /// Columns of vertices.
    #[arg(long, default_value_t = 512)]
    cols: usize,
    /// Steps between new waves of labels.
    #[arg(long, default_value_t = 40)]
    wave: u64,
    #[command(flatten)]
    run: common::RunArgs,
}

fn parse() -> Result<Args, clap::Error> {
    let c = <Cli as clap::Parser>::try_parse()?;
    Ok(Args {
        rows: c.rows.max(1),
        cols: c.cols.max(2),
        wave: c.wave.max(1),
        run: c.run.with(common::RunFlags::new(200, 10, "target/labels")),
    })
}

fn main() -> ExitCode {
    common::main("labels", parse, run)
}

/// The configuration: the file given, else local directories under `dir`.
fn config(a: &Args) -> dckpt::Result<Config> {
    let defaults =
        Config { host_cache_size: Bytes(64 << 20), max_chain: Some(8), max_versions: Some(4), ..Config::default() };
    a.run.config(defaults)
}

/// splitmix64: the same graph and seeds on every machine.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Interleaves the bits of `row` and `col` (the Z-order key).
fn z_key(row: usize, col: usize) -> u64 {
    let spread = |v: usize| (0..32).fold(0u64, |k, b| k | ((((v >> b) & 1) as u64) << (2 * b)));
    spread(row) << 1 | spread(col)
}

/// One rank's part of the graph: `rows × cols` vertices, the first global
/// row `first_row`; vertex `(r, c)` (row-major index `r * cols + c`) is
/// stored at slot `slot[r * cols + c]`, and has its long edges in
/// `long[long_at[i]..long_at[i + 1]]` (row-major indices).
struct Part {
    rows: usize,
    cols: usize,
    first_row: usize,
    slot: Vec<u32>,
    long_at: Vec<u32>,
    long: Vec<u32>,
}

impl Part {
    fn new(rank: usize, rows: usize, cols: usize) -> Part {
        let n = rows * cols;
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| z_key(i / cols, i % cols));
        let mut slot = vec![0u32; n];
        for (s, &i) in order.iter().enumerate() {
            slot[i] = s as u32;
        }
        // About one vertex in 64 has a long edge to another of the part
        // (both ends listed: the graph is undirected).
        let first = rank * n;
        let mut pairs: Vec<(u32, u32)> = (0..n)
            .filter(|&i| mix((first + i) as u64).is_multiple_of(64))
            .flat_map(|i| {
                let j = (mix(!((first + i) as u64)) % n as u64) as usize;
                [(i as u32, j as u32), (j as u32, i as u32)]
            })
            .filter(|(i, j)| i != j)
            .collect();
        pairs.sort_unstable();
        pairs.dedup();
        let mut long_at = vec![0u32; n + 1];
        for &(i, _) in &pairs {
            long_at[i as usize + 1] += 1;
        }
        for i in 0..n {
            long_at[i + 1] += long_at[i];
        }
        let long = pairs.iter().map(|&(_, j)| j).collect();
        Part { rows, cols, first_row: rank * rows, slot, long_at, long }
    }

    /// The `(label, hops)` of vertex `i` (row-major) in `state`.
    fn get(&self, state: &[u32], i: usize) -> (u32, u32) {
        let s = self.slot[i] as usize;
        (state[2 * s], state[2 * s + 1])
    }

    /// Row `r` of `state` as `(label, hops)` pairs, row-major (for a neighbour).
    fn row(&self, state: &[u32], r: usize) -> Vec<u32> {
        (0..self.cols).flat_map(|c| <[u32; 2]>::from(self.get(state, r * self.cols + c))).collect()
    }

    /// Seeds wave `wave` if its vertex is in this part: a label smaller
    /// than every earlier wave's, at zero hops.
    fn seed(&self, state: &mut [u32], wave: u64, total_rows: usize) {
        let g = (mix(wave ^ 0x5eed) % (total_rows * self.cols) as u64) as usize;
        let (row, col) = (g / self.cols, g % self.cols);
        if (self.first_row..self.first_row + self.rows).contains(&row) {
            let s = self.slot[(row - self.first_row) * self.cols + col] as usize;
            state[2 * s] = UNREACHED - 1 - wave as u32;
            state[2 * s + 1] = 0;
        }
    }

    /// One iteration from `state` into `next` (`above` and `below`: the
    /// neighbours' edge rows, as pairs); returns how many vertices changed.
    fn step(&self, state: &[u32], next: &mut [u32], above: &[u32], below: &[u32]) -> u64 {
        let (rows, cols) = (self.rows, self.cols);
        let mut changed = 0;
        for r in 0..rows {
            for c in 0..cols {
                let i = r * cols + c;
                let mut best = self.get(state, i);
                let mut offer = |(label, hops): (u32, u32)| {
                    let via = (label, hops.saturating_add(1));
                    if label != UNREACHED && via < best {
                        best = via;
                    }
                };
                let ghost = |row: &[u32]| (row[2 * c], row[2 * c + 1]);
                offer(if r > 0 { self.get(state, i - cols) } else { ghost(above) });
                offer(if r + 1 < rows { self.get(state, i + cols) } else { ghost(below) });
                if c > 0 {
                    offer(self.get(state, i - 1));
                }
                if c + 1 < cols {
                    offer(self.get(state, i + 1));
                }
                for &j in &self.long[self.long_at[i] as usize..self.long_at[i + 1] as usize] {
                    offer(self.get(state, j as usize));
                }
                let s = self.slot[i] as usize;
                changed += u64::from(best != (state[2 * s], state[2 * s + 1]));
                next[2 * s] = best.0;
                next[2 * s + 1] = best.1;
            }
        }
        changed
    }
}

fn run(world: &SimpleCommunicator, a: &Args) -> dckpt::Result<()> {
    let (rank, size) = (world.rank(), world.size());
    let part = Part::new(rank as usize, a.rows, a.cols);
    let n = a.rows * a.cols;
    let mut state = vec![UNREACHED; 2 * n];
    let mut next = state.clone();
    let mut step = [0u64; 1];
    let mut rt = Runtime::init(world, config(a)?);
    // SAFETY: `state` and the counter outlive every runtime call, are never
    // reallocated (the iteration copies `next` into `state`), and nothing
    // touches them while one runs: this loop is single-threaded.
    unsafe {
        rt.protect(0, Region::Host { ptr: state.as_mut_ptr().cast(), len: state.len() * 4 })?;
        rt.protect(1, Region::Host { ptr: step.as_mut_ptr().cast(), len: 8 })?;
    }
    // The newest version every rank restores (an older one where the
    // newest is damaged on every tier; none: from the start).
    let restarted = rt.restart_latest("labels")?.is_some();
    if restarted && rank == 0 {
        println!("labels: restarted from the checkpoint of iteration {}", step[0]);
    }
    let up = (rank > 0).then(|| world.process_at_rank(rank - 1));
    let down = (rank + 1 < size).then(|| world.process_at_rank(rank + 1));
    let unreached_row = vec![UNREACHED; 2 * a.cols];
    let (mut above, mut below) = (unreached_row.clone(), unreached_row.clone());
    let (mut compute, mut changed, mut iterations) = (0f64, 0u64, 0u64);
    let total_rows = a.rows * size as usize;
    while step[0] < a.run.steps {
        if a.run.crashes_at(world, step[0]) {
            std::process::abort(); // what SIGKILL leaves
        }
        let started = std::time::Instant::now();
        if step[0] % a.wave == 0 {
            part.seed(&mut state, step[0] / a.wave, total_rows);
        }
        if let Some(p) = &up {
            p2p::send_receive_into(&part.row(&state, 0)[..], p, &mut above[..], p);
        }
        if let Some(p) = &down {
            p2p::send_receive_into(&part.row(&state, a.rows - 1)[..], p, &mut below[..], p);
        }
        changed += part.step(&state, &mut next, &above, &below);
        state.copy_from_slice(&next);
        step[0] += 1;
        iterations += 1;
        compute += started.elapsed().as_secs_f64();
        let checkpoint_now = step[0] % a.run.every == 0;
        if checkpoint_now {
            rt.checkpoint("labels", step[0])?;
        }
        if step[0] < a.run.steps
            && common::stop_if_asked(&mut rt, ("labels", "labels"), step[0], checkpoint_now, || Ok(()))?
        {
            common::finish(world, rt, &a.run, "labels", compute)?;
            return Ok(());
        }
    }
    let stats = common::finish(world, rt, &a.run, "labels", compute)?;
    let mine = [stats.stored_bytes, stats.protected_bytes, changed, iterations];
    let mut sums = [0u64; 4];
    world.all_reduce_into(&mine[..], &mut sums[..], mpi::collective::SystemOperation::sum());
    let digest = *blake3::hash(&state.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()).as_bytes();
    let mut all = vec![0u8; 32 * size as usize];
    world.all_gather_into(&digest[..], &mut all[..]);
    if rank == 0 {
        let [stored, protected, changed, iterations] = sums;
        println!(
            "labels: {size} ranks, {} vertices; this run changed {:.2}% of the vertices per iteration and its \
             checkpoints stored {stored} of {protected} protected bytes ({:.3})",
            n * size as usize,
            100.0 * changed as f64 / (n as f64 * iterations.max(1) as f64),
            stored as f64 / protected.max(1) as f64
        );
        println!("labels: {size} ranks, {} iterations, digest {}", a.run.steps, blake3::hash(&all).to_hex());
    }
    Ok(())
}
