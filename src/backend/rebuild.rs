//! The CPU backend's rebuild of a de-duplication state from a restored
//! version (what a baseline checkpoint of it would leave): its leaf digests
//! are the "previous" leaves, and the record holds the first occurrence of
//! each leaf digest (List, Tree) and every inner node whose leaves are all
//! first occurrences (Tree), each moved to where its bytes are physically
//! stored, per the restore's resolution ([`StoredMap`]). An inner node is
//! kept only when all its chunks sit contiguously in one file at an aligned
//! node of the same shape there; a leaf always is. Built in bulk: parallel
//! hashing, stable parallel sorts. The GPU backend applies the same rule
//! with one kernel (`table_locate`). `engine::rebuild` restores and calls it.

use crate::dedup::{DedupState, Method};
use crate::hash::{Digest, HashAlgo};
use crate::layout::{Layout, NodeId};
use crate::record::{Record, RecordEntry};
use crate::restore::{Source, StoredMap};
use rayon::prelude::*;
use std::collections::HashMap;
use std::time::Instant;

/// A state rebuilt from a restored version, with the time each part took.
#[derive(Debug)]
pub struct Rebuilt {
    /// Leaf digests of the latest version (`None` for Full).
    pub previous: Option<Vec<Digest>>,
    /// The record: unique digests, sorted, each where its bytes are stored.
    pub entries: Vec<(Digest, RecordEntry)>,
    /// Seconds spent restoring (and verifying) the latest version.
    pub restore_seconds: f64,
    /// Seconds spent hashing and building the record after the restore.
    pub rebuild_seconds: f64,
}

impl Rebuilt {
    /// The CPU engine's state.
    pub fn into_state(self, layout: Layout, hash: HashAlgo, rank: u32) -> DedupState {
        let mut state = DedupState::new(layout, hash, rank);
        state.record = Record::from_sorted_unique(&self.entries);
        state.previous = self.previous;
        state
    }
}

/// The CPU state a baseline checkpoint of `data` (a restored version whose
/// chunks are stored where `map` says) would leave: its leaf digests and
/// its record, each entry moved to where its bytes are stored.
pub fn rebuilt_from(data: &[u8], map: &StoredMap, layout: Layout, method: Method, hash: HashAlgo) -> Rebuilt {
    let t1 = Instant::now();
    let mut rebuilt = Rebuilt { previous: None, entries: Vec::new(), restore_seconds: 0.0, rebuild_seconds: 0.0 };
    if method.uses_previous() {
        let leaves: Vec<Digest> = {
            let _span = crate::profile::Span::new("rebuild-hash", 0);
            crate::dedup::hash_leaves(data, layout, hash, None).into_iter().map(|(_, d)| d).collect()
        };
        if method.uses_record() {
            let _span = crate::profile::Span::new("rebuild-entries", 0);
            let at = |node| locate(node, &layout, &map.runs, &map.layouts);
            rebuilt.entries = located_entries(&leaves, hash, method == Method::Tree, at);
        }
        rebuilt.previous = Some(leaves);
    }
    rebuilt.rebuild_seconds = t1.elapsed().as_secs_f64();
    rebuilt
}

/// The record entries a baseline checkpoint of a version with leaf digests
/// `leaves` inserts — the first occurrence of each leaf digest and (with
/// `tree`) each paired inner node whose leaves are all first occurrences —
/// kept where `at` can place them, sorted by digest.
fn located_entries(
    leaves: &[Digest],
    hash: HashAlgo,
    tree: bool,
    at: impl Fn(NodeId) -> Option<RecordEntry> + Sync,
) -> Vec<(Digest, RecordEntry)> {
    // First occurrences: sort (digest, index) stably, keep each digest's first.
    let mut order: Vec<(Digest, u64)> = leaves.par_iter().enumerate().map(|(i, d)| (*d, i as u64)).collect();
    order.par_sort_by_key(|(d, _)| *d);
    let mut first = vec![false; leaves.len()];
    for (k, &(d, i)) in order.iter().enumerate() {
        if k == 0 || order[k - 1].0 != d {
            first[i as usize] = true;
        }
    }
    drop(order);
    let mut all: Vec<(Digest, RecordEntry)> = leaves
        .par_iter()
        .enumerate()
        .filter(|(i, _)| first[*i])
        .filter_map(|(i, d)| at(NodeId::leaf(i as u64)).map(|e| (*d, e)))
        .collect();
    if tree {
        let (mut level, mut level_first): (Vec<Digest>, Vec<bool>) = (Vec::new(), Vec::new());
        let mut k = 0;
        loop {
            let (below, below_first): (&[Digest], &[bool]) =
                if k == 0 { (leaves, &first) } else { (&level, &level_first) };
            if below.len() < 2 {
                break;
            }
            let next: Vec<Digest> =
                below.par_chunks(2).map(|p| if let [l, r] = p { hash.node(*l, *r) } else { p[0] }).collect();
            // A pair is FIRST when both children are; a carried node keeps its child's state.
            let next_first: Vec<bool> = below_first.chunks(2).map(|p| p.iter().all(|&f| f)).collect();
            k += 1;
            let paired = below.len() / 2;
            all.par_extend(
                (0..paired)
                    .into_par_iter()
                    .filter(|&i| next_first[i])
                    .filter_map(|i| at(NodeId::new(k, i as u64)).map(|e| (next[i], e))),
            );
            (level, level_first) = (next, next_first);
        }
    }
    // Unique already (first occurrences; nodes are hashed in their own domain).
    all.par_sort_unstable_by_key(|(d, _)| *d);
    all.dedup_by_key(|(d, _)| *d);
    all
}

