//! Crash points for the kill-at-every-step tests: `DCKPT_CRASH_AT=NAME:N`
//! makes the process abort (no unwinding, no clean-up: what SIGKILL leaves)
//! the N-th time it reaches the point called NAME. Unset, a point costs one
//! load of a cached value. The points are listed in `POINTS`.
//!
//! Tests that need one process to be slow at a point (a rank whose flush
//! lags the others') call `delay`: every later hit of that point sleeps.
//! `DCKPT_DELAY_AT=NAME:MS[,NAME:MS…]` does the same from the environment (a
//! slow disk for a test in another process).
//!
//! All of it exists only with the cargo feature `failpoints`, which the
//! tests, examples and benchmarks turn on (the dev-dependency of the package
//! on itself). Without it — the library `cargo build --release` makes and
//! `scripts/install.sh` installs — a point is an empty inline function, the
//! point names are not in the binary, and a set `DCKPT_CRASH_AT` or
//! `DCKPT_DELAY_AT` is refused when the configuration is read
//! ([`ENABLED`]).

/// Whether this build has the crash points (the cargo feature `failpoints`).
pub const ENABLED: bool = cfg!(feature = "failpoints");

#[cfg(not(feature = "failpoints"))]
mod disabled {
    /// No crash point in this build: does nothing.
    #[inline(always)]
    pub fn hit(_name: &str) {}

    /// No crash point in this build: never a failure.
    #[inline(always)]
    pub fn failed(_name: &str) -> bool {
        false
    }
}
#[cfg(not(feature = "failpoints"))]
pub use disabled::{failed, hit};
#[cfg(feature = "failpoints")]
pub use enabled::*;

#[cfg(feature = "failpoints")]
mod enabled {

    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Mutex, OnceLock};
    use std::time::Duration;

    /// Every crash point, in the order a checkpoint reaches them.
    pub const POINTS: &[&str] = &[
        "checkpoint.deduplicated",
        "checkpoint.cached",
        "store.temp_written",
        "store.renamed",
        "store.file_durable",
        "store.manifest_written",
        "flush.durable",
    ];

    /// The points only a collective checkpoint reaches (several ranks): the
    /// reduction done on the collective step's background thread, the
    /// version not yet settled (`scripts/kill-collective-tiers.sh`).
    pub const COLLECTIVE_POINTS: &[&str] = &["collective.reduced"];

    static ARMED: OnceLock<Option<(String, u64)>> = OnceLock::new();
    static HITS: AtomicU64 = AtomicU64::new(0);
    static DELAYED: AtomicBool = AtomicBool::new(false);
    static DELAYS: Mutex<Vec<(String, Duration)>> = Mutex::new(Vec::new());

    static FAILS: Mutex<Vec<String>> = Mutex::new(Vec::new());

    /// Makes the next [`failed`] check of point `name` in this process report a
    /// failure (once). For tests of error paths that no input can reach, such
    /// as the collective step's background thread failing on one rank.
    pub fn fail_next(name: &str) {
        crate::sync::lock(&FAILS).push(name.to_string());
    }

    /// Whether point `name` was armed by [`fail_next`] (disarming it).
    pub fn failed(name: &str) -> bool {
        let mut f = crate::sync::lock(&FAILS);
        match f.iter().position(|n| n == name) {
            Some(i) => {
                f.remove(i);
                true
            }
            None => false,
        }
    }

    /// Makes every later hit of point `name` in this process sleep for `pause`
    /// (a zero `pause` removes the delay). For tests.
    pub fn delay(name: &str, pause: Duration) {
        let mut d = crate::sync::lock(&DELAYS);
        d.retain(|(n, _)| n != name);
        if !pause.is_zero() {
            d.push((name.to_string(), pause));
        }
        DELAYED.store(!d.is_empty(), Ordering::SeqCst);
    }

    /// Aborts the process if `name` is the armed point and this is its N-th hit.
    pub fn hit(name: &str) {
        let armed = ARMED.get_or_init(|| {
            // `NAME:MS`, or several separated by commas.
            for item in std::env::var("DCKPT_DELAY_AT").unwrap_or_default().split(',') {
                if let Some((point, ms)) = item.trim().rsplit_once(':') {
                    delay(point, Duration::from_millis(ms.parse().unwrap_or(0)));
                }
            }
            let v = std::env::var("DCKPT_CRASH_AT").ok()?;
            let (n, k) = v.rsplit_once(':').map_or((v.as_str(), 1), |(n, k)| (n, k.parse().unwrap_or(1)));
            Some((n.to_string(), k))
        });
        if let Some((point, nth)) = armed
            && point == name
            && HITS.fetch_add(1, Ordering::SeqCst) + 1 == *nth
        {
            tracing::warn!("crash point {name} reached (hit {nth}): aborting, as DCKPT_CRASH_AT asks");
            std::process::abort();
        }
        if DELAYED.load(Ordering::Relaxed) {
            let pause = crate::sync::lock(&DELAYS).iter().find(|(n, _)| n == name).map(|d| d.1);
            if let Some(p) = pause {
                std::thread::sleep(p);
            }
        }
    }
}
