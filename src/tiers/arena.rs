//! Where a checkpoint goes in a cache arena of variable-size checkpoints,
//! and what must leave to make room: the allocation table and the eviction
//! policies compared by issue #9 (FIFO, LRU and the gap-aware, score-based
//! policy of Maurya et al., HPDC'23, Algorithm 1). Pure bookkeeping over
//! offsets and sizes, no bytes: the cache tiers ask it where to put a
//! checkpoint, wait until the chosen victims are evictable, then commit the
//! placement; tests drive it with hand-made tables.
//!
//! The arena is a sequence of fragments covering `[0, capacity)`: checkpoints
//! and gaps (adjacent gaps coalesce). A new checkpoint needs one contiguous
//! run of fragments at least its size.
//!
//! **Gap-aware** (`Policy::GapAware`): every window of consecutive fragments
//! just large enough (two pointers, O(N) per placement) is scored by
//! 1. the blocking time: the sum of its checkpoints' estimated time until
//!    evictable (flushed to a slower tier, or consumed); a window holding a
//!    checkpoint that may not be evicted (a prefetch in flight, or not yet
//!    safe anywhere else and not expected to be) is never chosen;
//! 2. the restore cost of evicting it: gaps and consumed checkpoints cost 0,
//!    a checkpoint without a restore hint 1, a hinted one `1 + |P| − d` where
//!    `d` is its distance from the head of the restore order `P` (the next to
//!    be restored costs most);
//! 3. the bytes evicted.
//!
//! The smallest (1, 2, 3) wins. This is Algorithm 1's order (blocking time
//! first, then the prefetch distance) with the distance term turned into a
//! cost to minimize, so that a free gap is never passed over for an
//! evictable checkpoint and a window never takes a checkpoint it does not
//! need.
//!
//! **FIFO** and **LRU** evict whole checkpoints in insertion or last-use
//! order until some contiguous run of gaps fits the new one, waiting for
//! each victim as needed (the baselines of HPDC'23's comparison).

use std::collections::HashMap;

/// A checkpoint's place in the life cycle, as eviction sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Evictable {
    /// Now: safe on a slower tier (flushed), or consumed.
    Now,
    /// After about this many seconds (a flush or a read in progress).
    After(f64),
    /// Not while it is in this state (a prefetch in flight).
    Never,
}

/// The eviction policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Oldest inserted first.
    Fifo,
    /// Least recently used first.
    Lru,
    /// Score-based, gap-aware (HPDC'23 Algorithm 1).
    GapAware,
}

impl std::str::FromStr for Policy {
    type Err = crate::error::Error;
    fn from_str(s: &str) -> crate::error::Result<Self> {
        match s {
            "fifo" => Ok(Policy::Fifo),
            "lru" => Ok(Policy::Lru),
            "gap-aware" => Ok(Policy::GapAware),
            _ => Err(crate::error::Error::InvalidOption(format!("eviction policy '{s}': fifo, lru or gap-aware"))),
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Policy::Fifo => "fifo",
            Policy::Lru => "lru",
            Policy::GapAware => "gap-aware",
        })
    }
}

/// What a checkpoint in the arena is known by.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Resident {
    /// Its id (a version).
    pub id: u64,
    /// Bytes it occupies.
    pub size: u64,
    /// When it can be evicted.
    pub evictable: Evictable,
    /// Consumed (restored and not needed again): evicted first.
    pub consumed: bool,
    /// Insertion tick (FIFO).
    pub inserted: u64,
    /// Last-use tick (LRU).
    pub used: u64,
}

/// One fragment of the arena: a checkpoint or a gap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fragment {
    /// The checkpoint's id, `None` for a gap.
    pub id: Option<u64>,
    /// First byte.
    pub offset: u64,
    /// Bytes.
    pub size: u64,
}

/// Where a new checkpoint goes and what must leave first.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// Its offset.
    pub offset: u64,
    /// The checkpoints to evict (wait until each is evictable, then
    /// [`Arena::remove`] it), in arena order.
    pub evict: Vec<u64>,
    /// The estimated wait, seconds (the largest of the victims' waits).
    pub wait_seconds: f64,
}

/// The allocation table of one cache arena.
#[derive(Clone, Debug)]
pub struct Arena {
    capacity: u64,
    fragments: Vec<Fragment>,
    residents: HashMap<u64, Resident>,
    tick: u64,
}

impl Arena {
    /// An empty arena of `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        let fragments = if capacity > 0 { vec![Fragment { id: None, offset: 0, size: capacity }] } else { vec![] };
        Arena { capacity, fragments, residents: HashMap::new(), tick: 0 }
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The fragments, in offset order.
    pub fn fragments(&self) -> &[Fragment] {
        &self.fragments
    }

