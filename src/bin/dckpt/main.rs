//! `dckpt`: checkpoint, restore, verify, inspect, benchmark and generate.
//! A thin layer over the library: argument parsing, progress, printing.

mod agent_cmd;
mod bench;
mod bench_cmd;
#[cfg(feature = "mpi")]
mod collective_cmd;
mod compress_cmd;
mod progress;
mod report;
mod rtm_cmd;
mod run_cmd;
#[cfg(feature = "mpi")]
mod runtime_cmd;
mod store_cmds;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "dckpt", version, about = "Frequent, small, de-duplicated checkpoints")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Checkpoint FILE as version V of rank R in directory D.
    Checkpoint(store_cmds::CheckpointArgs),
    /// Restore version V of rank R into OUT.
    Restore(store_cmds::RestoreArgs),
    /// Check every file and every chain under D.
    Verify {
        /// Store directory.
        #[arg(long)]
        dir: PathBuf,
        /// Print the report as JSON (with a schema version).
        #[arg(long)]
        json: bool,
    },
    /// Remove what no committed version needs (temporary files, unfinished
    /// versions, old record segments), rebuild a missing manifest, and
    /// delist versions that no longer restore (their files kept as *.damaged).
    Repair {
        /// Store directory.
        #[arg(long)]
        dir: PathBuf,
        /// Only report what would be done.
        #[arg(long)]
        dry_run: bool,
        /// The ranks the commit records name but whose directories are
        /// missing are lost for good: delist the versions that need them
        /// (without it, such a directory, most likely one node's of a store
        /// spread over nodes, is refused unchanged).
        #[arg(long)]
        ranks_lost: bool,
        /// Print the report as JSON (with a schema version).
        #[arg(long)]
        json: bool,
    },
    /// Delete every version that the last N versions of each rank do not
    /// need (their chains, the files they read, the owners they reference).
    Prune {
        /// Store directory.
        #[arg(long)]
        dir: PathBuf,
        /// Versions to keep per rank (the newest).
        #[arg(long)]
        keep: u64,
        /// Only report what would be deleted.
        #[arg(long)]
        dry_run: bool,
        /// Print the report as JSON (with a schema version).
        #[arg(long)]
        json: bool,
    },
    /// Per-version statistics of every rank under D.
    Inspect {
        /// Store directory.
        #[arg(long)]
        dir: PathBuf,
        /// Print JSON (with a schema version) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Benchmark methods over successive versions of one rank, in memory.
    Bench(bench_cmd::BenchArgs),
    /// Write a reproducible sequence of evolving buffers.
    Gen(bench_cmd::GenArgs),
    /// Bytes stored by de-duplication, compression alone and both, on the
    /// same versions of a simulation or of synthetic edits.
    BenchCompression(compress_cmd::CompressionArgs),
    /// An adjoint (RTM-like) run: checkpoint and restore throughput of the
    /// synchronous store and the tiers (eviction policies x restore hints).
    BenchRtm(rtm_cmd::RtmArgs),
    /// Print the effective configuration: FILE (TOML, VeloC-like keys) with
    /// the DCKPT_<KEY> environment overrides; an unknown key or a bad value
    /// is refused, naming the key and where it came from.
    Config {
        /// The configuration file (without it: the defaults and the environment).
        #[arg(long)]
        check: Option<PathBuf>,
        /// Print the configuration and each value's origin as JSON (with a
        /// schema version) instead of TOML.
        #[arg(long)]
        json: bool,
    },
    /// Measure the collective step under mpirun (rank 0 prints JSON).
    #[cfg(feature = "mpi")]
    BenchCollective(collective_cmd::BenchCollectiveArgs),
    /// What an application waits for through the Runtime under mpirun:
    /// every call, the first, the drain, latest + restart, bytes on every
    /// tier, beside the naive alternative and TieredEngine (rank 0 prints).
    #[cfg(feature = "mpi")]
    BenchRuntime(runtime_cmd::BenchRuntimeArgs),
    /// The GPU kernels built into this binary and the node's kernel cache;
    /// --emit DIR compiles them ahead of time.
    #[cfg(feature = "mpi")]
    Kernels(runtime_cmd::KernelsArgs),
    /// Runs a job's command (`-- mpirun … ./sim`) and runs it again after a
    /// failure, up to --retries times: the application restarts from its
    /// newest checkpoint each time. Signals are passed on; a command stopped
    /// by one is not run again.
    Run(run_cmd::RunArgs),
    /// The per-node agent: finishes the flushes of ranks killed after a
    /// checkpoint call returned (started by the runtime where none runs);
    /// --status, --wait.
    Agent(agent_cmd::AgentArgs),
}

