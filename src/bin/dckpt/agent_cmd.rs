//! `dckpt agent`: the per-node agent that finishes the flushes of killed
//! ranks (`dckpt::agent`). Without options it runs until its directory has
//! held no journal for `--idle` seconds (`Runtime::init` starts it so, in a
//! process group of its own); `--status` says what runs and what waits;
//! `--wait` waits until the directory holds no journal (every process that
//! wrote one has ended, and the agent has finished what it left) and does
//! none of that work itself: what a job script or a test runs after a job.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// `dckpt agent`'s arguments.
#[derive(clap::Args)]
pub struct AgentArgs {
    /// The agents' directory (default: DCKPT_AGENT_DIR, else /dev/shm/dckpt-<uid>).
    #[arg(long, env = "DCKPT_AGENT_DIR")]
    dir: Option<PathBuf>,
    /// Seconds with no journal before the agent exits.
    #[arg(long, default_value_t = 30.0)]
    idle: f64,
    /// Print whether an agent runs, and each journal: its process, whether
    /// it lives, its rank, the versions not yet on every tier.
    #[arg(long, conflicts_with = "wait")]
    status: bool,
    /// Wait until no journal is left: every process that wrote one has ended
    /// and the agent has finished its flushes (at most --timeout seconds).
    #[arg(long)]
    wait: bool,
    /// --wait's limit in seconds.
    #[arg(long, default_value_t = 300.0)]
    timeout: f64,
    /// --status as JSON.
    #[arg(long, requires = "status")]
    json: bool,
}

fn seconds(what: &str, s: f64) -> dckpt::Result<Duration> {
    Duration::try_from_secs_f64(s).map_err(|e| dckpt::Error::InvalidOption(format!("{what} {s}: {e}")))
}

/// Runs `dckpt agent`.
pub fn run(a: AgentArgs) -> dckpt::Result<ExitCode> {
    let root = a.dir.clone().unwrap_or_else(dckpt::agent::default_root);
    if a.status {
        let st = dckpt::agent::status(&root);
        if a.json {
            let text = serde_json::to_string_pretty(&st).map_err(|e| dckpt::Error::Internal(e.to_string()))?;
            println!("{text}");
        } else {
            match st.agent {
                Some(pid) => println!("agent: pid {pid} on {}", root.display()),
                None => println!("agent: none runs on {}", root.display()),
            }
            for j in &st.journals {
                let owner = j.owner.map_or_else(|| "?".into(), |p| p.to_string());
                let rank = j.rank.map_or_else(|| "?".into(), |r| r.to_string());
                let state = if j.alive { "alive" } else { "dead: to finish" };
                println!(
                    "  {}: pid {owner} ({state}), rank {rank}, versions in flight {:?}",
                    j.dir.display(),
                    j.pending
                );
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    if a.wait {
        let limit = seconds("--timeout", a.timeout)?;
        let t = Instant::now();
        loop {
            let st = dckpt::agent::status(&root);
            if st.journals.is_empty() {
                return Ok(ExitCode::SUCCESS);
            }
            if t.elapsed() > limit {
                let alive = st.journals.iter().filter(|j| j.alive).count();
                eprintln!(
                    "dckpt agent: {} journal(s) still in {} after {:.0} s ({alive} of live processes)",
                    st.journals.len(),
                    root.display(),
                    a.timeout
                );
                return Ok(ExitCode::FAILURE);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let idle = seconds("--idle", a.idle)?;
    let t = Instant::now();
    let mut report = |dir: &std::path::Path, outcome: &dckpt::Result<dckpt::agent::Finished>| {
        let at = t.elapsed().as_secs_f64();
        match outcome {
            Ok(f) => {
                for (v, tier) in &f.written {
                    eprintln!("dckpt agent: +{at:.3}s: rank {}: version {v} durable on the {tier} tier", f.rank);
                }
                for (v, tier, why) in &f.failed {
                    eprintln!("dckpt agent: +{at:.3}s: rank {}: version {v} failed on the {tier} tier: {why}", f.rank);
                }
            }
            Err(e) => eprintln!("dckpt agent: +{at:.3}s: {}: {e}", dir.display()),
        }
    };
    match dckpt::agent::run(&root, idle, Duration::from_millis(50), &mut report)? {
        dckpt::agent::Ran::AlreadyRunning(pid) => {
            let pid = pid.map_or_else(|| "?".into(), |p| p.to_string());
            eprintln!("dckpt agent: another agent (pid {pid}) runs on {}", root.display());
        }
        dckpt::agent::Ran::Idle => {}
    }
    Ok(ExitCode::SUCCESS)
}