    /// A resident checkpoint.
    pub fn get(&self, id: u64) -> Option<&Resident> {
        self.residents.get(&id)
    }

    /// Bytes held by checkpoints.
    pub fn used(&self) -> u64 {
        self.residents.values().map(|r| r.size).sum()
    }

    /// Updates a resident's life-cycle state.
    pub fn set_evictable(&mut self, id: u64, evictable: Evictable) {
        if let Some(r) = self.residents.get_mut(&id) {
            r.evictable = evictable;
        }
    }

    /// Marks a resident consumed (evicted before anything else).
    pub fn consume(&mut self, id: u64) {
        if let Some(r) = self.residents.get_mut(&id) {
            r.consumed = true;
            r.evictable = Evictable::Now;
        }
    }

    /// Records a use (LRU).
    pub fn touch(&mut self, id: u64) {
        self.tick += 1;
        let t = self.tick;
        if let Some(r) = self.residents.get_mut(&id) {
            r.used = t;
        }
    }

    /// Where a checkpoint of `size` bytes would go under `policy`, with
    /// `order` the restore order (hinted ids, next to be restored first).
    /// `None` when it cannot fit even after every allowed eviction.
    pub fn place(&self, size: u64, policy: Policy, order: &[u64]) -> Option<Placement> {
        if size == 0 || size > self.capacity {
            return None;
        }
        match policy {
            Policy::GapAware => self.place_gap_aware(size, order),
            Policy::Fifo => self.place_in_order(size, |r| (u8::from(!r.consumed), r.inserted)),
            Policy::Lru => self.place_in_order(size, |r| (u8::from(!r.consumed), r.used)),
        }
    }

    /// Algorithm 1: the best window of consecutive fragments.
    fn place_gap_aware(&self, size: u64, order: &[u64]) -> Option<Placement> {
        let distance: HashMap<u64, usize> = order.iter().enumerate().map(|(d, id)| (*id, d)).collect();
        let hinted = order.len() as u64;
        // Per fragment: (blocking seconds, pinned?, restore cost).
        let score: Vec<(f64, bool, u64)> = self
            .fragments
            .iter()
            .map(|f| match f.id.and_then(|id| self.residents.get(&id)) {
                None => (0.0, false, 0),
                Some(r) => {
                    let (wait, pinned) = match r.evictable {
                        Evictable::Now => (0.0, false),
                        Evictable::After(s) => (s.max(0.0), false),
                        Evictable::Never => (0.0, true),
                    };
                    let cost = if r.consumed { 0 } else { distance.get(&r.id).map_or(1, |&d| 1 + hinted - d as u64) };
                    (wait, pinned, cost)
                }
            })
            .collect();
        let n = self.fragments.len();
        type Best = (f64, u64, u64, usize, usize);
        let mut best: Option<Best> = None;
        let (mut j, mut window, mut wait, mut pinned, mut cost, mut bytes) = (0usize, 0u64, 0.0f64, 0usize, 0u64, 0u64);
        for i in 0..n {
            if i > 0 {
                let (f, s) = (&self.fragments[i - 1], score[i - 1]);
                window -= f.size;
                wait -= s.0;
                pinned -= usize::from(s.1);
                cost -= s.2;
                bytes -= if f.id.is_some() { f.size } else { 0 };
            }
            while window < size && j < n {
                let (f, s) = (&self.fragments[j], score[j]);
                window += f.size;
                wait += s.0;
                pinned += usize::from(s.1);
                cost += s.2;
                bytes += if f.id.is_some() { f.size } else { 0 };
                j += 1;
            }
            if window < size {
                break; // no later start can reach the size either
            }
            if pinned > 0 {
                continue;
            }
            let candidate = (wait.max(0.0), cost, bytes, i, j);
            let better = best.is_none_or(|b| (candidate.0, candidate.1, candidate.2) < (b.0, b.1, b.2));
            if better {
                best = Some(candidate);
            }
        }
        let (_, _, _, i, j) = best?;
        let evict: Vec<u64> = self.fragments[i..j].iter().filter_map(|f| f.id).collect();
        let wait_seconds = evict.iter().map(|id| self.wait_of(*id)).fold(0.0, f64::max);
        Some(Placement { offset: self.fragments[i].offset, evict, wait_seconds })
    }

