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
}
