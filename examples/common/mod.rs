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
use std::path::PathBuf;
use std::process::ExitCode;

/// Initializes MPI, parses the arguments (`parse`), runs `run`; an error is
/// printed as `NAME: rank R: ERROR` and makes the exit status 1. MPI is
/// finalized before the process exits.
pub fn main<A>(
    name: &str,
    parse: impl FnOnce() -> Result<A, String>,
    run: impl FnOnce(&SimpleCommunicator, &A) -> dckpt::Result<()>,
) -> ExitCode {
    let Some((universe, _)) = mpi::initialize_with_threading(mpi::Threading::Multiple) else {
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

/// Walks the command line's `--flag value` pairs: each goes to `set` (the
/// example's own flags: `Ok(false)` for one it does not know), then to
/// `run`; a flag neither knows is refused.
pub fn flags(run: &mut RunFlags, mut set: impl FnMut(&str, &str) -> Result<bool, String>) -> Result<(), String> {
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        if !set(&flag, &value)? && !run.set(&flag, &value)? {
            return Err(format!("unknown option {flag}"));
        }
    }
    Ok(())
}

/// `value` of `flag` as a number.
pub fn num(flag: &str, value: &str) -> Result<u64, String> {
    value.parse::<u64>().map_err(|_| format!("{flag}: '{value}' is not a number"))
}

/// `value` of `flag` as a size in bytes (`4M`, `64K`, …).
pub fn size(flag: &str, value: &str) -> Result<usize, String> {
    dckpt::sizes::parse_size(value).map(|n| n as usize).map_err(|e| format!("{flag}: {e}"))
}

/// The flags every example takes: `--steps N`, `--every N` (steps between
/// checkpoints), `--config FILE`, `--dir DIR` (where the default
/// configuration puts its directories), `--crash-at STEP` (the last rank
/// aborts there, what SIGKILL leaves) and `--report FILE` (the scaling
/// study's CSV).
#[derive(Debug)]
pub struct RunFlags {
    pub steps: u64,
    pub every: u64,
    pub config: Option<PathBuf>,
    pub dir: PathBuf,
    pub crash_at: Option<u64>,
    pub report: Option<PathBuf>,
}

impl RunFlags {
    /// The defaults: `steps`, a checkpoint every `every`, `dir` for the directories.
    pub fn new(steps: u64, every: u64, dir: &str) -> RunFlags {
        RunFlags { steps, every, config: None, dir: PathBuf::from(dir), crash_at: None, report: None }
    }

    /// Takes `flag` if it is one of these (`Ok(false)`: not one of these).
    pub fn set(&mut self, flag: &str, value: &str) -> Result<bool, String> {
        match flag {
            "--steps" => self.steps = num(flag, value)?,
            "--every" => self.every = num(flag, value)?.max(1),
            "--config" => self.config = Some(PathBuf::from(value)),
            "--dir" => self.dir = PathBuf::from(value),
            "--crash-at" => self.crash_at = Some(num(flag, value)?),
            "--report" => self.report = Some(PathBuf::from(value)),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The configuration: the file given, else `defaults` with the
    /// directories `DIR/scratch` and `DIR/persistent` (`DCKPT_<KEY>`
    /// overrides apply either way).
    pub fn config(&self, defaults: Config) -> dckpt::Result<Config> {
        match &self.config {
            Some(file) => Config::load(Some(file)),
            None => Config {
                scratch: Some(self.dir.join("scratch")),
                persistent: Some(self.dir.join("persistent")),
                ..defaults
            }
            .with_env(),
        }
    }

    /// Whether this rank dies at `step` (the last rank, at `--crash-at`).
    pub fn crashes_at(&self, world: &SimpleCommunicator, step: u64) -> bool {
        self.crash_at == Some(step) && world.rank() == world.size() - 1
    }
}

/// Asks the runtime whether the job should stop (a scheduler's signal, the
/// walltime nearly spent; the same answer on every rank). If so, makes sure
/// `step` is checkpointed (`checkpointed`: the loop just took it) and
/// durable (`ready` first brings the regions up to date, as before any
/// checkpoint), says so on rank 0, and returns true: the example then ends
/// with exit status 0, and the same command resumes from that step.
pub fn stop_if_asked(
    rt: &mut Runtime,
    (example, name): (&str, &str),
    step: u64,
    checkpointed: bool,
    ready: impl FnOnce() -> dckpt::Result<()>,
) -> dckpt::Result<bool> {
    if !rt.should_exit()? {
        return Ok(false);
    }
    if !checkpointed {
        ready()?;
        rt.checkpoint(name, step)?;
    }
    rt.wait(name, step)?;
    if rt.rank() == 0 {
        let why = rt.halt_reason().map(ToString::to_string).unwrap_or_default();
        println!(
            "{example}: stopping after step {step} ({why}); its checkpoint is durable: run the same command to go on"
        );
    }
    Ok(true)
}

/// Ends a run of `example`: waits for every checkpoint to be durable
/// (`finalize`) and, with `--report`, appends the job's line to the scaling
/// study's CSV (its flags, `compute_seconds` of simulation, the drain
/// measured here). Returns what this rank's checkpoint calls cost.
/// Collective.
pub fn finish(
    world: &SimpleCommunicator,
    mut rt: Runtime,
    flags: &RunFlags,
    example: &str,
    compute_seconds: f64,
) -> dckpt::Result<RunStats> {
    let t = std::time::Instant::now();
    // The last version's collective step may still run in the background.
    rt.settle();
    let (stats, config) = (rt.stats(), rt.config().clone());
    rt.finalize()?;
    if let Some(file) = flags.report.as_deref() {
        let run = StudyRun {
            example,
            steps: flags.steps,
            every: flags.every,
            compute_seconds,
            drain_seconds: t.elapsed().as_secs_f64(),
        };
        append_study_line(world, file, &run, &stats, &config)?;
    }
    Ok(stats)
}