    /// FIFO / LRU: evict in `key` order (consumed first) until a run of
    /// gaps fits; checkpoints that may never be evicted are skipped.
    fn place_in_order<K: Ord>(&self, size: u64, key: impl Fn(&Resident) -> K) -> Option<Placement> {
        let mut victims: Vec<&Resident> = self.residents.values().filter(|r| r.evictable != Evictable::Never).collect();
        victims.sort_by_key(|r| key(r));
        let mut free = vec![false; self.fragments.len()];
        let index: HashMap<u64, usize> =
            self.fragments.iter().enumerate().filter_map(|(k, f)| f.id.map(|id| (id, k))).collect();
        for (k, f) in self.fragments.iter().enumerate() {
            free[k] = f.id.is_none();
        }
        let mut evicted = Vec::new();
        for step in 0..=victims.len() {
            if step > 0 {
                let v = victims[step - 1];
                free[index[&v.id]] = true;
                evicted.push(v.id);
            }
            // The first run of free fragments that fits.
            let mut run_start = None;
            let mut run = 0u64;
            for (k, f) in self.fragments.iter().enumerate() {
                if free[k] {
                    let s = *run_start.get_or_insert(k);
                    run += f.size;
                    if run >= size {
                        let evict: Vec<u64> = self.fragments[s..=k].iter().filter_map(|f| f.id).collect();
                        // Only the victims inside the run need to leave.
                        let wait_seconds = evict.iter().map(|id| self.wait_of(*id)).fold(0.0, f64::max);
                        return Some(Placement { offset: self.fragments[s].offset, evict, wait_seconds });
                    }
                } else {
                    run_start = None;
                    run = 0;
                }
            }
        }
        None
    }

    fn wait_of(&self, id: u64) -> f64 {
        match self.residents.get(&id).map(|r| r.evictable) {
            Some(Evictable::After(s)) => s.max(0.0),
            _ => 0.0,
        }
    }

    /// Puts checkpoint `id` of `size` bytes at `offset`, which must lie in
    /// one gap (the caller evicted what [`Arena::place`] named). Returns
    /// whether it fit.
    pub fn insert(&mut self, id: u64, offset: u64, size: u64, evictable: Evictable) -> bool {
        let Some(k) = self
            .fragments
            .iter()
            .position(|f| f.id.is_none() && f.offset <= offset && offset + size <= f.offset + f.size)
        else {
            return false;
        };
        if size == 0 || self.residents.contains_key(&id) {
            return false;
        }
        let gap = self.fragments[k];
        let mut pieces = Vec::with_capacity(3);
        if offset > gap.offset {
            pieces.push(Fragment { id: None, offset: gap.offset, size: offset - gap.offset });
        }
        pieces.push(Fragment { id: Some(id), offset, size });
        let end = gap.offset + gap.size;
        if offset + size < end {
            pieces.push(Fragment { id: None, offset: offset + size, size: end - offset - size });
        }
        self.fragments.splice(k..=k, pieces);
        self.tick += 1;
        let t = self.tick;
        self.residents.insert(id, Resident { id, size, evictable, consumed: false, inserted: t, used: t });
        true
    }

    /// Removes checkpoint `id` (evicted, or no longer needed); its bytes
    /// become a gap, merged with its neighbours. Returns whether it was there.
    pub fn remove(&mut self, id: u64) -> bool {
        let Some(k) = self.fragments.iter().position(|f| f.id == Some(id)) else { return false };
        self.residents.remove(&id);
        self.fragments[k].id = None;
        if k + 1 < self.fragments.len() && self.fragments[k + 1].id.is_none() {
            self.fragments[k].size += self.fragments[k + 1].size;
            self.fragments.remove(k + 1);
        }
        if k > 0 && self.fragments[k - 1].id.is_none() {
            self.fragments[k - 1].size += self.fragments[k].size;
            self.fragments.remove(k);
        }
        true
    }

