//! The layers a [`Config`] is built from, each over the one before: the
//! defaults or a program's own settings ([`ConfigBuilder::base`]), a TOML
//! file, the environment's `DCKPT_<KEY>`, then values set by key (a command
//! line's flags). Every layer goes through the same keys and the same
//! parser; an error names the key and the layer that set it.

use super::{Config, KEYS};
use crate::error::{Error, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// One value over the layers below it: a key, its text, where it came from.
#[derive(Clone, Debug)]
struct Override {
    key: String,
    raw: String,
    origin: String,
}

/// Builds a [`Config`] from layers ([`Config::builder`]).
///
/// ```
/// let c = dckpt::config::Config::builder()
///     .set("persistent", "/gpfs/run/ckpt", "the program")
///     .set("chunk_size", 256, "the program")
///     .build()?;
/// assert_eq!(c.store_options().chunk_size, 256);
/// # Ok::<(), dckpt::Error>(())
/// ```
#[derive(Debug, Default)]
pub struct ConfigBuilder {
    base: Option<Config>,
    file: Option<PathBuf>,
    overrides: Vec<Override>,
    /// The first problem met while adding a layer (reported by `build`).
    error: Option<Error>,
}

impl ConfigBuilder {
    /// Starts from `config` (a program's own settings) instead of the defaults.
    pub fn base(mut self, config: &Config) -> Self {
        self.base = Some(config.clone());
        self
    }

    /// The keys of a TOML file over the base (none: no file).
    pub fn file(mut self, path: Option<&Path>) -> Self {
        self.file = path.map(Path::to_path_buf);
        self
    }

    /// The process's `DCKPT_<KEY>` variables over what comes before; a
    /// variable named like a setting that is none is an error
    /// ([`check_variable_names`]).
    pub fn environment(mut self) -> Self {
        if let Err(e) = check_variable_names(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok())) {
            self.error.get_or_insert(e);
        }
        if let Some(Err(e)) = std::env::var(crate::log::ENV).ok().map(|v| crate::log::check_filter(&v)) {
            self.error.get_or_insert(e);
        }
        self.environment_from(|name| std::env::var(name).ok())
    }

    /// As [`ConfigBuilder::environment`], reading variables through `env` (tests).
    pub fn environment_from(mut self, env: impl Fn(&str) -> Option<String>) -> Self {
        for key in KEYS {
            let var = format!("DCKPT_{}", key.to_uppercase());
            if let Some(raw) = env(&var) {
                self.overrides.push(Override {
                    key: key.to_string(),
                    raw,
                    origin: format!("environment variable {var}"),
                });
            }
        }
        self
    }

    /// `key` set to `value` (written as in the file or a variable: `128`,
    /// `4G`, `zstd:3`, a path) over what comes before; `origin` names it in
    /// an error (`--chunk-size`, "the program").
    pub fn set(mut self, key: &str, value: impl std::fmt::Display, origin: &str) -> Self {
        if !KEYS.contains(&key) {
            let hint = closest_key(key).map(|k| format!(" (did you mean `{k}`?)")).unwrap_or_default();
            self.error.get_or_insert_with(|| invalid(origin, &format!("{key} is not a configuration key{hint}")));
        }
        self.overrides.push(Override { key: key.to_string(), raw: value.to_string(), origin: origin.to_string() });
        self
    }

    /// Checks one setting alone, as [`ConfigBuilder::set`] and `build` would:
    /// a known key (else the closest is named) and a value it takes.
    /// `origin` names it in the error (C's `dckpt_config` checks each call
    /// so).
    pub fn check_setting(key: &str, value: impl std::fmt::Display, origin: &str) -> Result<()> {
        if !KEYS.contains(&key) {
            let hint = closest_key(key).map(|k| format!(" (did you mean `{k}`?)")).unwrap_or_default();
            return Err(invalid(origin, &format!("{key} is not a configuration key{hint}")));
        }
        let mut alone = toml::Table::new();
        alone.insert(key.to_string(), override_value(&value.to_string()));
        Config::deserialize(alone).map(|_| ()).map_err(|e| invalid(origin, &e.to_string()))
    }

    /// The configuration, checked: each override alone (its error names
    /// it), then the whole (an error names the last layer that set the key
    /// at fault).
    pub fn build(self) -> Result<Config> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let (mut table, origin) = match (&self.file, &self.base) {
            (Some(path), _) => (read_table(path)?, path.display().to_string()),
            (None, Some(base)) => (
                toml::Table::try_from(base).map_err(|e| Error::Internal(format!("configuration: {e}")))?,
                "the program's settings".to_string(),
            ),
            (None, None) => (toml::Table::new(), "the defaults".to_string()),
        };
        for o in &self.overrides {
            let value = override_value(&o.raw);
            let mut alone = toml::Table::new();
            alone.insert(o.key.clone(), value.clone());
            Config::deserialize(alone).map_err(|e| invalid(&o.origin, &e.to_string()))?;
            table.insert(o.key.clone(), value);
        }
        let config = Config::deserialize(table).map_err(|e| invalid(&origin, &e.to_string()))?;
        config.check().map_err(|(key, message)| {
            let by = self.overrides.iter().rev().find(|o| o.key == key).map_or(origin.as_str(), |o| o.origin.as_str());
            invalid(by, &message)
        })?;
        Ok(config)
    }
}

