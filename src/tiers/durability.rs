//! Where each version stands on each tier: the newest durable, waiting
//! for durability, and the states `inspect` reports.

use super::*;

impl TieredEngine {
    /// The newest version taken (or found committed at open).
    pub fn latest(&self) -> Option<u64> {
        self.latest
    }

    /// Blocks until `version` is durable on every tier; an error names the
    /// tier where it is not (it may still be durable on another: see
    /// [`TieredEngine::is_durable`]).
    pub fn wait(&self, version: u64) -> Result<()> {
        let tracked = self.shared.progress.states(version).is_some();
        if !tracked && self.latest.is_none_or(|l| version > l) {
            return Err(Error::MissingVersion { dir: self.roots[0].clone(), rank: self.rank, version });
        }
        if self.shared.progress.wait(version)? {
            return Ok(());
        }
        // Not tracked (an earlier run's version, a checkpoint that failed,
        // or one durable everywhere long ago): the tiers' manifests say.
        for (i, tier) in self.tiers().iter().enumerate() {
            if !self.listed(version, i) {
                return Err(Error::NotDurable {
                    version,
                    tier: tier.clone(),
                    reason: format!("it is not listed in {}", self.roots[i].display()),
                });
            }
        }
        Ok(())
    }

    /// Whether `version` was taken in this run or is listed on some tier.
    pub fn knows(&self, version: u64) -> bool {
        self.shared.progress.states(version).is_some() || (0..self.roots.len()).any(|i| self.listed(version, i))
    }

    /// Whether tier `i`'s manifest lists `version` now.
    pub(super) fn listed(&self, version: u64, i: usize) -> bool {
        Store::open(&self.roots[i], self.rank).is_ok_and(|s| s.manifest().get(version).is_some())
    }

    /// Blocks until every version taken so far is settled on every tier;
    /// the first failure, if any. Then asks for a retention pass (in the
    /// background), which may now delete what a slower tier was still
    /// copying during the last one.
    pub fn wait_all(&self) -> Result<()> {
        let result = self.shared.progress.wait_all();
        self.flusher.retire();
        result
    }

    /// Whether `version` is durable on tier `tier` (its name) now: listed
    /// there, and for a collective version committed there (every rank's
    /// files durable on that tier).
    pub fn is_durable(&self, version: u64, tier: &str) -> bool {
        let Some(i) = self.tiers().iter().position(|t| t == tier) else { return false };
        match self.shared.progress.states(version) {
            // This rank's file is durable; a collective version needs every rank's.
            Some(states) if states.get(i) == Some(&TierState::Durable) => !self.collective || self.listed(version, i),
            Some(_) => false,
            // Not tracked any more: the tier's manifest says.
            None => self.listed(version, i),
        }
    }

    /// Whether this rank's own file of `version` is durable on every tier
    /// (the collective `wait` combines every rank's answer); per tier.
    pub(crate) fn own_durable(&self, version: u64) -> Vec<bool> {
        let _ = self.shared.progress.wait(version);
        match self.shared.progress.states(version) {
            // Retired: it was durable there (retention deleted it since).
            Some(states) => states.iter().map(|s| matches!(s, TierState::Durable | TierState::Retired)).collect(),
            None => (0..self.roots.len()).map(|i| self.listed(version, i)).collect(),
        }
    }

    /// A version's state on every tier (`None` once it is no longer tracked).
    pub fn states(&self, version: u64) -> Option<Vec<TierState>> {
        self.shared.progress.states(version)
    }

    /// The fastest tier where `version` is durable, waiting for each tier
    /// in turn to settle it (a version still in flight restores as soon as
    /// the first tier has it).
    pub(super) fn first_durable(&self, version: u64) -> Option<usize> {
        (0..self.roots.len()).find(|&i| {
            self.shared.progress.wait_tier(version, i);
            self.is_durable(version, &self.tiers()[i])
        })
    }

    /// Serves `files` (other nodes' manifests and diff files, fetched for a
    /// restart) to the restores from now on, over every tier; `None` stops.
    pub(crate) fn set_remote_files(&self, files: Option<RemoteFiles>) {
        *crate::sync::lock(&self.remote) = files.map(Arc::new);
    }

    /// A handle another thread waits on for this rank's own file of a
    /// version to settle on tier `tier` (by index).
    pub(crate) fn tier_watch(&self, tier: usize) -> TierWatch {
        TierWatch { shared: Arc::clone(&self.shared), tier }
    }
}

/// Waits for this rank's files on one tier ([`TieredEngine::tier_watch`]).
#[derive(Clone)]
pub(crate) struct TierWatch {
    shared: Arc<flusher::Shared>,
    tier: usize,
}

impl TierWatch {
    /// From now on, retention on this tier keeps each version until
    /// [`TierWatch::copied`] says its copies are over.
    pub fn hold_for_copies(&self) {
        self.shared.copy_hold.hold(self.tier);
    }

    /// `version`'s copies from this tier are over (made or failed), and so
    /// are those of every version before it: retention may delete them.
    pub fn copied(&self, version: u64) {
        self.shared.copy_hold.copied(version);
    }

    /// Blocks until `version` is settled on the tier; whether this rank's
    /// file is durable there (or was, before retention deleted it).
    pub fn wait_durable(&self, version: u64) -> bool {
        self.shared.progress.wait_tier(version, self.tier);
        self.shared
            .progress
            .states(version)
            .and_then(|s| s.get(self.tier).cloned())
            .is_some_and(|s| matches!(s, TierState::Durable | TierState::Retired))
    }
}
