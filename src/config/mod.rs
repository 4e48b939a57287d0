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
//! late_step = "baseline"         # a call finding the last step still running: baseline (wait for a baseline's) | keep | wait
//! host_cache_size = "4G"         # bytes, or a size with K, M, G, T
//! prefetch_cache_size = "2G"     # the restore cache (0: none)
//! eviction = "gap-aware"         # fifo | lru | gap-aware
//! max_versions = 4               # kept per tier (absent: all)
//! compression = "zstd:1"         # none | lz4 | zstd | zstd:N
//! backend = "auto"               # auto | cpu | cuda
//! gpu_memory = "1.5x"            # CUDA: device memory per rank (a multiple of the buffer, or a size)
//! gpu_cache_size = "auto"        # CUDA: the GPU cache tier, within gpu_memory (auto: what is spare; 0: none)
//! redundancy = "partner"         # none | partner | xor:N: copies of the scratch tier on other nodes
//! ranks_per_node = 0             # node membership: 0 from MPI, k: ranks 0..k-1 on node 0, … (emulated nodes)
//! max_copy_lag = 2               # versions the copies may lag behind the calls before a call waits (0: no bound)
//! halt_seconds = 0               # should_exit: the margin kept before the scheduler's walltime ends
//! agent = "auto"                 # auto: a per-node agent finishes a killed job's flushes | off
//! agent_dir = "/dev/shm/dckpt-0" # its directory: the host cache's segments and journals (default /dev/shm/dckpt-<uid>)
//! ```
//!
//! `scratch` may hold `{node}`, replaced by the node's index
//! (`/tmp/ckpt/node-{node}`), so that emulated nodes get their own directories.
//!
//! An unknown key, a bad value or a bad override is an error naming the key
//! and where it came from (the file, the variable, or the command line's
//! flag). One value, [`Config`], serves the API (`Config { .. }` or
//! [`Config::builder`]), the file, the environment and the `dckpt` command
//! line alike ([`ConfigBuilder`]: each layer over the one before, through
//! the same keys and the same parser).

use crate::backend::BackendKind;
use crate::collective::{CollectiveOptions, LateStep, Overlap};
use crate::error::{Error, Result};
use crate::format::Compression;
use crate::hash::HashAlgo;
use crate::layout::Layout;
use crate::method::Method;
use crate::redundancy::{NODE_PLACEHOLDER, Redundancy};
use crate::sizes::{GpuCache, GpuMemory};
use crate::sizes::{IntOrText, parse_size};
use crate::store::StoreOptions;
use crate::tiers::TierOptions;
use crate::tiers::arena::Policy;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

mod layers;
use layers::read_table;
pub use layers::{ConfigBuilder, OTHER_VARIABLES, check_variable_names};
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

/// Whether a per-node agent finishes the flushes of a job killed after a
/// checkpoint call returned (`crate::agent`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentMode {
    /// The host cache in shared memory with a journal; an agent started
    /// per node when none runs (or the next job on the node) finishes what
    /// a dead rank left.
    #[default]
    Auto,
    /// The host cache in the process's heap: a returned checkpoint not yet
    /// durable dies with the process.
    Off,
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
    /// What a checkpoint call does when the previous version's collective
    /// step is still running on its thread: `baseline` (wait for a
    /// baseline's step, keep the regions of any other), `keep` or `wait`.
    pub late_step: LateStep,
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
    /// Copies of the node-local tier (`scratch`) on other nodes: `none`,
    /// `partner` or `xor:N`.
    pub redundancy: Redundancy,
    /// Ranks per node for node membership (0: as MPI reports).
    pub ranks_per_node: u32,
    /// Versions the copies of the node-local tier may lag behind the calls
    /// before a call waits for them (0: no bound).
    pub max_copy_lag: u64,
    /// Seconds kept in reserve before the scheduler's walltime ends:
    /// [`crate::runtime::Runtime::should_exit`] says stop once the time
    /// left is shorter than this plus what the last checkpoint took to
    /// become durable.
    pub halt_seconds: u64,
    /// The per-node agent that finishes a killed job's flushes.
    pub agent: AgentMode,
    /// The agent's directory, in shared memory (`None`: `/dev/shm/dckpt-<uid>`).
    pub agent_dir: Option<PathBuf>,
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
            late_step: collective.late_step,
            host_cache_size: Bytes(tiers.host_cache_bytes),
            prefetch_cache_size: Bytes(tiers.prefetch_cache_bytes),
            eviction: tiers.eviction,
            max_versions: None,
            compression: None,
            backend: collective.backend,
            gpu_memory: store.gpu_memory,
            gpu_cache_size: tiers.gpu_cache,
            redundancy: collective.redundancy,
            ranks_per_node: collective.ranks_per_node,
            max_copy_lag: collective.max_copy_lag,
            halt_seconds: 0,
            agent: AgentMode::Auto,
            agent_dir: None,
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
    "late_step",
    "host_cache_size",
    "prefetch_cache_size",
    "eviction",
    "max_versions",
    "compression",
    "backend",
    "gpu_memory",
    "gpu_cache_size",
    "redundancy",
    "ranks_per_node",
    "max_copy_lag",
    "halt_seconds",
    "agent",
    "agent_dir",
];