    /// Places, evicts what the placement names and inserts, in one step (for
    /// callers whose victims are all evictable now, and for tests). Returns
    /// the placement, or `None` when it cannot fit.
    pub fn admit(&mut self, id: u64, size: u64, policy: Policy, order: &[u64]) -> Option<Placement> {
        let p = self.place(size, policy, order)?;
        for v in &p.evict {
            self.remove(*v);
        }
        self.insert(id, p.offset, size, Evictable::After(0.0)).then_some(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An arena from a hand-made table: (id or gap, size, evictable, consumed).
    fn table(rows: &[(Option<u64>, u64, Evictable, bool)]) -> Arena {
        let cap = rows.iter().map(|r| r.1).sum();
        let mut a = Arena::new(cap);
        let mut at = 0;
        for &(id, size, ev, consumed) in rows {
            if let Some(id) = id {
                assert!(a.insert(id, at, size, ev));
                if consumed {
                    a.consume(id);
                }
            }
            at += size;
        }
        a
    }

    const NOW: Evictable = Evictable::Now;

    #[test]
    fn a_free_gap_is_taken_before_any_checkpoint_is_evicted() {
        let a = table(&[(Some(1), 100, NOW, true), (None, 100, NOW, false), (Some(2), 100, NOW, false)]);
        let p = a.place(80, Policy::GapAware, &[]).unwrap();
        assert_eq!((p.offset, p.evict.clone()), (100, vec![]));
    }

    #[test]
    fn consumed_checkpoints_go_before_unhinted_and_hinted_ones() {
        let a = table(&[(Some(1), 100, NOW, false), (Some(2), 100, NOW, true), (Some(3), 100, NOW, false)]);
        assert_eq!(a.place(100, Policy::GapAware, &[1, 3]).unwrap().evict, vec![2]);
        // Without the consumed one: the hint restored last goes first.
        let a = table(&[(Some(1), 100, NOW, false), (Some(3), 100, NOW, false), (Some(4), 100, NOW, false)]);
        assert_eq!(a.place(100, Policy::GapAware, &[4, 1, 3]).unwrap().evict, vec![3]);
        // An unhinted checkpoint goes before any hinted one.
        assert_eq!(a.place(100, Policy::GapAware, &[4, 3]).unwrap().evict, vec![1]);
    }

    #[test]
    fn small_gaps_and_a_small_checkpoint_between_them_make_one_window() {
        // No gap fits 150 alone; [gap 60, ckpt 2 (40), gap 60] does, and evicts only 2.
        let a = table(&[
            (Some(1), 200, NOW, false),
            (None, 60, NOW, false),
            (Some(2), 40, NOW, false),
            (None, 60, NOW, false),
            (Some(3), 200, NOW, false),
        ]);
        let p = a.place(150, Policy::GapAware, &[1, 3]).unwrap();
        assert_eq!((p.offset, p.evict.clone()), (200, vec![2]));
        // FIFO evicts the oldest first (1), which with its gap fits.
        let f = a.place(150, Policy::Fifo, &[]).unwrap();
        assert_eq!((f.offset, f.evict), (0, vec![1]));
    }

    #[test]
    fn blocking_time_comes_before_restore_order_and_pinned_ones_stay() {
        let a = table(&[
            (Some(1), 100, Evictable::After(2.0), false),
            (Some(2), 100, NOW, false),
            (Some(3), 100, Evictable::Never, false),
        ]);
        // 2 is hinted next, 1 is not, but 1 would block 2 s: 2 goes.
        let p = a.place(100, Policy::GapAware, &[2]).unwrap();
        assert_eq!((p.evict.clone(), p.wait_seconds), (vec![2], 0.0));
        // 200 bytes: only [1, 2] avoids the pinned 3.
        let p = a.place(200, Policy::GapAware, &[2]).unwrap();
        assert_eq!((p.offset, p.evict.clone(), p.wait_seconds), (0, vec![1, 2], 2.0));
        assert!(a.place(300, Policy::GapAware, &[]).is_none());
        assert!(a.place(300, Policy::Fifo, &[]).is_none());
    }

    #[test]
    fn fifo_and_lru_follow_their_order() {
        let mut a = Arena::new(300);
        for id in 1..=3 {
            assert!(a.admit(id, 100, Policy::Fifo, &[]).is_some());
            a.set_evictable(id, NOW);
        }
        a.touch(1);
        assert_eq!(a.place(100, Policy::Fifo, &[]).unwrap().evict, vec![1]);
        assert_eq!(a.place(100, Policy::Lru, &[]).unwrap().evict, vec![2]);
        // Evicting and inserting keeps the fragments a cover of the arena.
        a.admit(4, 150, Policy::Lru, &[]).unwrap();
        let covered: u64 = a.fragments().iter().map(|f| f.size).sum();
        assert_eq!(covered, 300);
        assert!(a.fragments().windows(2).all(|w| w[0].offset + w[0].size == w[1].offset));
        assert!(a.fragments().windows(2).all(|w| w[0].id.is_some() || w[1].id.is_some()), "gaps coalesce");
    }

    #[test]
    fn random_workloads_never_overlap_and_fill_what_fits() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for policy in [Policy::Fifo, Policy::Lru, Policy::GapAware] {
            let mut a = Arena::new(1000);
            for id in 0..500u64 {
                let size = 1 + rnd(300);
                let order: Vec<u64> = (id.saturating_sub(5)..id).rev().collect();
                assert!(a.admit(id, size, policy, &order).is_some(), "{policy:?}: {size} bytes always fit");
                a.set_evictable(id, NOW);
                if rnd(3) == 0 {
                    a.consume(id.saturating_sub(rnd(4)));
                }
                let f = a.fragments();
                assert_eq!(f.iter().map(|f| f.size).sum::<u64>(), 1000, "{policy:?}");
                assert!(f.windows(2).all(|w| w[0].offset + w[0].size == w[1].offset), "{policy:?}");
                assert_eq!(a.used(), f.iter().filter(|f| f.id.is_some()).map(|f| f.size).sum::<u64>());
            }
        }
    }
}