/// Where the bytes of node `e.node` of the latest version are stored, as a
/// record entry (a node of the same shape in the holding file), if they are
/// contiguous and aligned there.
fn locate(at: NodeId, layout: &Layout, runs: &[Source], layouts: &HashMap<u32, Layout>) -> Option<RecordEntry> {
    let c = layout.node_chunks(at);
    let s = runs.get(runs.partition_point(|s| s.dst + s.count <= c.start))?;
    if s.dst > c.start || c.end > s.dst + s.count {
        return None;
    }
    let first = s.src + (c.start - s.dst);
    let k = at.level();
    if first & ((1u64 << k) - 1) != 0 {
        return None;
    }
    let node = NodeId::new(k, first >> k);
    let src_layout = layouts.get(&s.rank)?;
    if !src_layout.contains(node) || src_layout.node_chunks(node) != (first..first + (c.end - c.start)) {
        return None;
    }
    Some(RecordEntry { version: u32::try_from(s.version).ok()?, rank: s.rank, node })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(dst: u64, count: u64, version: u64, s: u64) -> Source {
        Source { dst, count, rank: 0, version, src: s }
    }

    #[test]
    fn nodes_are_kept_only_where_contiguous_and_aligned() {
        let layout = Layout::new(64 * 16, 64).expect("layout");
        let layouts: HashMap<u32, Layout> = [(0, layout)].into();
        // Chunks 0..8 in version 1 at the same place, 8..12 shifted by one in version 2, 12..16 in version 3.
        let runs =
            crate::restore::maps::coalesce(vec![src(0, 4, 1, 0), src(4, 4, 1, 4), src(8, 4, 2, 9), src(12, 4, 3, 12)]);
        assert_eq!(runs.len(), 3, "the first two pieces continue each other");
        let whole = locate(NodeId::new(3, 0), &layout, &runs, &layouts).expect("aligned, one file");
        assert_eq!((whole.version, whole.node), (1, NodeId::new(3, 0)));
        assert_eq!(locate(NodeId::new(2, 2), &layout, &runs, &layouts), None, "shifted off alignment");
        let leaf = locate(NodeId::leaf(9), &layout, &runs, &layouts).expect("leaves always");
        assert_eq!((leaf.version, leaf.node), (2, NodeId::leaf(10)));
        assert_eq!(locate(NodeId::new(4, 0), &layout, &runs, &layouts), None, "spans three files");
        let top = locate(NodeId::new(2, 3), &layout, &runs, &layouts).expect("aligned");
        assert_eq!((top.version, top.node), (3, NodeId::new(2, 3)));
    }
}

#[cfg(test)]
mod entry_tests {
    use super::*;

    #[test]
    fn duplicates_keep_their_first_occurrence_and_nodes_follow_the_tree() {
        let hash = HashAlgo::Murmur3;
        let leaves: Vec<Digest> = [1u128, 2, 5, 3, 2, 6, 7, 8].iter().map(|&x| Digest(x)).collect();
        let at = |node: NodeId| Some(RecordEntry { version: 1, rank: 0, node });
        let e = located_entries(&leaves, hash, true, at);
        let leaf_of = |d: u128| e.iter().find(|(x, _)| x.0 == d).map(|(_, e)| e.node);
        assert_eq!(leaf_of(2), Some(NodeId::leaf(1)), "the first of the two 2s");
        // Leaf 4 repeats leaf 1: pair (4,5) and every node above it are not FIRST.
        // Level 1: (0,1) (2,3) (6,7) FIRST; level 2: (0..4) FIRST; level 3: none.
        assert_eq!(e.len(), 7 + 3 + 1, "{e:?}");
        assert!(e.windows(2).all(|w| w[0].0 < w[1].0), "sorted, unique");
        let n01 = hash.node(leaves[0], leaves[1]);
        assert_eq!(e.iter().find(|(d, _)| *d == n01).map(|(_, e)| e.node), Some(NodeId::new(1, 0)));
        assert_eq!(located_entries(&leaves, hash, false, at).len(), 7, "List keeps leaves only");
    }

    #[test]
    fn the_cpu_rebuild_inserts_what_a_baseline_checkpoint_inserts() {
        use crate::dedup::{DedupInput, DedupState};
        let data: Vec<u8> =
            (0..64 * 300).map(|i: u32| if (i / 64) % 7 == 3 { 9 } else { (i * 31 % 251) as u8 }).collect();
        let layout = Layout::new(data.len() as u64, 64).expect("layout");
        for method in [Method::List, Method::Tree] {
            let state = DedupState::new(layout, HashAlgo::Murmur3, 0);
            let out =
                method.deduplicator().deduplicate(&state, &DedupInput { data: &data, version: 4, baseline: true });
            let want = out.expect("dedup").pending_entries();
            let leaves: Vec<Digest> =
                crate::dedup::hash_leaves(&data, layout, HashAlgo::Murmur3, None).into_iter().map(|(_, d)| d).collect();
            let got = located_entries(&leaves, HashAlgo::Murmur3, method == Method::Tree, |node| {
                Some(RecordEntry { version: 4, rank: 0, node })
            });
            assert_eq!(got, want, "{method}");
        }
    }
}
