//! Where the tiers are and how large their caches are ([`TierOptions`]).

use super::*;

/// Where the tiers are and how large the cache is. Serde-able for configs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TierOptions {
    /// A node-local directory (fast scratch), if any.
    pub local: Option<PathBuf>,
    /// A shared directory every rank sees (a parallel file system), if any.
    pub shared: Option<PathBuf>,
    /// Bytes of host memory for the cache, allocated when the engine opens.
    /// A diff larger than this cannot be taken (a clear error).
    pub host_cache_bytes: u64,
    /// Compress each file's data on its way from the host cache to the
    /// first disk tier (in that tier's flush worker, off the application's
    /// path); later tiers copy the compressed file. `None`: plain files.
    pub compression: Option<Compression>,
    /// Retention on the local tier: keep the newest N versions there (and
    /// what their chains need), delete older ones as new versions become
    /// durable. `None`: keep every version.
    pub keep_local: Option<u64>,
    /// Retention on the shared tier, as `keep_local`.
    pub keep_shared: Option<u64>,
    /// Bytes of host memory for prefetched diff files
    /// ([`TieredEngine::prefetch_enqueue`]); 0: restores read the disk tiers.
    pub prefetch_cache_bytes: u64,
    /// What the prefetch cache evicts first.
    pub eviction: arena::Policy,
    /// The GPU cache tier (CUDA backend): device memory for diff files on
    /// their way to the host cache, part of `gpu_memory`'s budget
    /// (`crate::backend::budget::GpuCache`: `Auto` takes what the budget
    /// leaves spare, a size is taken first, 0 is none).
    pub gpu_cache: GpuCache,
    /// The per-node agent's directory (`crate::agent`): the host cache's
    /// segments in shared memory there and a journal of the versions not
    /// yet on every tier, which the agent finishes if the process dies.
    /// `None`: heap memory, and a returned checkpoint dies with the process.
    pub journal: Option<PathBuf>,
}

impl Default for TierOptions {
    fn default() -> Self {
        TierOptions {
            local: None,
            shared: None,
            host_cache_bytes: 1 << 30,
            compression: None,
            keep_local: None,
            keep_shared: None,
            prefetch_cache_bytes: 0,
            eviction: arena::Policy::GapAware,
            gpu_cache: GpuCache::Auto,
            journal: None,
        }
    }
}

impl TierOptions {
    /// The names of the disk tiers configured, fastest first.
    pub fn disks_named(&self) -> Vec<String> {
        self.disks().into_iter().map(|(name, _)| name).collect()
    }

    /// The retention of the disk tier named `name` (`local` or `shared`).
    pub(super) fn keep_of(&self, name: &str) -> Option<u64> {
        if name == "local" { self.keep_local } else { self.keep_shared }
    }

    /// The disk tiers, fastest first, with their names.
    pub(super) fn disks(&self) -> Vec<(String, PathBuf)> {
        let mut v = Vec::new();
        if let Some(p) = &self.local {
            v.push(("local".to_string(), p.clone()));
        }
        if let Some(p) = &self.shared {
            v.push(("shared".to_string(), p.clone()));
        }
        v
    }
}
