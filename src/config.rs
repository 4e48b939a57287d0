//! The configuration a simulation gives dckpt: a TOML file with VeloC-like
//! keys, each overridable by an environment variable `DCKPT_<KEY>` (the key
//! in upper case), checked once and turned into the options of the layers
//! below ([`StoreOptions`], [`TierOptions`], [`CollectiveOptions`]).
//!
//! ```toml
//! scratch = "/local/ckpt"        # node-local directory (optional)
//! persistent = "/gpfs/run/ckpt"  # directory every rank sees (optional; one of the two at least)
//! mode = "async"                 # or "sync": return once durable on every tier
//! chunk_size = 128
//! hash = "murmur3"               # murmur3 | xxh3 | blake3 | sha1 (not on the GPU)
//! method = "tree"                # tree | list | basic | full
//! max_chain = 8                  # a baseline every 8 versions
//! collective = true              # false: local-only (no reduction across ranks; method full allowed)
//! threshold = 131072             # K of the collective step
//! region_bytes = 0               # largest region offered (0: automatic)
//! min_region_bytes = 0           # smallest region offered (0: all; larger: a shorter reduction, more bytes)
//! overlap = "auto"               # the reduction on a background thread (needs MPI_THREAD_MULTIPLE): auto | true | false
//!                                # (auto: in the call for a CPU-backend rank with fewer than two CPUs)
//! host_cache_size = "4G"         # bytes, or a size with K, M, G, T
//! prefetch_cache_size = "2G"     # the restore cache (0: none)
//! eviction = "gap-aware"         # fifo | lru | gap-aware
//! max_versions = 4               # kept per tier (absent: all)
//! compression = "zstd:1"         # none | lz4 | zstd | zstd:N
//! backend = "auto"               # auto | cpu | cuda
//! gpu_memory = "1.5x"            # CUDA: device memory per rank (a multiple of the buffer, or a size)
//! gpu_cache_size = "auto"        # CUDA: the GPU cache tier, within gpu_memory (auto: what is spare; 0: none)
//! ```
//!
//! An unknown key, a bad value or a bad override is an error naming the key
//! and where it came from (the file, or the variable).

use crate::backend::BackendKind;
use crate::collective::{CollectiveOptions, Overlap};
use crate::error::{Error, Result};
use crate::format::Compression;
use crate::hash::HashAlgo;
use crate::layout::Layout;
use crate::method::Method;
use crate::sizes::{GpuCache, GpuMemory};
use crate::sizes::{IntOrText, parse_size};
use crate::store::StoreOptions;
use crate::tiers::TierOptions;
use crate::tiers::arena::Policy;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::path::{Path, PathBuf};

/// When a checkpoint call returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Once the diff is in the host cache (the tiers flush it in the background).
    #[default]
    Async,
    /// Once the version is durable on every tier.
    Sync,
}

/// A byte count, written as an integer or as a size (`"4G"`, `"512M"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        match IntOrText::deserialize(d)? {
            IntOrText::Int(n) => Ok(Bytes(n)),
            IntOrText::Text(s) => parse_size(&s).map(Bytes).map_err(serde::de::Error::custom),
        }
    }
}

/// `none` or a compression (`lz4`, `zstd`, `zstd:N`).
mod compression_text {
    use crate::format::Compression;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Compression>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(c) => s.collect_str(c),
            None => s.serialize_str("none"),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Compression>, D::Error> {
        match String::deserialize(d)?.as_str() {
            "none" => Ok(None),
            other => other.parse().map(Some).map_err(serde::de::Error::custom),
        }
    }
}

