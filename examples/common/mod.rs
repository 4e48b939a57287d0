//! What the Rust examples share: MPI start-up and error reporting, the
//! flags every example takes (`clap`), the default configuration, and the end of a run
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

/// Parses the arguments (`parse`: a `clap` parser; `--help` prints the
/// usage and exits 0, before MPI starts), initializes MPI, runs `run`; an
/// error is printed as `NAME: rank R: ERROR` and makes the exit status 1.
/// MPI is finalized before the process exits.
pub fn main<A>(
    name: &str,
    parse: impl FnOnce() -> Result<A, clap::Error>,
    run: impl FnOnce(&SimpleCommunicator, &A) -> dckpt::Result<()>,
) -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            // --help and --version print and succeed; a bad flag says why (status 2).
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    let Some((universe, _)) = mpi::initialize_with_threading(mpi::Threading::Multiple) else {
        eprintln!("{name}: MPI could not be initialized");
        return ExitCode::FAILURE;
    };
    let world = universe.world();
    let code = match run(&world, &args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: rank {}: {e}", world.rank());
            ExitCode::FAILURE
        }
    };
    drop(universe);
    code
}

/// A size in bytes as users write it (`4M`, `64K`, `1.5G`), for `clap`.
pub fn size(value: &str) -> Result<usize, String> {
    dckpt::sizes::parse_size(value).map(|n| n as usize).map_err(|e| e.to_string())
}

/// The flags every example takes, as `clap` arguments (flattened into each
/// example's own); unset ones take the example's defaults ([`RunArgs::with`]).
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Steps of the simulation.
    #[arg(long)]
    steps: Option<u64>,
    /// Steps between checkpoints.
    #[arg(long)]
    every: Option<u64>,
    /// A configuration file (TOML; without it: local directories under --dir).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Where the default configuration puts its directories.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The last rank aborts at this step (what SIGKILL leaves), a crash on request.
    #[arg(long)]
    crash_at: Option<u64>,
    /// Rank 0 appends the scaling study's CSV line to this file.
    #[arg(long)]
    report: Option<PathBuf>,
}

impl RunArgs {
    /// The flags given, over `defaults`.
    pub fn with(self, defaults: RunFlags) -> RunFlags {
        RunFlags {
            steps: self.steps.unwrap_or(defaults.steps),
            every: self.every.unwrap_or(defaults.every).max(1),
            config: self.config.or(defaults.config),
            dir: self.dir.unwrap_or(defaults.dir),
            crash_at: self.crash_at.or(defaults.crash_at),
            report: self.report.or(defaults.report),
        }
    }
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

    /// Whether this rank dies at `step` (the last rank, at `--crash-at`);
    /// if so it says so first, so that the abort's backtrace that follows
    /// reads as the crash that was asked for.
    pub fn crashes_at(&self, world: &SimpleCommunicator, step: u64) -> bool {
        let dies = self.crash_at == Some(step) && world.rank() == world.size() - 1;
        if dies {
            let program = std::env::args().next().unwrap_or_default();
            let program = std::path::Path::new(&program).file_name().map_or("example".into(), |n| n.to_string_lossy());
            eprintln!(
                "{program}: rank {}: aborting at step {step} as --crash-at asked (a crash on request; mpirun ends the other ranks)",
                world.rank()
            );
        }
        dies
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