/// An override's value: TOML if it parses as a value (`128`, `"a b"`),
/// else the text itself (`/scratch/ckpt`, `zstd:3`).
fn override_value(raw: &str) -> toml::Value {
    format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()))
}

/// The key of [`KEYS`] closest to `name` (Levenshtein distance, `strsim`).
fn closest_key(name: &str) -> Option<&'static str> {
    KEYS.iter().copied().min_by_key(|k| strsim::levenshtein(name, k))
}

/// The TOML table in `path`; a syntax error is one line naming the file,
/// the line and the column.
pub(super) fn read_table(path: &Path) -> Result<toml::Table> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let table = parse_table(path, &text)?;
    // A key that is no setting: its line, and the closest setting.
    if let Some(key) = table.keys().find(|k| !KEYS.contains(&k.as_str())) {
        let line = text
            .lines()
            .position(|l| l.trim_start().strip_prefix(key.as_str()).is_some_and(|r| r.trim_start().starts_with('=')))
            .map(|i| format!(" at line {}", i + 1))
            .unwrap_or_default();
        let hint = closest_key(key).map(|k| format!(" (did you mean `{k}`?)")).unwrap_or_default();
        return Err(invalid(&path.display().to_string(), &format!("unknown key `{key}`{line}{hint}")));
    }
    Ok(table)
}

/// `text` (the file `path`) as a TOML table; a syntax error is one line
/// naming the file, the line and the column.
fn parse_table(path: &Path, text: &str) -> Result<toml::Table> {
    text.parse::<toml::Table>().map_err(|e| {
        let at = e.span().map(|s| {
            let before = &text[..s.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!(" at line {line}, column {col}")
        });
        invalid(&path.display().to_string(), &format!("{}{}", e.message(), at.unwrap_or_default()))
    })
}

fn invalid(origin: &str, message: &str) -> Error {
    let message = message.split_whitespace().collect::<Vec<_>>().join(" ");
    Error::InvalidOption(format!("configuration ({origin}): {message}"))
}

/// The DCKPT_* environment variables that are not settings: dckpt's own
/// switches (the log level, profiles, the kernel cache, the C examples' configuration
/// file) and those of its tests, scripts and fault injection.
pub const OTHER_VARIABLES: &[&str] = &[
    "LOG",
    "PROFILE",
    "GPU_PROFILE",
    "KERNEL_CACHE",
    "CONFIG",
    "CRASH_AT",
    "DELAY_AT",
    "MPI_TEST_BACKEND",
    "MPI_TEST_DIR",
    "BLESS",
    "TIERS_CHILD",
    "E2E_DIR",
    "BIN",
    "DEMO_RANKS",
    "DEMO_DIR",
    "APT_PACKAGES",
    "BENCH_DATA",
];

/// Refuses an environment variable named like a dckpt setting that is
/// none (`DCKPT_CHUNKSIZE`, `dckpt_chunk_size`), naming the closest one:
/// a misspelled override would otherwise be silently ignored.
pub fn check_variable_names(names: impl IntoIterator<Item = String>) -> Result<()> {
    for name in names {
        let upper = name.to_ascii_uppercase();
        let Some(rest) = upper.strip_prefix("DCKPT_") else { continue };
        let setting = KEYS.iter().any(|k| k.to_uppercase() == rest);
        if matches!(rest, "CRASH_AT" | "DELAY_AT") && !crate::failpoint::ENABLED {
            return Err(Error::InvalidOption(format!(
                "environment variable {name}: this build of dckpt has no crash points \
                 (build it with `--features failpoints`, as its tests do), or unset it"
            )));
        }
        if (setting || OTHER_VARIABLES.contains(&rest)) && name == upper {
            continue;
        }
        if setting || OTHER_VARIABLES.contains(&rest) {
            return Err(Error::InvalidOption(format!(
                "environment variable {name}: dckpt reads {upper} (upper case); rename it"
            )));
        }
        let closest = closest_key(&rest.to_ascii_lowercase()).map(str::to_uppercase);
        return Err(Error::InvalidOption(format!(
            "environment variable {name} is not a dckpt setting{}",
            closest.map(|k| format!(" (did you mean DCKPT_{k}?)")).unwrap_or_default()
        )));
    }
    Ok(())
}