/// Every setting, with its default (see the module documentation).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// A node-local directory (fast scratch), if any.
    pub scratch: Option<PathBuf>,
    /// A directory every rank sees (a parallel file system), if any.
    pub persistent: Option<PathBuf>,
    /// When a checkpoint call returns.
    pub mode: Mode,
    /// Chunk size in bytes (32 B – 64 KiB).
    pub chunk_size: u32,
    /// Digest algorithm.
    pub hash: HashAlgo,
    /// De-duplication method.
    pub method: Method,
    /// A baseline once a chain holds this many versions.
    pub max_chain: Option<u64>,
    /// Whether the collective step runs (false: local-only, each rank
    /// de-duplicates against its own history; method `full` allowed).
    pub collective: bool,
    /// K of the collective step: the most tuples a partial result keeps.
    pub threshold: usize,
    /// Largest region offered to the collective step (0: automatic).
    pub region_bytes: Bytes,
    /// Smallest region offered to the collective step (0: every region).
    pub min_region_bytes: Bytes,
    /// Whether the collective step's reduction runs on a background thread
    /// (where MPI grants `MPI_THREAD_MULTIPLE`), off the application's path:
    /// `auto` (yes, but in the call for a CPU-backend rank with fewer than
    /// two CPUs: bound to one, or oversubscribed), `true` or `false`.
    pub overlap: Overlap,
    /// Host memory for diffs on their way to the disks, allocated at open.
    pub host_cache_size: Bytes,
    /// Host memory for prefetched restores (0: none).
    pub prefetch_cache_size: Bytes,
    /// What the restore cache evicts first.
    pub eviction: Policy,
    /// Versions kept on each tier (absent: every version).
    pub max_versions: Option<u64>,
    /// Compression on the flush path.
    #[serde(with = "compression_text")]
    pub compression: Option<Compression>,
    /// Where each rank de-duplicates.
    pub backend: BackendKind,
    /// The CUDA backend's device-memory budget per rank.
    pub gpu_memory: GpuMemory,
    /// The GPU cache tier's share of that budget.
    pub gpu_cache_size: GpuCache,
}

impl Default for Config {
    fn default() -> Self {
        let store = StoreOptions::default();
        let collective = CollectiveOptions::default();
        let tiers = TierOptions::default();
        Config {
            scratch: None,
            persistent: None,
            mode: Mode::Async,
            chunk_size: store.chunk_size,
            hash: store.hash,
            method: store.method,
            max_chain: store.max_chain,
            collective: !collective.local_only,
            threshold: collective.threshold,
            region_bytes: Bytes(collective.region_bytes),
            min_region_bytes: Bytes(collective.min_region_bytes),
            overlap: collective.overlap,
            host_cache_size: Bytes(tiers.host_cache_bytes),
            prefetch_cache_size: Bytes(tiers.prefetch_cache_bytes),
            eviction: tiers.eviction,
            max_versions: None,
            compression: None,
            backend: collective.backend,
            gpu_memory: store.gpu_memory,
            gpu_cache_size: tiers.gpu_cache,
        }
    }
}

/// The keys a file may set (and `DCKPT_<KEY>` may override).
pub const KEYS: &[&str] = &[
    "scratch",
    "persistent",
    "mode",
    "chunk_size",
    "hash",
    "method",
    "max_chain",
    "collective",
    "threshold",
    "region_bytes",
    "min_region_bytes",
    "overlap",
    "host_cache_size",
    "prefetch_cache_size",
    "eviction",
    "max_versions",
    "compression",
    "backend",
    "gpu_memory",
    "gpu_cache_size",
];

