//! A toy MPI simulation that protects its state with collective checkpoints.
//!
//! ```text
//! mpirun -np 4 target/release/examples/collective_sim [DIR] [STEPS] [CELLS]
//! ```
//!
//! Each rank owns a strip of a 1-D heat equation (its private state) and a
//! copy of a material table that every rank holds identically (the kind of
//! replicated data collective de-duplication stores once). Every step
//! advances the strip, and every rank checkpoints its buffer with
//! `Collective::checkpoint`. At the end each rank restores its own last
//! version and its right neighbour's (any process can restore any rank's
//! version), checks them byte for byte, and rank 0 prints what the store
//! holds.

use dckpt::collective::{Collective, CollectiveOptions};
use dckpt::{Method, StoreOptions};
use mpi::collective::SystemOperation;
use mpi::traits::*;
use std::path::PathBuf;
use std::process::ExitCode;

/// The protected state of one rank, serialized into one buffer.
struct State {
    /// Temperatures of this rank's cells (changes every step, in a few places).
    strip: Vec<f64>,
    /// Material table: identical on every rank, constant.
    table: Vec<f64>,
}

impl State {
    fn new(rank: i32, cells: usize) -> Self {
        let strip = (0..cells).map(|i| if i % 4096 == 0 { 100.0 + f64::from(rank) } else { 0.0 }).collect();
        let table = (0..cells).map(|i| (i as f64 * 0.001).sin() * 1e3).collect();
        State { strip, table }
    }

    /// One explicit step of u_t = u_xx; the heat spreads from the sources,
    /// so most cells stay untouched for a while.
    fn step(&mut self) {
        let u = &self.strip;
        let mut next = u.clone();
        for i in 1..u.len() - 1 {
            let d = u[i - 1] - 2.0 * u[i] + u[i + 1];
            if d != 0.0 {
                next[i] = u[i] + 0.25 * d;
            }
        }
        self.strip = next;
    }

    fn bytes(&self) -> Vec<u8> {
        self.table.iter().chain(&self.strip).flat_map(|x| x.to_le_bytes()).collect()
    }
}

fn main() -> ExitCode {
    let Some(universe) = mpi::initialize() else {
        eprintln!("collective_sim: MPI could not be initialized");
        return ExitCode::FAILURE;
    };
    let world = universe.world();
    let args: Vec<String> = std::env::args().collect();
    let dir = PathBuf::from(args.get(1).map_or("target/collective-sim", String::as_str));
    let steps: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10);
    let cells: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1 << 18);
    let result = run(&world, &dir, steps, cells);
    let code = match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("collective_sim: rank {}: {e}", world.rank());
            ExitCode::FAILURE
        }
    };
    drop(universe); // MPI_Finalize
    code
}

fn run(world: &impl Communicator, dir: &std::path::Path, steps: u64, cells: usize) -> dckpt::Result<()> {
    let (rank, size) = (world.rank(), world.size());
    let mut state = State::new(rank, cells);
    let len = (2 * cells * 8) as u64;
    let store = StoreOptions { chunk_size: 128, method: Method::Tree, ..StoreOptions::default() };
    let mut ckpt = Collective::open(world, dir, len, &store, &CollectiveOptions::default())?;
    for w in &ckpt.engine().open_report().warnings {
        eprintln!("dckpt: warning: {w}");
    }
    let first = ckpt.engine().latest().map_or(1, |v| v + 1);
    let (mut stored, mut logical, mut referenced, mut reduce) = (0u64, 0u64, 0u64, 0.0f64);
    for v in first..first + steps {
        state.step();
        let r = ckpt.checkpoint(v, &state.bytes())?;
        stored += r.checkpoint.file_bytes;
        logical += len;
        referenced += r.bytes_referenced;
        reduce = reduce.max(r.reduce_seconds);
    }
    let last = first + steps - 1;
    // Restore our own last version and the right neighbour's (recomputed here to compare).
    let own = dckpt::restore::restore_version(dir, rank as u32, last)?;
    let right = (rank + 1) % size;
    let mut theirs = State::new(right, cells);
    for _ in 0..steps {
        theirs.step();
    }
    let neighbour = dckpt::restore::restore_version(dir, right as u32, last)?;
    let ok = own == state.bytes() && neighbour == theirs.bytes();
    let mut all_ok = 0u8;
    world.all_reduce_into(&u8::from(ok), &mut all_ok, SystemOperation::min());
    let mut totals = [0u64; 3];
    world.all_reduce_into(&[stored, logical, referenced][..], &mut totals[..], SystemOperation::sum());
    if rank == 0 {
        println!(
            "collective_sim: {size} ranks, versions {first}..={last}: {} logical bytes stored in {} ({:.1}x), \
             {} bytes referenced across ranks, slowest reduction {:.3} s, restores {}",
            totals[1],
            totals[0],
            totals[1] as f64 / totals[0] as f64,
            totals[2],
            reduce,
            if all_ok == 1 { "byte-exact" } else { "WRONG" }
        );
    }
    if all_ok == 1 { Ok(()) } else { Err(dckpt::Error::Collective("a restored version differs".into())) }
}
