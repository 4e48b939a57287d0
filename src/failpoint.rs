//! Crash points for the kill-at-every-step tests: `DCKPT_CRASH_AT=NAME:N`
//! makes the process abort (no unwinding, no clean-up: what SIGKILL leaves)
//! the N-th time it reaches the point called NAME. Unset, a point costs one
//! load of a cached value. The points are listed in [`POINTS`].

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

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

static ARMED: OnceLock<Option<(String, u64)>> = OnceLock::new();
static HITS: AtomicU64 = AtomicU64::new(0);

/// Aborts the process if `name` is the armed point and this is its N-th hit.
pub fn hit(name: &str) {
    let armed = ARMED.get_or_init(|| {
        let v = std::env::var("DCKPT_CRASH_AT").ok()?;
        let (n, k) = v.rsplit_once(':').map_or((v.as_str(), 1), |(n, k)| (n, k.parse().unwrap_or(1)));
        Some((n.to_string(), k))
    });
    if let Some((point, nth)) = armed
        && point == name
        && HITS.fetch_add(1, Ordering::SeqCst) + 1 == *nth
    {
        std::process::abort();
    }
}