impl Config {
    /// The configuration in `file` (if any) with the environment's
    /// `DCKPT_<KEY>` overrides, checked.
    pub fn load(file: Option<&Path>) -> Result<Config> {
        check_variable_names(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()))?;
        let config = Self::load_with(file, |name| std::env::var(name).ok())?;
        config.check_machine()?;
        Ok(config)
    }

    /// Where each key's value comes from: `DCKPT_<KEY>`, the file, or the
    /// defaults (what `dckpt config` prints beside the values).
    pub fn sources(file: Option<&Path>, env: impl Fn(&str) -> Option<String>) -> Result<Vec<(&'static str, String)>> {
        let table = match file {
            Some(path) => read_table(path)?,
            None => toml::Table::new(),
        };
        Ok(KEYS
            .iter()
            .map(|&key| {
                let var = format!("DCKPT_{}", key.to_uppercase());
                let from = if env(&var).is_some() {
                    format!("environment variable {var}")
                } else if let (true, Some(f)) = (table.contains_key(key), file) {
                    f.display().to_string()
                } else {
                    "default".to_string()
                };
                (key, from)
            })
            .collect())
    }

    /// Refuses caches this machine cannot hold: the host cache and the
    /// prefetch cache together beyond its memory (the job would be killed
    /// for memory with no message).
    pub fn check_machine(&self) -> Result<()> {
        let Some(total) = machine_memory() else { return Ok(()) };
        let asked = self.host_cache_size.0.saturating_add(self.prefetch_cache_size.0);
        if asked > total {
            return Err(Error::InvalidOption(format!(
                "configuration: host_cache_size + prefetch_cache_size = {asked} bytes, beyond this machine's {total} \
                 bytes of memory (each rank of a node allocates its own)"
            )));
        }
        Ok(())
    }

    /// [`Config::load`] with `env` as the environment (tests).
    pub fn load_with(file: Option<&Path>, env: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let origin = file.map_or_else(|| "the defaults".to_string(), |f| f.display().to_string());
        let table = match file {
            Some(path) => read_table(path)?,
            None => toml::Table::new(),
        };
        Self::from_table(table, &origin, env)
    }

    /// This configuration (a program's own defaults) with the environment's
    /// `DCKPT_<KEY>` overrides, checked.
    pub fn with_env(&self) -> Result<Config> {
        check_variable_names(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()))?;
        let table = toml::Table::try_from(self).map_err(|e| Error::Internal(format!("configuration: {e}")))?;
        Self::from_table(table, "the program's settings", |name| std::env::var(name).ok())
    }

    /// The keys of `table` (from `origin`) with `env`'s overrides, checked.
    fn from_table(mut table: toml::Table, origin: &str, env: impl Fn(&str) -> Option<String>) -> Result<Config> {
        for key in KEYS {
            let var = format!("DCKPT_{}", key.to_uppercase());
            if let Some(raw) = env(&var) {
                table.insert((*key).to_string(), override_value(&raw));
                // Each override is checked alone, so its error names it.
                let mut alone = toml::Table::new();
                alone.insert((*key).to_string(), override_value(&raw));
                Config::deserialize(alone)
                    .map_err(|e| invalid(&format!("environment variable {var}"), &e.to_string()))?;
            }
        }
        let config = Config::deserialize(table).map_err(|e| invalid(origin, &e.to_string()))?;
        // An error names the variable that set the value, else the origin.
        config.check().map_err(|(key, message)| {
            let var = format!("DCKPT_{}", key.to_uppercase());
            match env(&var) {
                Some(_) => invalid(&format!("environment variable {var}"), &message),
                None => invalid(origin, &message),
            }
        })?;
        Ok(config)
    }

    /// The values no type can check: a usable chunk size, a K in range, a
    /// directory at least (named, and two different ones), retention of one
    /// version at least. An error names the key responsible.
    fn check(&self) -> std::result::Result<(), (&'static str, String)> {
        let fail = |key: &'static str, message: String| Err((key, format!("{key}: {message}")));
        if let Err(e) = Layout::new(u64::from(self.chunk_size), self.chunk_size) {
            return fail("chunk_size", e.to_string());
        }
        if !(1..=crate::collective::merge::MAX_THRESHOLD).contains(&self.threshold) {
            let max = crate::collective::merge::MAX_THRESHOLD;
            return fail("threshold", format!("{} is outside 1..={max}", self.threshold));
        }
        if self.collective && !self.method.uses_record() {
            return fail(
                "method",
                format!(
                    "{} keeps no record, and the collective step needs one (tree or list; or collective = false)",
                    self.method
                ),
            );
        }
        if self.scratch.is_none() && self.persistent.is_none() {
            return Err(("persistent", "scratch, persistent: set at least one directory".into()));
        }
        for (key, dir) in [("scratch", &self.scratch), ("persistent", &self.persistent)] {
            if dir.as_ref().is_some_and(|d| d.as_os_str().is_empty()) {
                return fail(key, "an empty directory name (unset it rather than setting it empty)".into());
            }
        }
        if let (Some(a), Some(b)) = (&self.scratch, &self.persistent)
            && same_directory(a, b)
        {
            return fail(
                "scratch",
                format!("{} is also persistent: two tiers need two directories (or set only one)", a.display()),
            );
        }
        if self.max_versions == Some(0) {
            return fail("max_versions", "keep at least one version".into());
        }
        if self.max_chain == Some(0) {
            return fail("max_chain", "a chain holds at least its baseline".into());
        }
        Ok(())
    }

    /// The store's options.
    pub fn store_options(&self) -> StoreOptions {
        StoreOptions {
            chunk_size: self.chunk_size,
            method: self.method,
            hash: self.hash,
            max_chain: self.max_chain,
            gpu_memory: self.gpu_memory,
            ..StoreOptions::default()
        }
    }

    /// The tiers' options, each directory joined with `name` (a checkpoint's name).
    pub fn tier_options(&self, name: &str) -> TierOptions {
        TierOptions {
            local: self.scratch.as_ref().map(|d| d.join(name)),
            shared: self.persistent.as_ref().map(|d| d.join(name)),
            host_cache_bytes: self.host_cache_size.0,
            compression: self.compression,
            keep_local: self.max_versions,
            keep_shared: self.max_versions,
            prefetch_cache_bytes: self.prefetch_cache_size.0,
            eviction: self.eviction,
            gpu_cache: self.gpu_cache_size,
        }
    }

    /// The collective step's options.
    pub fn collective_options(&self) -> CollectiveOptions {
        CollectiveOptions {
            threshold: self.threshold,
            region_bytes: self.region_bytes.0,
            min_region_bytes: self.min_region_bytes.0,
            overlap: self.overlap,
            backend: self.backend,
            local_only: !self.collective,
        }
    }

    /// The configuration as TOML (what `dckpt config --check` prints).
    pub fn to_toml(&self) -> Result<String> {
        toml::to_string(self).map_err(|e| Error::Internal(format!("printing the configuration: {e}")))
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

/// The error of a configuration from `origin`, on one line.
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
];

