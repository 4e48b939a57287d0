//! When a batch job should stop, as this process sees it: a termination
//! signal arrived (SIGTERM, SIGUSR1 or SIGINT: what SLURM's `--signal`,
//! PBS's `kill_delay` and Ctrl-C send), or the scheduler says how much of
//! the walltime is left. No MPI here: [`crate::runtime::Runtime::should_exit`]
//! agrees on the answer across ranks.
//!
//! The signals are watched from the first [`watch_signals`] on (the runtime
//! starts it at the first `should_exit`, so an application that never asks
//! keeps the default behaviour). The first signal of a kind sets a flag; a
//! second of the same kind ends the process as it would have without dckpt,
//! so a job that stopped asking can still be stopped.
//!
//! The walltime left is read the way each scheduler documents it: SLURM's
//! `squeue -h -j $SLURM_JOB_ID -o %L` (time left, `[days-]hours:minutes:seconds`),
//! PBS's `qstat -f $PBS_JOBID` (`Walltime.Remaining`, or
//! `Resource_List.walltime` less `resources_used.walltime`).

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The signals watched, in the order [`signalled`] reports them.
pub const SIGNALS: [i32; 3] = [libc::SIGTERM, libc::SIGUSR1, libc::SIGINT];

/// One flag per watched signal, set from its handler.
static FLAGS: OnceLock<std::result::Result<Vec<Arc<AtomicBool>>, String>> = OnceLock::new();

/// Starts watching [`SIGNALS`] (once per process; later calls return what
/// the first did). Handlers installed before are kept and still run.
pub fn watch_signals() -> Result<()> {
    let flags = FLAGS.get_or_init(|| {
        SIGNALS
            .iter()
            .map(|&sig| {
                let flag = Arc::new(AtomicBool::new(false));
                // The second of a kind ends the process (registered first:
                // it sees the flag the first one set).
                signal_hook::flag::register_conditional_default(sig, Arc::clone(&flag))
                    .and_then(|_| signal_hook::flag::register(sig, Arc::clone(&flag)))
                    .map(|_| flag)
                    .map_err(|e| format!("watching signal {}: {e}", signal_name(sig)))
            })
            .collect()
    });
    match flags {
        Ok(_) => Ok(()),
        Err(e) => Err(Error::InvalidOption(e.clone())),
    }
}

/// The first watched signal that arrived since [`watch_signals`], if any.
pub fn signalled() -> Option<i32> {
    let flags = FLAGS.get()?.as_ref().ok()?;
    SIGNALS.iter().zip(flags).find(|(_, f)| f.load(Ordering::SeqCst)).map(|(&sig, _)| sig)
}

/// A signal's name (`SIGTERM`), or its number.
pub fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGUSR1 => "SIGUSR1".into(),
        libc::SIGINT => "SIGINT".into(),
        other => format!("signal {other}"),
    }
}

/// The scheduler that runs this job, from its environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scheduler {
    /// SLURM, with the job's id (`SLURM_JOB_ID`).
    Slurm(String),
    /// PBS Pro or Torque, with the job's id (`PBS_JOBID`).
    Pbs(String),
}

impl Scheduler {
    /// The scheduler named by `var` (an environment lookup), if any.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let id = |k: &str| var(k).filter(|v| !v.trim().is_empty());
        id("SLURM_JOB_ID").map(Scheduler::Slurm).or_else(|| id("PBS_JOBID").map(Scheduler::Pbs))
    }

    /// The walltime this job has left, asked of the scheduler's command
    /// (`squeue` or `qstat`, found on `PATH`). `None` where the command
    /// cannot run or fails, or the job has no limit.
    pub fn time_left(&self) -> Option<Duration> {
        type Parse = fn(&str) -> Option<Duration>;
        let (program, args, parse): (&str, Vec<&str>, Parse) = match self {
            Scheduler::Slurm(id) => ("squeue", vec!["-h", "-j", id, "-o", "%L"], parse_slurm_time_left),
            Scheduler::Pbs(id) => ("qstat", vec!["-f", id], parse_pbs_time_left),
        };
        let out = std::process::Command::new(program).args(&args).stdin(std::process::Stdio::null()).output();
        match out {
            Ok(out) if out.status.success() => parse(&String::from_utf8_lossy(&out.stdout)),
            Ok(out) => {
                tracing::debug!("`{program}` exited with {}: no walltime known", out.status);
                None
            }
            Err(e) => {
                tracing::debug!("`{program}` could not run: {e}; no walltime known");
                None
            }
        }
    }
}

