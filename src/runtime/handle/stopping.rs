//! [`Runtime::should_exit`]: whether a batch job should take its last
//! checkpoint and stop, agreed on every rank ([`crate::halt`] says what one
//! process sees).

use super::Runtime;
use crate::error::Result;
use ::mpi::collective::SystemOperation;
use ::mpi::traits::*;
use std::time::{Duration, Instant};

/// How often rank 0 asks the scheduler for the walltime left (between two
/// answers it counts down from the last one).
const ASK_EVERY: Duration = Duration::from_secs(60);

/// Why [`Runtime::should_exit`] said stop.
#[derive(Clone, Debug, PartialEq)]
pub enum HaltReason {
    /// A watched signal reached some rank (the lowest signal number of
    /// those that did, on any rank).
    Signal(i32),
    /// The walltime left is shorter than what the last checkpoint needed to
    /// become durable plus `halt_seconds`.
    Walltime {
        /// Seconds left, as the scheduler said (counted down since).
        left: f64,
        /// Seconds kept in reserve: the last checkpoint's cost (the
        /// slowest rank's) plus `halt_seconds`.
        needed: f64,
    },
}

impl std::fmt::Display for HaltReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HaltReason::Signal(sig) => write!(f, "{} reached a rank", crate::halt::signal_name(*sig)),
            HaltReason::Walltime { left, needed } => write!(
                f,
                "{left:.0} s of walltime left, {needed:.0} s needed for a last checkpoint to become durable \
                 (with halt_seconds)"
            ),
        }
    }
}

/// What [`Runtime::should_exit`] keeps between calls.
#[derive(Debug, Default)]
pub(super) struct HaltState {
    /// Rank 0's last answer from the scheduler (the time left then), and when.
    asked: Option<(Instant, Option<Duration>)>,
    /// The newest checkpoint not seen durable yet: name, version, when its call began.
    pending: Option<(String, u64, Instant)>,
    /// Seconds the newest checkpoint seen durable took, from its call.
    last_cost: Option<f64>,
    /// The longest checkpoint call so far, seconds.
    longest_call: f64,
    /// Why the last `should_exit` said stop.
    reason: Option<HaltReason>,
}

impl HaltState {
    /// A checkpoint call of `name`'s `version` began at `started` and took `seconds`.
    pub(super) fn called(&mut self, name: &str, version: u64, started: Instant, seconds: f64) {
        self.longest_call = self.longest_call.max(seconds);
        self.pending = Some((name.to_string(), version, started));
    }

    /// `name`'s `version` is durable now (a `wait` returned, or the tiers say so).
    pub(super) fn durable(&mut self, name: &str, version: u64) {
        if let Some((n, v, started)) = &self.pending
            && n == name
            && *v <= version
        {
            self.last_cost = Some(started.elapsed().as_secs_f64());
            self.pending = None;
        }
    }

    /// What a last checkpoint is expected to need, seconds: the newest
    /// one's time from its call to durable, else the longest call so far.
    fn cost(&self) -> f64 {
        self.last_cost.unwrap_or(self.longest_call).max(self.longest_call)
    }

    /// Rank 0's view of the walltime left, asking the scheduler at most
    /// every [`ASK_EVERY`].
    fn time_left(&mut self) -> Option<Duration> {
        let fresh = self.asked.is_some_and(|(at, _)| at.elapsed() < ASK_EVERY);
        if !fresh {
            let scheduler = crate::halt::Scheduler::from_env(|k| std::env::var(k).ok());
            self.asked = Some((Instant::now(), scheduler.and_then(|s| s.time_left())));
        }
        let (at, left) = self.asked?;
        left.map(|l| l.saturating_sub(at.elapsed()))
    }
}

impl Runtime {
    /// Whether the job should take a last checkpoint and stop, the same
    /// answer on every rank (collective: every rank calls it, at the same
    /// point; one `MPI_Allreduce`): true once SIGTERM, SIGUSR1 or SIGINT
    /// reached any rank, or once the walltime the scheduler (SLURM, PBS)
    /// says is left is shorter than `halt_seconds` plus what the last
    /// checkpoint took from its call until durable (the slowest rank's).
    ///
    /// The first call starts watching the signals (see [`crate::halt`]):
    /// from then on the first signal of a kind only sets the flag, and a
    /// second ends the process. [`Runtime::halt_reason`] says why.
    pub fn should_exit(&mut self) -> Result<bool> {
        crate::halt::watch_signals()?;
        // A version the tiers made durable since the last look.
        if let Some((name, version, _)) = self.halt.pending.clone()
            && let Some(named) = self.names.get(&name)
            && let Some(last) = named.ckpt.engine().tiers().last()
            && named.ckpt.is_durable(version, last)
        {
            self.halt.durable(&name, version);
        }
        // One reduction (MAX) of: the signal (its complement, so that the
        // lowest number wins), the cost in ms, rank 0's walltime left in ms.
        let signal = crate::halt::signalled().map_or(0, |s| u64::MAX - s as u64);
        let cost_ms = (self.halt.cost() * 1e3).ceil() as u64;
        let left_ms = match self.comm.rank() {
            0 => self.halt.time_left().map_or(u64::MAX, |d| d.as_millis() as u64),
            _ => 0,
        };
        let mine = [signal, cost_ms, left_ms];
        let mut all = [0u64; 3];
        self.comm.all_reduce_into(&mine[..], &mut all[..], SystemOperation::max());
        let [signal, cost_ms, left_ms] = all;
        let needed_ms = cost_ms.saturating_add(self.config.halt_seconds.saturating_mul(1000));
        let reason = if signal != 0 {
            Some(HaltReason::Signal((u64::MAX - signal) as i32))
        } else if left_ms != u64::MAX && left_ms < needed_ms {
            Some(HaltReason::Walltime { left: left_ms as f64 / 1e3, needed: needed_ms as f64 / 1e3 })
        } else {
            None
        };
        if let Some(r) = reason.as_ref().filter(|_| self.halt.reason.is_none() && self.comm.rank() == 0) {
            tracing::info!("the job should stop: {r}");
        }
        self.halt.reason = reason;
        Ok(self.halt.reason.is_some())
    }

    /// Why the last [`Runtime::should_exit`] said stop (`None`: it did not).
    pub fn halt_reason(&self) -> Option<&HaltReason> {
        self.halt.reason.as_ref()
    }
}