/// Refuses an environment variable named like a dckpt setting that is
/// none (`DCKPT_CHUNKSIZE`, `dckpt_chunk_size`), naming the closest one:
/// a misspelled override would otherwise be silently ignored.
pub fn check_variable_names(names: impl IntoIterator<Item = String>) -> Result<()> {
    for name in names {
        let upper = name.to_ascii_uppercase();
        let Some(rest) = upper.strip_prefix("DCKPT_") else { continue };
        let setting = KEYS.iter().any(|k| k.to_uppercase() == rest);
        if (setting || OTHER_VARIABLES.contains(&rest)) && name == upper {
            continue;
        }
        if setting || OTHER_VARIABLES.contains(&rest) {
            return Err(Error::InvalidOption(format!(
                "environment variable {name}: dckpt reads {upper} (upper case); rename it"
            )));
        }
        let closest = KEYS.iter().map(|k| k.to_uppercase()).min_by_key(|k| edit_distance(rest, k));
        return Err(Error::InvalidOption(format!(
            "environment variable {name} is not a dckpt setting{}",
            closest.map(|k| format!(" (did you mean DCKPT_{k}?)")).unwrap_or_default()
        )));
    }
    Ok(())
}

/// Levenshtein distance (names of a few dozen letters).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for j in 0..b.len() {
            let here = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != b[j])).min(row[j] + 1).min(here + 1);
            prev = here;
        }
    }
    row[b.len()]
}

