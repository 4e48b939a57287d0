//! `dckpt run [--retries N] [--delay S] -- COMMAND…`: runs a job's command
//! (`mpirun … ./sim`) and, when it fails inside the allocation (a non-zero
//! status, or killed), runs it again, up to N times: an application that
//! calls `restart_latest` goes on from its newest checkpoint each time. It
//! says what it did on standard error. SIGTERM, SIGUSR1 and SIGINT (the
//! scheduler stopping the job, Ctrl-C) are passed on to the command, and a
//! command stopped that way is not run again.

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

/// `dckpt run`'s arguments.
#[derive(clap::Args)]
pub struct RunArgs {
    /// Times the command runs again after a failure.
    #[arg(long, default_value_t = 3)]
    retries: u32,
    /// Seconds to wait before each rerun.
    #[arg(long, default_value_t = 0.0)]
    delay: f64,
    /// The command and its arguments, after `--` (e.g. `mpirun -np 4 ./sim`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// How a finished attempt ended, in words, and the status `dckpt run`
/// passes on (a signal's as 128 + its number, as shells report it).
fn ended(status: std::process::ExitStatus) -> (String, u8) {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => (format!("exited with status {code}"), u8::try_from(code).unwrap_or(1)),
        (None, Some(sig)) => (format!("was killed by signal {sig}"), 128u8.saturating_add(sig as u8)),
        (None, None) => ("ended in an unknown way".into(), 1),
    }
}

/// Runs the command, again after each failure while retries are left.
pub fn run(a: RunArgs) -> dckpt::Result<ExitCode> {
    let Some((program, args)) = a.command.split_first() else {
        return Err(dckpt::Error::InvalidOption("dckpt run: no command given (dckpt run -- mpirun …)".into()));
    };
    let delay = Duration::try_from_secs_f64(a.delay)
        .map_err(|e| dckpt::Error::InvalidOption(format!("--delay {}: {e}", a.delay)))?;
    // The command's process, and the signal that asked the job to stop.
    let (child, stopped) = (Arc::new(AtomicI32::new(0)), Arc::new(AtomicI32::new(0)));
    let mut signals = signal_hook::iterator::Signals::new(dckpt::halt::SIGNALS)
        .map_err(|e| dckpt::Error::InvalidOption(format!("dckpt run: watching signals: {e}")))?;
    {
        let (child, stopped) = (Arc::clone(&child), Arc::clone(&stopped));
        std::thread::spawn(move || {
            for sig in signals.forever() {
                stopped.store(sig, Ordering::SeqCst);
                let pid = rustix::process::Pid::from_raw(child.load(Ordering::SeqCst));
                if let (Some(pid), Some(sig)) = (pid, rustix::process::Signal::from_named_raw(sig)) {
                    // Gone already: nothing to pass it on to.
                    let _ = rustix::process::kill_process(pid, sig);
                }
            }
        });
    }
    let attempts = a.retries.saturating_add(1);
    let shown = a.command.iter().map(|s| s.to_string_lossy()).collect::<Vec<_>>().join(" ");
    for attempt in 1..=attempts {
        let sig = stopped.load(Ordering::SeqCst);
        if sig != 0 {
            eprintln!(
                "dckpt run: {} asked the job to stop; the command is not run again",
                dckpt::halt::signal_name(sig)
            );
            return Ok(ExitCode::from(128u8.saturating_add(sig as u8)));
        }
        let mut process = std::process::Command::new(program)
            .args(args)
            .spawn()
            .map_err(|e| dckpt::Error::InvalidOption(format!("dckpt run: cannot start `{shown}`: {e}")))?;
        child.store(i32::try_from(process.id()).unwrap_or(0), Ordering::SeqCst);
        let status = process.wait().map_err(|e| dckpt::Error::Internal(format!("dckpt run: waiting: {e}")))?;
        child.store(0, Ordering::SeqCst);
        if status.success() {
            eprintln!("dckpt run: the command succeeded (attempt {attempt} of at most {attempts})");
            return Ok(ExitCode::SUCCESS);
        }
        let (how, code) = ended(status);
        let sig = stopped.load(Ordering::SeqCst);
        if sig != 0 {
            eprintln!(
                "dckpt run: {} asked the job to stop; the command {how}; it is not run again",
                dckpt::halt::signal_name(sig)
            );
            return Ok(ExitCode::from(code));
        }
        if attempt == attempts {
            eprintln!("dckpt run: the command {how} (attempt {attempt} of {attempts}); no retries left");
            return Ok(ExitCode::from(code));
        }
        eprintln!(
            "dckpt run: the command {how} (attempt {attempt} of {attempts}); running it again{}: it restarts \
             from its newest checkpoint",
            if delay.is_zero() { String::new() } else { format!(" in {:.1} s", delay.as_secs_f64()) }
        );
        std::thread::sleep(delay);
    }
    Ok(ExitCode::FAILURE)
}