/// `[days-]hours:minutes:seconds`, `minutes:seconds` or `seconds` as
/// SLURM's `squeue -o %L` prints the time left; `None` for `UNLIMITED`,
/// `NOT_SET`, `INVALID` or anything else.
pub fn parse_slurm_time_left(text: &str) -> Option<Duration> {
    let text = text.trim();
    let (days, clock) = match text.split_once('-') {
        Some((d, rest)) => (d.parse::<u64>().ok()?, rest),
        None => (0, text),
    };
    let parts: Vec<u64> = clock.split(':').map(|p| p.parse::<u64>().ok()).collect::<Option<_>>()?;
    let seconds = match parts.as_slice() {
        [s] => *s,
        [m, s] => m * 60 + s,
        [h, m, s] => h * 3600 + m * 60 + s,
        _ => return None,
    };
    Some(Duration::from_secs(days * 86_400 + seconds))
}

/// The time left in `qstat -f` output: Torque's `Walltime.Remaining = N`
/// (seconds), else `Resource_List.walltime` less `resources_used.walltime`
/// (both `hours:minutes:seconds`, as PBS Pro prints them).
pub fn parse_pbs_time_left(text: &str) -> Option<Duration> {
    let value = |key: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
    };
    if let Some(seconds) = value("Walltime.Remaining").and_then(|v| v.parse::<u64>().ok()) {
        return Some(Duration::from_secs(seconds));
    }
    let limit = parse_slurm_time_left(&value("Resource_List.walltime")?)?;
    let used = value("resources_used.walltime").and_then(|v| parse_slurm_time_left(&v)).unwrap_or_default();
    Some(limit.saturating_sub(used))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_time_left_reads_every_form_squeue_prints() {
        assert_eq!(parse_slurm_time_left("1-02:03:04\n"), Some(Duration::from_secs(86_400 + 7384)));
        assert_eq!(parse_slurm_time_left("02:03:04"), Some(Duration::from_secs(7384)));
        assert_eq!(parse_slurm_time_left("3:04"), Some(Duration::from_secs(184)));
        assert_eq!(parse_slurm_time_left("59"), Some(Duration::from_secs(59)));
        for none in ["UNLIMITED", "NOT_SET", "INVALID", "", "1:2:3:4", "x-01:00:00"] {
            assert_eq!(parse_slurm_time_left(none), None, "{none:?}");
        }
    }

    #[test]
    fn pbs_time_left_reads_torque_and_pbs_pro() {
        let torque = "Job Id: 12.server\n    Walltime.Remaining = 1795\n    Resource_List.walltime = 00:30:00\n";
        assert_eq!(parse_pbs_time_left(torque), Some(Duration::from_secs(1795)));
        let pro = "Job Id: 12.pbs\n    resources_used.walltime = 00:10:30\n    Resource_List.walltime = 01:00:00\n";
        assert_eq!(parse_pbs_time_left(pro), Some(Duration::from_secs(2970)));
        assert_eq!(parse_pbs_time_left("Job Id: 12.pbs\n    job_state = R\n"), None);
    }

    #[test]
    fn the_scheduler_comes_from_its_job_id() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert_eq!(Scheduler::from_env(env(&[("SLURM_JOB_ID", "77")])), Some(Scheduler::Slurm("77".into())));
        assert_eq!(Scheduler::from_env(env(&[("PBS_JOBID", "9.srv")])), Some(Scheduler::Pbs("9.srv".into())));
        assert_eq!(Scheduler::from_env(env(&[("SLURM_JOB_ID", " ")])), None);
        assert_eq!(Scheduler::from_env(env(&[])), None);
    }
}
