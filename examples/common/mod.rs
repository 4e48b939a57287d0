//! What the Rust examples share: MPI start-up and error reporting, the
//! `--flag value` loop, the default configuration, and the end of a run
//! (finalize, then the scaling study's CSV line). Each example includes it
//! with `#[path]`; not every example uses every item.
#![allow(dead_code)]

use dckpt::config::Config;
use dckpt::runtime::Runtime;
use dckpt::runtime::study::{RunStats, StudyRun, append_study_line};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::path::Path;
use std::process::ExitCode;

/// Initializes MPI, parses the arguments (`parse`), runs `run`; an error is
/// printed as `NAME: rank R: ERROR` and makes the exit status 1. MPI is
/// finalized before the process exits.
pub fn main<A>(
    name: &str,
    parse: impl FnOnce() -> Result<A, String>,
    run: impl FnOnce(&SimpleCommunicator, &A) -> dckpt::Result<()>,
) -> ExitCode {
    let Some(universe) = mpi::initialize() else {
        eprintln!("{name}: MPI could not be initialized");
        return ExitCode::FAILURE;
    };
    let world = universe.world();
    let code = match parse().map_err(dckpt::Error::InvalidOption).and_then(|a| run(&world, &a)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: rank {}: {e}", world.rank());
            ExitCode::FAILURE
        }
    };
    drop(universe);
    code
}

/// Walks the command line's `--flag value` pairs, giving each to `set`
/// (which refuses an unknown flag or a bad value).
pub fn flags(mut set: impl FnMut(&str, &str) -> Result<(), String>) -> Result<(), String> {
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        set(&flag, &value)?;
    }
    Ok(())
}

/// `value` of `flag` as a number.
pub fn num(flag: &str, value: &str) -> Result<u64, String> {
    value.parse::<u64>().map_err(|_| format!("{flag}: '{value}' is not a number"))
}

/// `value` of `flag` as a size in bytes (`4M`, `64K`, …).
pub fn size(flag: &str, value: &str) -> Result<usize, String> {
    dckpt::generate::parse_size(value).map(|n| n as usize).map_err(|e| format!("{flag}: {e}"))
}

/// The configuration: the file given, else the example's `defaults`
/// (`DCKPT_<KEY>` overrides apply either way).
pub fn config(file: Option<&Path>, defaults: Config) -> dckpt::Result<Config> {
    match file {
        Some(file) => Config::load(Some(file)),
        None => defaults.with_env(),
    }
}

/// Ends a run: waits for every checkpoint to be durable (`finalize`) and,
/// with `report`, appends the job's line to the scaling study's CSV (the
/// drain measured here). Returns what this rank's checkpoint calls cost.
/// Collective.
pub fn finish(
    world: &SimpleCommunicator,
    rt: Runtime,
    report: Option<&Path>,
    mut run: StudyRun<'_>,
) -> dckpt::Result<RunStats> {
    let (stats, config) = (rt.stats(), rt.config().clone());
    let t = std::time::Instant::now();
    rt.finalize()?;
    if let Some(file) = report {
        run.drain_seconds = t.elapsed().as_secs_f64();
        append_study_line(world, file, &run, &stats, &config)?;
    }
    Ok(stats)
}
