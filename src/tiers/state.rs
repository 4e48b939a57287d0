//! The life cycle of a version on each tier, shared between the
//! application side and the flush workers: `Queued` (in the host cache,
//! waiting for this tier) → `Writing` → `Durable` (its file fsynced, renamed
//! and listed in this tier's manifest) or `Failed`. [`Progress::wait`]
//! blocks until a version is settled on every tier.

use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex};

/// A version's state on one tier.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum TierState {
    /// Held in the host cache; this tier has not started it.
    Queued,
    /// Being written to this tier.
    Writing,
    /// Durable and listed on this tier.
    Durable,
    /// Not written here, with the reason (older versions are intact).
    Failed(String),
    /// Was durable here; deleted by the tier's retention (newer versions
    /// no longer need it).
    Retired,
}

impl TierState {
    /// Whether the tier is done with the version (durable, failed or retired).
    pub fn settled(&self) -> bool {
        matches!(self, TierState::Durable | TierState::Failed(_) | TierState::Retired)
    }
}

/// Versions durable on every tier beyond this many are forgotten (their
/// state is then read from the tiers' manifests); failed ones are kept.
const REMEMBERED: usize = 4096;

/// Every in-flight or recent version's state per tier.
#[derive(Debug)]
pub struct Progress {
    tiers: Vec<String>,
    states: Mutex<BTreeMap<u64, Vec<TierState>>>,
    changed: Condvar,
}

impl Progress {
    /// Progress over the named tiers (fastest first).
    pub fn new(tiers: Vec<String>) -> Self {
        Progress { tiers, states: Mutex::new(BTreeMap::new()), changed: Condvar::new() }
    }

    /// The tiers' names.
    pub fn tiers(&self) -> &[String] {
        &self.tiers
    }

    /// Records a new version, queued on every tier.
    pub fn register(&self, version: u64) {
        let mut s = crate::sync::lock(&self.states);
        s.insert(version, vec![TierState::Queued; self.tiers.len()]);
        // Forget the oldest versions durable everywhere; failures stay (so
        // that `wait` and `wait_all` keep reporting them).
        if s.len() > REMEMBERED {
            let done: Vec<u64> = s
                .iter()
                .filter(|(_, st)| st.iter().all(|t| matches!(t, TierState::Durable | TierState::Retired)))
                .map(|(v, _)| *v)
                .take(s.len() - REMEMBERED)
                .collect();
            for v in done {
                s.remove(&v);
            }
        }
    }

    /// Sets a version's state on tier `tier`.
    pub fn set(&self, version: u64, tier: usize, state: TierState) {
        let mut s = crate::sync::lock(&self.states);
        if let Some(slot) = s.get_mut(&version).and_then(|v| v.get_mut(tier)) {
            *slot = state;
        }
        drop(s);
        self.changed.notify_all();
    }

    /// Fails every version not yet settled on tier `tier` (its worker has
    /// stopped and will never settle them).
    pub fn fail_unsettled(&self, tier: usize, reason: &str) {
        let mut s = crate::sync::lock(&self.states);
        for states in s.values_mut() {
            if let Some(state) = states.get_mut(tier).filter(|st| !st.settled()) {
                *state = TierState::Failed(reason.to_string());
            }
        }
        drop(s);
        self.changed.notify_all();
    }

    /// A version's state on each tier (`None` when it is not remembered).
    pub fn states(&self, version: u64) -> Option<Vec<TierState>> {
        crate::sync::lock(&self.states).get(&version).cloned()
    }

    /// Blocks until `version` is settled on every tier; `Ok(true)` when it
    /// is durable on all of them, `Ok(false)` when it is not tracked (the
    /// caller asks the tiers), otherwise the first tier's failure.
    pub fn wait(&self, version: u64) -> Result<bool> {
        let mut s = crate::sync::lock(&self.states);
        loop {
            match s.get(&version) {
                None => return Ok(false),
                Some(v) if v.iter().all(TierState::settled) => break,
                Some(_) => s = crate::sync::wait(&self.changed, s),
            }
        }
        let states = s.get(&version).cloned().unwrap_or_default();
        drop(s);
        for (tier, state) in self.tiers.iter().zip(states) {
            if let TierState::Failed(reason) = state {
                return Err(Error::NotDurable { version, tier: tier.clone(), reason });
            }
        }
        Ok(true)
    }

    /// Blocks until `version` is settled on tier `tier` (or not tracked).
    pub fn wait_tier(&self, version: u64, tier: usize) {
        let mut s = crate::sync::lock(&self.states);
        while s.get(&version).and_then(|v| v.get(tier)).is_some_and(|st| !st.settled()) {
            s = crate::sync::wait(&self.changed, s);
        }
    }

    /// Blocks until every registered version is settled on every tier.
    pub fn wait_all(&self) -> Result<()> {
        let versions: Vec<u64> = crate::sync::lock(&self.states).keys().copied().collect();
        let mut first = Ok(());
        for v in versions {
            if let Err(e) = self.wait(v).map(|_| ())
                && first.is_ok()
            {
                first = Err(e);
            }
        }
        first
    }
}