/// Whether `a` and `b` name one directory (as written, or once resolved
/// where both exist).
fn same_directory(a: &Path, b: &Path) -> bool {
    let clean = |p: &Path| p.components().collect::<PathBuf>();
    if clean(a) == clean(b) {
        return true;
    }
    matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

/// This machine's memory in bytes (Linux: /proc/meminfo), if known.
fn machine_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The TOML table in `path`; a syntax error is one line naming the file,
/// the line and the column.
fn read_table(path: &Path) -> Result<toml::Table> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str, env: &[(&str, &str)]) -> Result<Config> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let f = dir.path().join("dckpt.toml");
        std::fs::write(&f, text).map_err(|e| Error::io(&f, e))?;
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::load_with(Some(&f), |name| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn every_key_parses_and_maps_to_the_options() {
        let c = load(
            r#"
            scratch = "/local/ckpt"
            persistent = "/gpfs/ckpt"
            mode = "sync"
            chunk_size = 256
            hash = "xxh3"
            method = "list"
            max_chain = 8
            collective = false
            threshold = 1024
            region_bytes = "64K"
            min_region_bytes = "4K"
            overlap = false
            host_cache_size = "2G"
            prefetch_cache_size = 1048576
            eviction = "lru"
            max_versions = 3
            compression = "zstd:3"
            backend = "cpu"
            gpu_memory = "2.25x"
            gpu_cache_size = "512M"
            "#,
            &[],
        )
        .expect("config");
        assert_eq!(c.mode, Mode::Sync);
        let s = c.store_options();
        assert_eq!((s.chunk_size, s.hash, s.method, s.max_chain), (256, HashAlgo::Xxh3, Method::List, Some(8)));
        assert_eq!(s.gpu_memory, GpuMemory::Times(2250));
        let t = c.tier_options("heat");
        assert_eq!(t.local, Some(PathBuf::from("/local/ckpt/heat")));
        assert_eq!(t.shared, Some(PathBuf::from("/gpfs/ckpt/heat")));
        assert_eq!((t.host_cache_bytes, t.prefetch_cache_bytes), (2 << 30, 1 << 20));
        assert_eq!((t.keep_local, t.keep_shared, t.eviction), (Some(3), Some(3), Policy::Lru));
        assert_eq!(t.compression, Some(Compression::Zstd { level: 3 }));
        assert_eq!(t.gpu_cache, GpuCache::Bytes(512 << 20));
        let k = c.collective_options();
        assert_eq!((k.threshold, k.region_bytes, k.backend, k.local_only), (1024, 64 << 10, BackendKind::Cpu, true));
        assert_eq!((k.min_region_bytes, k.overlap), (4 << 10, Overlap::Off));
        // What --check prints reads back to the same configuration.
        let again = load(&c.to_toml().expect("toml"), &[]).expect("reparse");
        assert_eq!(again, c);
    }

    #[test]
    fn the_environment_overrides_the_file() {
        let c = load(
            "persistent = \"/a\"\nchunk_size = 128\n",
            &[("DCKPT_CHUNK_SIZE", "512"), ("DCKPT_PERSISTENT", "/b/c"), ("DCKPT_COMPRESSION", "lz4")],
        )
        .expect("config");
        assert_eq!((c.chunk_size, c.persistent.as_deref()), (512, Some(Path::new("/b/c"))));
        assert_eq!(c.compression, Some(Compression::Lz4));
        // Local-only allows a method without a record.
        let full = load("persistent = \"/a\"\nmethod = \"full\"\n", &[("DCKPT_COLLECTIVE", "false")]).expect("full");
        assert!(full.collective_options().local_only && full.method == Method::Full);
        // overlap: auto by default, booleans as before, and words.
        for (value, want) in
            [("auto", Overlap::Auto), ("false", Overlap::Off), ("true", Overlap::On), ("on", Overlap::On)]
        {
            let c = load("persistent = \"/a\"\n", &[("DCKPT_OVERLAP", value)]).expect(value);
            assert_eq!(c.collective_options().overlap, want, "DCKPT_OVERLAP={value}");
            assert_eq!(load(&c.to_toml().expect("toml"), &[]).expect("reparse").overlap, want);
        }
        assert_eq!(load("persistent = \"/a\"\n", &[]).expect("default").overlap, Overlap::Auto);
    }

    #[test]
    fn bad_keys_and_values_are_refused_with_the_key_and_the_origin() {
        /// A file, its environment, and what the error must name.
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
        let cases: &[Case<'_>] = &[
            ("persistent = \"/a\"\nchunk_sise = 128\n", &[], "chunk_sise"),
            ("persistent = \"/a\"\nchunk_size = 16\n", &[], "chunk_size"),
            ("persistent = \"/a\"\nmethod = \"zip\"\n", &[], "zip"),
            ("persistent = \"/a\"\nhost_cache_size = \"lots\"\n", &[], "host_cache_size"),
            ("persistent = \"/a\"\ncompression = \"gzip\"\n", &[], "compression"),
            ("persistent = \"/a\"\nthreshold = 0\n", &[], "threshold"),
            ("persistent = \"/a\"\nmethod = \"full\"\n", &[], "method"),
            ("chunk_size = 128\n", &[], "persistent"),
            ("persistent = \"/a\"\nmax_versions = 0\n", &[], "max_versions"),
            ("persistent = \"/a\"\n", &[("DCKPT_EVICTION", "random")], "DCKPT_EVICTION"),
            ("persistent = \"/a\"\noverlap = \"sometimes\"\n", &[], "overlap"),
            ("persistent = \"/a\"\ngpu_memory = \"lots\"\n", &[], "gpu_memory"),
            ("persistent = \"/a\"\ngpu_cache_size = \"lots\"\n", &[], "gpu_cache_size"),
            ("persistent = \"/a\"\n", &[("DCKPT_GPU_MEMORY", "-2x")], "DCKPT_GPU_MEMORY"),
            ("persistent = [\n", &[], "dckpt.toml"),
            // A range error set by a variable names the variable, not the file.
            ("persistent = \"/a\"\n", &[("DCKPT_CHUNK_SIZE", "16")], "DCKPT_CHUNK_SIZE"),
            ("persistent = \"/a\"\n", &[("DCKPT_THRESHOLD", "0")], "DCKPT_THRESHOLD"),
            // An empty directory, and one directory for two tiers.
            ("scratch = \"/s\"\n", &[("DCKPT_PERSISTENT", "")], "DCKPT_PERSISTENT"),
            ("persistent = \"/a\"\nscratch = \"/a/\"\n", &[], "two directories"),
        ];
        for (text, env, named) in cases {
            let e = load(text, env).expect_err(text);
            assert_eq!(e.kind(), crate::error::ErrorKind::InvalidOption, "{text}: {e}");
            assert!(e.to_string().contains(named), "{text}: the error names {named}: {e}");
            assert!(!e.to_string().contains('\n'), "one line: {e}");
        }
        // A syntax error says where, on one line.
        let e = load("persistent = \"/a\"\nmode = = 3\n", &[]).expect_err("syntax");
        assert!(e.to_string().contains("line 2"), "{e}");
    }

    #[test]
    fn misspelled_and_lower_case_variables_are_refused_by_name() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        check_variable_names(names(&["DCKPT_CHUNK_SIZE", "DCKPT_PROFILE", "DCKPT_LOG", "PATH", "HOME"]))
            .expect("known");
        let e = check_variable_names(names(&["DCKPT_CHUNKSIZE"])).expect_err("misspelled");
        assert!(e.to_string().contains("DCKPT_CHUNK_SIZE"), "the closest key: {e}");
        let e = check_variable_names(names(&["dckpt_host_cache_size"])).expect_err("lower case");
        assert!(e.to_string().contains("DCKPT_HOST_CACHE_SIZE"), "{e}");
        let e = check_variable_names(names(&["DCKPT_PERSISTANT"])).expect_err("misspelled");
        assert!(e.to_string().contains("DCKPT_PERSISTENT"), "{e}");
    }

    #[test]
    fn caches_beyond_the_machine_s_memory_are_refused() {
        let c = load("persistent = \"/a\"\nhost_cache_size = \"1T\"\nprefetch_cache_size = \"1T\"\n", &[])
            .expect("a valid file");
        if machine_memory().is_some_and(|m| m < 2 << 40) {
            let e = c.check_machine().expect_err("2 TiB of caches");
            assert!(e.to_string().contains("host_cache_size"), "{e}");
        }
        load("persistent = \"/a\"\n", &[]).expect("defaults").check_machine().expect("the defaults fit");
    }

    #[test]
    fn the_sources_name_the_variable_the_file_or_the_default() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("c.toml");
        std::fs::write(&f, "persistent = \"/a\"\nmethod = \"list\"\n").expect("write");
        let env = |v: &str| (v == "DCKPT_METHOD").then(|| "tree".to_string());
        let sources = Config::sources(Some(&f), env).expect("sources");
        let of = |k: &str| sources.iter().find(|(key, _)| *key == k).map(|(_, s)| s.clone()).unwrap_or_default();
        assert_eq!(of("method"), "environment variable DCKPT_METHOD");
        assert!(of("persistent").ends_with("c.toml"));
        assert_eq!(of("chunk_size"), "default");
    }
}
