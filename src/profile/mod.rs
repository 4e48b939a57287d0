//! A diagnostic trace of where a checkpoint's host time goes: with
//! `DCKPT_PROFILE=1` in the environment, [`Span`]s print their wall time to
//! standard error (`dckpt-profile rR vN STEP MS ms`, a count `… VALUE count`;
//! `pPID` in place of `rR` before the rank is known; through `tracing`, target
//! [`TARGET`], which [`crate::log`] prints as it is). Off by default, and then
//! free beyond one cached environment lookup. Meant for profiling runs on a
//! device, next to `DCKPT_GPU_PROFILE` (the kernels' stages).

use std::sync::OnceLock;
use std::time::Instant;

/// The `tracing` target of the profile's lines.
pub const TARGET: &str = "dckpt::profile";

/// Whether `DCKPT_PROFILE` is set (read once per process).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("DCKPT_PROFILE").is_some_and(|v| !v.is_empty() && v != "0"))
}

/// This process's rank, once known ([`set_rank`]; `u32::MAX`: not yet).
static RANK: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(u32::MAX);

/// Names the lines of this process by its rank from now on (`crate::log::init`).
pub fn set_rank(rank: u32) {
    RANK.store(rank, std::sync::atomic::Ordering::Relaxed);
}

/// Who prints: `r<rank>`, or `p<pid>` before the rank is known.
fn who() -> String {
    match RANK.load(std::sync::atomic::Ordering::Relaxed) {
        u32::MAX => format!("p{}", std::process::id()),
        rank => format!("r{rank}"),
    }
}

/// A timed step: prints its wall time when dropped, if profiling is on.
/// While it lives it is also an entered `tracing` span (target [`TARGET`],
/// name `dckpt_step`, fields `step`, `version`, `rank`), so a subscriber of
/// the application's (a flame graph, a Chrome trace) sees the steps nested
/// as they ran; [`crate::log`]'s own output prints only the line.
pub struct Span {
    what: &'static str,
    version: u64,
    start: Option<Instant>,
    _entered: Option<tracing::span::EnteredSpan>,
}

impl Span {
    /// Starts timing step `what` of `version`.
    pub fn new(what: &'static str, version: u64) -> Self {
        if !enabled() {
            return Span { what, version, start: None, _entered: None };
        }
        let rank = RANK.load(std::sync::atomic::Ordering::Relaxed);
        let span = tracing::info_span!(target: TARGET, "dckpt_step", step = what, version, rank);
        Span { what, version, start: Some(Instant::now()), _entered: Some(span.entered()) }
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(t) = self.start {
            let ms = t.elapsed().as_secs_f64() * 1e3;
            tracing::info!(target: TARGET, "dckpt-profile {} v{} {} {ms:.2} ms", who(), self.version, self.what);
        }
    }
}

/// Prints the time `what` of `version` took, measured by the caller, if
/// profiling is on (as a [`Span`] would).
pub fn record(what: &'static str, version: u64, took: std::time::Duration) {
    if enabled() {
        let ms = took.as_secs_f64() * 1e3;
        tracing::info!(target: TARGET, "dckpt-profile {} v{version} {what} {ms:.2} ms", who());
    }
}

/// Prints a count that goes with a step (e.g. the entries a reduction
/// carried), if profiling is on.
pub fn count(what: &'static str, version: u64, value: u64) {
    if enabled() {
        tracing::info!(target: TARGET, "dckpt-profile {} v{version} {what} {value} count", who());
    }
}

pub mod threads;