impl Config {
    /// The configuration in `file` (if any) with the environment's
    /// `DCKPT_<KEY>` overrides, checked.
    pub fn load(file: Option<&Path>) -> Result<Config> {
        let config = Config::builder().file(file).environment().build()?;
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
        Config::builder().file(file).environment_from(env).build()
    }

    /// This configuration (a program's own defaults) with the environment's
    /// `DCKPT_<KEY>` overrides, checked.
    pub fn with_env(&self) -> Result<Config> {
        Config::builder().base(self).environment().build()
    }

    /// A [`ConfigBuilder`]: the defaults, then a file, the environment and
    /// values set by key, each over the one before.
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder::default()
    }

    /// The values no type can check: a usable chunk size, a K in range, a
    /// directory at least (named, and two different ones), retention of one
    /// version at least. An error names the key responsible.
    pub(super) fn check(&self) -> std::result::Result<(), (&'static str, String)> {
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
            return Err((
                "persistent",
                "scratch, persistent: set at least one directory (the key `persistent` or `scratch` in the \
                 configuration file, or DCKPT_PERSISTENT / DCKPT_SCRATCH in the environment)"
                    .into(),
            ));
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
        if self.redundancy.is_some() && self.scratch.is_none() {
            return fail(
                "redundancy",
                format!("{} protects the node-local tier, and scratch is not set", self.redundancy),
            );
        }
        if self.persistent.as_deref().and_then(Path::to_str).is_some_and(|p| p.contains(NODE_PLACEHOLDER)) {
            return fail("persistent", format!("holds {NODE_PLACEHOLDER}: only scratch, the node-local tier, may"));
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
            journal: self.agent_root(),
        }
    }

    /// The per-node agent's directory, if `agent = "auto"`.
    pub fn agent_root(&self) -> Option<PathBuf> {
        (self.agent == AgentMode::Auto)
            .then(|| self.agent_dir.clone().unwrap_or_else(crate::tiers::journal::default_root))
    }

    /// The collective step's options.
    pub fn collective_options(&self) -> CollectiveOptions {
        CollectiveOptions {
            threshold: self.threshold,
            region_bytes: self.region_bytes.0,
            min_region_bytes: self.min_region_bytes.0,
            overlap: self.overlap,
            late_step: self.late_step,
            backend: self.backend,
            local_only: !self.collective,
            redundancy: self.redundancy,
            ranks_per_node: self.ranks_per_node,
            max_copy_lag: self.max_copy_lag,
        }
    }

    /// The configuration as TOML (what `dckpt config --check` prints).
    pub fn to_toml(&self) -> Result<String> {
        toml::to_string(self).map_err(|e| Error::Internal(format!("printing the configuration: {e}")))
    }
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

#[cfg(test)]
mod tests;