/// Exits quietly where stdout was closed by its reader (`dckpt inspect |
/// head`), as a command killed by SIGPIPE would (status 141), instead of
/// panicking on the failed print; every other panic is reported as before.
fn quiet_on_closed_stdout() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // The payload of a failed `print!` is a formatted `String`.
        let message = info.payload().downcast_ref::<String>().map(String::as_str);
        let closed = message.is_some_and(|m| m.starts_with("failed printing to stdout") && m.contains("Broken pipe"));
        if closed {
            std::process::exit(141);
        }
        report(info);
    }));
}

/// `dckpt checkpoint`: one rank's store, or with `--collective` every
/// rank's under `mpirun`.
fn checkpoint(a: store_cmds::CheckpointArgs) -> dckpt::Result<ExitCode> {
    let config = a.config()?;
    if a.collective {
        #[cfg(feature = "mpi")]
        return collective_cmd::checkpoint(a, &config);
        #[cfg(not(feature = "mpi"))]
        return Err(dckpt::Error::InvalidOption("--collective needs dckpt built with the `mpi` feature".into()));
    }
    store_cmds::checkpoint(a, &config)
}

fn main() -> ExitCode {
    quiet_on_closed_stdout();
    dckpt::log::init(None);
    let cli = Cli::parse();
    // Every command refuses a misspelled DCKPT_* variable, and crash points
    // this build lacks, not only those that read a configuration.
    let names = std::env::vars_os().filter_map(|(k, _)| k.into_string().ok());
    if let Err(e) = dckpt::config::check_variable_names(names) {
        eprintln!("dckpt: error: {e} [E{:03}]", e.code());
        return ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Checkpoint(a) => checkpoint(a),
        Command::Restore(a) => {
            let dir = a.dir.clone();
            store_cmds::hinted(&dir, store_cmds::restore(a))
        }
        Command::Verify { dir, json } => store_cmds::hinted(&dir, store_cmds::verify(&dir, json)),
        Command::Repair { dir, dry_run, ranks_lost, json } => store_cmds::hinted(
            &dir,
            store_cmds::repair(&dir, &dckpt::repair::RepairOptions { dry_run, ranks_lost }, json),
        ),
        Command::Prune { dir, keep, dry_run, json } => {
            store_cmds::hinted(&dir, store_cmds::prune(&dir, keep, dry_run, json))
        }
        Command::Inspect { dir, json } => store_cmds::hinted(&dir, store_cmds::inspect(&dir, json)),
        Command::Bench(a) => bench_cmd::bench(a),
        Command::Gen(a) => bench_cmd::generate(a),
        Command::BenchCompression(a) => compress_cmd::run(a),
        Command::BenchRtm(a) => rtm_cmd::run(a),
        Command::Config { check, json } => dckpt::config::Config::load(check.as_deref()).and_then(|c| {
            let sources = dckpt::config::Config::sources(check.as_deref(), |v| std::env::var(v).ok())?;
            if json {
                let origins: serde_json::Map<String, serde_json::Value> =
                    sources.into_iter().map(|(key, from)| (key.to_string(), from.to_string().into())).collect();
                let report = serde_json::json!({ "config": c, "origins": origins });
                crate::report::print_json("config", &report)?;
                return Ok(ExitCode::SUCCESS);
            }
            print!("{}", c.to_toml()?);
            // Where each value came from, as TOML comments.
            println!("\n# where each value comes from:");
            for (key, from) in sources {
                println!("#   {key:20} {from}");
            }
            Ok(ExitCode::SUCCESS)
        }),
        #[cfg(feature = "mpi")]
        Command::BenchCollective(a) => collective_cmd::bench(a),
        #[cfg(feature = "mpi")]
        Command::BenchRuntime(a) => runtime_cmd::bench(a),
        #[cfg(feature = "mpi")]
        Command::Kernels(a) => runtime_cmd::kernels(a),
        Command::Run(a) => run_cmd::run(a),
        Command::Agent(a) => agent_cmd::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("dckpt: error: {e} [E{:03}]", e.code());
            ExitCode::FAILURE
        }
    }
}
