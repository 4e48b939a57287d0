//! Logs. The library reports what a user should know (a warning, a
//! fallback taken) through `tracing`; [`init`] installs the subscriber that
//! writes it to standard error, one line an event, `dckpt: rank R:
//! warning: …`, at the level `DCKPT_LOG` sets (the `tracing` filter syntax:
//! `warn`, the default; `info`; `dckpt=debug`; `off`), and the lines of
//! `DCKPT_PROFILE` and `DCKPT_GPU_PROFILE` where set. The `dckpt` binary
//! and [`crate::runtime`] (so C and Fortran simulations too) call it; a
//! process that installed its own subscriber keeps it.

use std::fmt;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The environment variable holding the filter.
pub const ENV: &str = "DCKPT_LOG";

/// The levels `DCKPT_LOG` may name alone.
const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Checks a `DCKPT_LOG` value: a level alone (`off`, `error`, `warn`,
/// `info`, `debug`, `trace`, any case) or `tracing` directives naming a
/// level for a target (`dckpt=debug`, several separated by commas). A bare
/// word that is no level (`verbose`) would be taken for a target and show
/// nothing more: it is refused, as any setting that is none.
pub fn check_filter(value: &str) -> crate::error::Result<()> {
    let refused = |why: String| {
        crate::error::Error::InvalidOption(format!(
            "environment variable {ENV}={value}: {why} (a level: {}; or target=level, e.g. dckpt=debug)",
            LEVELS.join(", ")
        ))
    };
    for directive in value.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let level = directive.rsplit_once('=').map_or(directive, |(_, level)| level);
        if !LEVELS.contains(&level.to_ascii_lowercase().as_str()) {
            return Err(refused(format!("'{level}' is not a level")));
        }
    }
    EnvFilter::try_new(value).map(|_| ()).map_err(|e| refused(e.to_string()))
}

/// Installs the subscriber (once per process; later calls, or a process
/// with a subscriber of its own, change nothing). `rank` prefixes every
/// line: the one given, else the one the launcher put in the environment
/// (`OMPI_COMM_WORLD_RANK`, `PMIX_RANK`, `PMI_RANK`), else none.
pub fn init(rank: Option<u32>) {
    let rank = rank.or_else(launcher_rank);
    if let Some(r) = rank {
        crate::profile::set_rank(r);
    }
    let mut filter =
        std::env::var(ENV).ok().and_then(|f| EnvFilter::try_new(f).ok()).unwrap_or_else(|| EnvFilter::new("warn"));
    // The profiles' lines, where asked for, whatever the level.
    let gpu_profile = std::env::var_os("DCKPT_GPU_PROFILE").is_some();
    if (crate::profile::enabled() || gpu_profile)
        && let Ok(d) = format!("{}=info", crate::profile::TARGET).parse()
    {
        filter = filter.add_directive(d);
    }
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .event_format(Line { rank })
        .try_init();
}

/// The rank an MPI launcher gave this process, if any.
fn launcher_rank() -> Option<u32> {
    ["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"].iter().find_map(|v| std::env::var(v).ok()?.parse().ok())
}

/// One event a line: `dckpt: [rank R: ]LEVEL: message[, field=value…]`.
struct Line {
    rank: Option<u32>,
}

impl<S, N> FormatEvent<S, N> for Line
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut w: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        if event.metadata().target() == crate::profile::TARGET {
            // A profile's line, as scripts/profile-summary.py reads it.
            ctx.field_format().format_fields(w.by_ref(), event)?;
            return writeln!(w);
        }
        write!(w, "dckpt: ")?;
        if let Some(rank) = self.rank {
            write!(w, "rank {rank}: ")?;
        }
        let level = match *event.metadata().level() {
            Level::ERROR => "error",
            Level::WARN => "warning",
            Level::INFO => "info",
            Level::DEBUG => "debug",
            Level::TRACE => "trace",
        };
        write!(w, "{level}: ")?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_log_filter_is_a_level_or_target_levels() {
        for ok in ["warn", "INFO", "off", "dckpt=debug", "dckpt=debug,mpi=warn", "trace"] {
            assert!(check_filter(ok).is_ok(), "{ok}");
        }
        for bad in ["verbose", "dckpt=loud", "warn,chatty"] {
            let e = check_filter(bad).expect_err(bad).to_string();
            assert!(e.contains("DCKPT_LOG") && e.contains("not a level"), "{bad}: {e}");
        }
    }

    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            crate::sync::lock(&self.0).extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn lines(rank: Option<u32>, filter: &str, events: impl FnOnce()) -> String {
        let buf = Buffer::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || out.clone())
            .with_env_filter(EnvFilter::new(filter))
            .event_format(Line { rank })
            .finish();
        tracing::subscriber::with_default(subscriber, events);
        let bytes = crate::sync::lock(&buf.0).clone();
        String::from_utf8(bytes).unwrap_or_default()
    }

    #[test]
    fn a_line_names_the_rank_and_the_level_and_the_filter_holds() {
        let got = lines(Some(2), "warn", || {
            tracing::warn!("the cache is full");
            tracing::info!("not shown at warn");
            tracing::error!(version = 7, "a version failed");
        });
        assert_eq!(
            got,
            "dckpt: rank 2: warning: the cache is full\ndckpt: rank 2: error: a version failed version=7\n"
        );
        assert_eq!(lines(None, "info", || tracing::info!("shown")), "dckpt: info: shown\n");
        assert_eq!(lines(None, "off", || tracing::error!("hidden")), "");
    }

    #[test]
    fn a_profile_line_is_printed_as_it_is() {
        let target = format!("warn,{}=info", crate::profile::TARGET);
        let got =
            lines(Some(0), &target, || tracing::info!(target: crate::profile::TARGET, "dckpt-profile 1 v2 step 3.00"));
        assert_eq!(got, "dckpt-profile 1 v2 step 3.00\n");
    }
}
