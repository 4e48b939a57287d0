//! Progress on standard error for CLI work that takes more than a moment:
//! a bar where the work has steps, a spinner with the elapsed time where it
//! has none (both hidden when standard error is not a terminal).

use indicatif::{ProgressBar, ProgressFinish, ProgressStyle};
use std::time::Duration;

/// A bar of `len` steps labelled `label`, with the steps a second and the
/// time left.
pub(crate) fn bar(len: usize, label: &str) -> ProgressBar {
    styled(len as u64, label, "{prefix:>10} [{bar:30}] {pos}/{len} {per_sec} {elapsed}, ETA {eta}")
}

/// A bar of `total` bytes labelled `label`: the bytes done, the rate and
/// the time left (advance it with [`ProgressBar::inc`] or `set_position` in bytes).
pub(crate) fn bytes_bar(total: u64, label: &str) -> ProgressBar {
    styled(
        total,
        label,
        "{prefix:>10} [{bar:30}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} {elapsed}, ETA {eta}",
    )
}

fn styled(len: u64, label: &str, template: &str) -> ProgressBar {
    let pb = ProgressBar::new(len).with_finish(ProgressFinish::AndClear);
    if let Ok(style) = ProgressStyle::with_template(template) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_prefix(label.to_string());
    pb
}

/// A spinner saying what runs (`msg`) and for how long; cleared by
/// [`ProgressBar::finish_and_clear`] before the result is printed.
pub(crate) fn spinner(msg: &str) -> ProgressBar {
    // Cleared when dropped too (an error ends the work).
    let pb = ProgressBar::new_spinner().with_finish(ProgressFinish::AndClear);
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} {elapsed}") {
        pb.set_style(style);
    }
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

/// `n` bytes for a person: the exact count, and beside it the size in
/// binary units where that reads easier (`1234567 bytes (1.2 MiB)`).
pub(crate) fn bytes(n: u64) -> String {
    if n < 1024 { format!("{n} bytes") } else { format!("{n} bytes ({})", bytesize::ByteSize(n).display().iec()) }
}

/// A rate for a person: `n` bytes over `seconds`, in binary units a second.
pub(crate) fn rate(n: u64, seconds: f64) -> String {
    if seconds <= 0.0 {
        return "-".into();
    }
    format!("{}/s", bytesize::ByteSize((n as f64 / seconds) as u64).display().iec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_keep_the_exact_count_beside_the_readable_one() {
        assert_eq!(bytes(512), "512 bytes");
        assert_eq!(bytes(1_234_567), "1234567 bytes (1.2 MiB)");
        assert_eq!(bytes(64 << 30), "68719476736 bytes (64.0 GiB)");
        assert_eq!(rate(3 << 30, 2.0), "1.5 GiB/s");
        assert_eq!(rate(1, 0.0), "-");
    }
}
