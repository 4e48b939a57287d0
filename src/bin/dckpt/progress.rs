//! Progress on standard error for CLI work that takes more than a moment:
//! a bar where the work has steps, a spinner with the elapsed time where it
//! has none (both hidden when standard error is not a terminal).

use indicatif::{ProgressBar, ProgressFinish, ProgressStyle};
use std::time::Duration;

/// A bar of `len` steps labelled `label`.
pub(crate) fn bar(len: usize, label: &str) -> ProgressBar {
    let pb = ProgressBar::new(len as u64);
    if let Ok(style) = ProgressStyle::with_template("{prefix:>10} [{bar:30}] {pos}/{len} {elapsed}") {
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
