//! The load-balancing top-K merger of Nicolae (IPDPS'13, Algorithm 2) as a
//! pure function over sets of [`HashFreq`] tuples, and the wire form those
//! sets travel in through the MPI reduction (a count word, 5 words an entry).
//!
//! Differences from the paper, all asked for by the design: load is counted
//! in bytes (regions differ in size, pages did not), and the truncation keeps
//! the entries that save the most bytes, `(count − 1) × bytes`, not the most
//! frequent ones. Ties are broken by digest, so a merge is a deterministic
//! function of its two inputs; with the reduction order fixed (a binomial
//! tree to rank 0, lower ranks on the left, then a broadcast) every rank
//! gets the same owners.

use crate::hash::Digest;
use crate::layout::NodeId;

/// One region some ranks would store: its digest, its size, how many ranks
/// hold it, the rank chosen (so far) to store it, and where that rank holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashFreq {
    /// Digest of the region (a FIRST Merkle node).
    pub digest: Digest,
    /// Bytes of the region.
    pub bytes: u64,
    /// The region's node in the owner's tree.
    pub node: NodeId,
    /// Ranks that hold it.
    pub count: u32,
    /// The rank that will store it.
    pub owner: u32,
}

impl HashFreq {
    /// Bytes saved if every holder but the owner stores a reference.
    pub fn saved(&self) -> u64 {
        u64::from(self.count.saturating_sub(1)) * self.bytes
    }
}

/// Runs a merge's shared regions are given away in, at most about: a run
/// goes to one owner whole (see [`merge`]), so the owners' loads differ by
/// at most 1/64 of the shared bytes (one region where regions are larger).
pub const LOCALITY_RUNS: u64 = 64;

/// Default threshold K (2^17 entries).
pub const DEFAULT_THRESHOLD: usize = 1 << 17;

/// Bytes load per rank, indexed by rank.
#[derive(Default)]
struct Loads(Vec<u64>);

impl Loads {
    fn get(&self, rank: u32) -> u64 {
        self.0.get(rank as usize).copied().unwrap_or(0)
    }
    fn add(&mut self, rank: u32, bytes: u64) {
        let i = rank as usize;
        if self.0.len() <= i {
            self.0.resize(i + 1, 0);
        }
        self.0[i] += bytes;
    }
}

/// Merges two tuple sets (each sorted by digest, digests distinct) into at
/// most `threshold` entries: entries in one set only keep their owner and
/// count as unavoidable load first; shared entries then go, in position
/// order (the left holder's node), in runs of at most 1/[`LOCALITY_RUNS`] of
/// the shared bytes, each run to the less loaded of its holders (load in
/// bytes, ties to the lower rank); finally the entries saving the most bytes
/// are kept. The result is sorted by digest. Linear in the inputs plus a
/// sort of the shared entries (and a selection when more sharing entries
/// than `threshold` exist).
pub fn merge(left: &[HashFreq], right: &[HashFreq], threshold: usize) -> Vec<HashFreq> {
    let mut m = Merger::default();
    m.merge_sets(left, right, threshold);
    std::mem::take(&mut m.out)
}

/// Reusable buffers for repeated merges (one per level of the reduction
/// tree, one reduction per checkpoint): large buffers allocated afresh cost
/// more in page faults than the merge itself.
#[derive(Default)]
pub struct Merger {
    out: Vec<HashFreq>,
    shared: Vec<(usize, HashFreq)>,
    load: Loads,
}

impl Merger {
    /// Exchanges the last merge's result with `set` (both buffers stay
    /// allocated for the next merge).
    pub fn swap_out(&mut self, set: &mut Vec<HashFreq>) {
        std::mem::swap(&mut self.out, set);
    }

    /// [`merge`] into the internal output buffer, returned.
    pub fn merge_sets(&mut self, left: &[HashFreq], right: &[HashFreq], threshold: usize) -> &[HashFreq] {
        let (out, shared, load) = (&mut self.out, &mut self.shared, &mut self.load);
        out.clear();
        shared.clear();
        load.0.clear();
        let (mut i, mut j) = (0, 0);
        while i < left.len() || j < right.len() {
            let take_left = j == right.len() || (i < left.len() && left[i].digest < right[j].digest);
            let take_right = i == left.len() || (j < right.len() && right[j].digest < left[i].digest);
            if take_left {
                load.add(left[i].owner, left[i].bytes);
                out.push(left[i]);
                i += 1;
            } else if take_right {
                load.add(right[j].owner, right[j].bytes);
                out.push(right[j]);
                j += 1;
            } else {
                shared.push((out.len(), right[j]));
                out.push(left[i]);
                i += 1;
                j += 1;
            }
        }
        // In position order (the left holder's node; digest order among
        // equal positions), in runs: a region goes to the owner of the run
        // before it while that run holds fewer than `run_cap` bytes and the
        // owner holds the region; otherwise to the less loaded holder. A
        // shared base stays in long runs per owner, so a restart reads each
        // owner's file in a few long pieces (one region in two, in digest
        // order, would alternate between the files), and the loads differ
        // by at most one run.
        let shared_bytes: u64 = shared.iter().map(|s| s.1.bytes).sum();
        let run_cap = (shared_bytes / LOCALITY_RUNS).max(1);
        shared.sort_unstable_by_key(|&(slot, r)| (out[slot].node.first_chunk(), r.digest));
        let mut run: Option<(u32, u64)> = None;
        for &(slot, r) in shared.iter() {
            let l = out[slot];
            let winner = match run {
                Some((owner, bytes)) if bytes < run_cap && owner == l.owner => l,
                Some((owner, bytes)) if bytes < run_cap && owner == r.owner => r,
                _ if (load.get(l.owner), l.owner) <= (load.get(r.owner), r.owner) => l,
                _ => r,
            };
            run = match run {
                Some((owner, bytes)) if owner == winner.owner && bytes < run_cap => Some((owner, bytes + winner.bytes)),
                _ => Some((winner.owner, winner.bytes)),
            };
            load.add(winner.owner, winner.bytes);
            out[slot] = HashFreq { count: l.count + r.count, ..winner };
        }
        truncate_to(out, threshold);
        out
    }
}

/// Keeps the `threshold` entries saving the most bytes (ties: lower digest)
/// of a set sorted by digest, keeping it sorted. Entries that save nothing
/// (held by one rank) all tie, so when the savers fit they are kept with the
/// lowest-digest others in one linear pass; only a surplus of savers needs a
/// selection.
fn truncate_to(set: &mut Vec<HashFreq>, threshold: usize) {
    if set.len() <= threshold {
        return;
    }
    let savers = set.iter().filter(|e| e.saved() > 0).count();
    if savers >= threshold {
        set.retain(|e| e.saved() > 0);
        if threshold > 0 {
            let by_saving = |a: &HashFreq, b: &HashFreq| b.saved().cmp(&a.saved()).then(a.digest.cmp(&b.digest));
            set.select_nth_unstable_by(threshold - 1, by_saving);
        }
        set.truncate(threshold);
        set.sort_unstable_by_key(|e| e.digest);
    } else {
        let mut others = threshold - savers;
        set.retain(|e| {
            let keep = e.saved() > 0 || others > 0;
            if e.saved() == 0 && others > 0 {
                others -= 1;
            }
            keep
        });
    }
}

/// A rank's initial tuple set: one entry per distinct region digest it would
/// store, owned by itself, sorted by digest. Beyond `threshold` regions the
/// largest are kept (a region held by several ranks saves the more the
/// larger it is; the rest are stored locally).
pub fn local_set(
    rank: u32,
    regions: impl IntoIterator<Item = (Digest, u64, NodeId)>,
    threshold: usize,
) -> Vec<HashFreq> {
    let mut v: Vec<HashFreq> = regions
        .into_iter()
        .map(|(digest, bytes, node)| HashFreq { digest, bytes, node, count: 1, owner: rank })
        .collect();
    v.sort_unstable_by_key(|e| e.digest);
    v.dedup_by_key(|e| e.digest);
    if v.len() > threshold {
        v.sort_unstable_by(|a, b| b.bytes.cmp(&a.bytes).then(a.digest.cmp(&b.digest)));
        v.truncate(threshold);
        v.sort_unstable_by_key(|e| e.digest);
    }
    v
}

/// Reduces the ranks' sets in a fixed binary tree, as a reference for what
/// the MPI reduction computes (tests, benchmarks without MPI).
pub fn reduce_all(sets: &[Vec<HashFreq>], threshold: usize) -> Vec<HashFreq> {
    let mut level: Vec<Vec<HashFreq>> = sets.to_vec();
    while level.len() > 1 {
        level = level
            .chunks(2)
            .map(|pair| match pair {
                [a, b] => merge(a, b, threshold),
                [a] => a.clone(),
                _ => Vec::new(),
            })
            .collect();
    }
    level.pop().unwrap_or_default()
}

/// u64 words per wire entry: digest (2), bytes, node, count << 32 | owner.
pub const WIRE_ENTRY_WORDS: usize = 5;

/// The largest threshold K: a message of a full set (`1 + 5K` words) has
/// a count of words that must fit in an `i32`.
pub const MAX_THRESHOLD: usize = (i32::MAX as usize - 1) / WIRE_ENTRY_WORDS;

/// Words of a wire buffer holding up to `threshold` entries (a count word
/// first); saturates for thresholds beyond any buffer.
pub fn wire_words(threshold: usize) -> usize {
    threshold.saturating_mul(WIRE_ENTRY_WORDS).saturating_add(1)
}

/// Writes `set` into `wire` (of [`wire_words`] capacity for at least `set.len()`).
/// Returns `false` (and writes nothing) if it does not fit.
pub fn encode_wire(set: &[HashFreq], wire: &mut [u64]) -> bool {
    if wire.len() < wire_words(set.len()) {
        return false;
    }
    wire[0] = set.len() as u64;
    for (e, w) in set.iter().zip(wire[1..].chunks_exact_mut(WIRE_ENTRY_WORDS)) {
        w[0] = e.digest.0 as u64;
        w[1] = (e.digest.0 >> 64) as u64;
        w[2] = e.bytes;
        w[3] = e.node.raw();
        w[4] = (u64::from(e.count) << 32) | u64::from(e.owner);
    }
    true
}

/// Reads a set written by [`encode_wire`]; `None` if the count word exceeds
/// the buffer.
pub fn decode_wire(wire: &[u64]) -> Option<Vec<HashFreq>> {
    let mut out = Vec::new();
    decode_wire_into(wire, &mut out).then_some(out)
}

/// [`decode_wire`] into a reused vector; `false` if malformed.
pub fn decode_wire_into(wire: &[u64], out: &mut Vec<HashFreq>) -> bool {
    out.clear();
    let Some(n) = wire.first().and_then(|&n| usize::try_from(n).ok()) else { return false };
    let Some(body) = n.checked_mul(WIRE_ENTRY_WORDS).and_then(|w| wire.get(1..1 + w)) else { return false };
    out.extend(body.chunks_exact(WIRE_ENTRY_WORDS).map(|w| HashFreq {
        digest: Digest(u128::from(w[0]) | (u128::from(w[1]) << 64)),
        bytes: w[2],
        node: NodeId::from_raw(w[3]),
        count: (w[4] >> 32) as u32,
        owner: w[4] as u32,
    }));
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(x: u128) -> Digest {
        Digest(x.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834))
    }

    #[test]
    fn replicated_regions_are_stored_once_and_spread_evenly() {
        // Every one of 8 ranks holds the same 64 regions of 4 KiB.
        let sets: Vec<Vec<HashFreq>> = (0..8)
            .map(|r| local_set(r, (0..64).map(|i| (d(i), 4096, NodeId::new(5, i as u64))), DEFAULT_THRESHOLD))
            .collect();
        let top = reduce_all(&sets, DEFAULT_THRESHOLD);
        assert_eq!(top.len(), 64);
        assert!(top.iter().all(|e| e.count == 8));
        let mut per_rank = [0u64; 8];
        for e in &top {
            per_rank[e.owner as usize] += e.bytes;
        }
        let max = *per_rank.iter().max().unwrap() as f64;
        let mean = per_rank.iter().sum::<u64>() as f64 / 8.0;
        assert!(max / mean <= 1.05, "per-rank bytes {per_rank:?}");
    }

    #[test]
    fn a_shared_base_goes_to_owners_in_long_runs_of_positions() {
        // 2 and 8 ranks hold the same 4096 regions at the same positions
        // (digests in no relation to positions): the owners, read in position
        // order, change at most about LOCALITY_RUNS times a merge level, and
        // the loads stay within a few percent.
        for ranks in [2u32, 8] {
            let sets: Vec<Vec<HashFreq>> = (0..ranks)
                .map(|r| local_set(r, (0..4096).map(|i| (d(i), 4096, NodeId::new(2, i as u64))), DEFAULT_THRESHOLD))
                .collect();
            let mut top = reduce_all(&sets, DEFAULT_THRESHOLD);
            top.sort_by_key(|e| e.node.first_chunk());
            let switches = top.windows(2).filter(|w| w[0].owner != w[1].owner).count() as u64;
            let levels = u64::from(ranks.ilog2());
            assert!(switches <= levels * (LOCALITY_RUNS + 2), "{ranks} ranks: {switches} owner changes");
            let mut per_rank = vec![0u64; ranks as usize];
            for e in &top {
                per_rank[e.owner as usize] += e.bytes;
            }
            let max = *per_rank.iter().max().unwrap() as f64;
            let mean = per_rank.iter().sum::<u64>() as f64 / f64::from(ranks);
            assert!(max / mean <= 1.05, "{ranks} ranks: per-rank bytes {per_rank:?}");
        }
    }

    #[test]
    fn disjoint_sets_keep_their_owners_and_truncation_keeps_the_biggest_savings() {
        let n = NodeId::leaf;
        let a = local_set(0, [(d(1), 100, n(0)), (d(2), 100, n(1))], 16);
        let b = local_set(1, [(d(3), 100, n(0)), (d(2), 100, n(7))], 16);
        let c = local_set(2, [(d(3), 100, n(0)), (d(4), 5000, n(1))], 16);
        let top = reduce_all(&[a.clone(), b.clone(), c.clone()], 16);
        let get = |x| top.iter().find(|e| e.digest == d(x)).copied().unwrap();
        assert_eq!((get(1).count, get(1).owner), (1, 0));
        assert_eq!(get(2).count, 2);
        assert_eq!(get(3).count, 2);
        assert_eq!((get(4).count, get(4).owner), (1, 2));
        // K = 2: every partial result holds at most 2 entries, and the entry
        // shared by ranks 0 and 1 (the only saving when they merge) survives.
        // Like the paper's, the top-K is approximate: rank 1's copy of d(3)
        // may be cut before it meets rank 2's.
        let top2 = reduce_all(&[a, b, c], 2);
        assert_eq!(top2.len(), 2);
        assert!(top2.iter().any(|e| e.digest == d(2) && e.count == 2));
    }

    #[test]
    fn merging_is_deterministic_and_counts_add_up() {
        let sets: Vec<Vec<HashFreq>> = (0..5u32)
            .map(|r| {
                let regions = (0..40u128)
                    .filter(|i| (i + u128::from(r)) % 3 != 0)
                    .map(|i| (d(i), 64 + i as u64, NodeId::leaf(i as u64 + u64::from(r))));
                local_set(r, regions, 1000)
            })
            .collect();
        let a = reduce_all(&sets, 1000);
        let b = reduce_all(&sets, 1000);
        assert_eq!(a, b);
        for e in &a {
            let holders = sets.iter().filter(|s| s.iter().any(|x| x.digest == e.digest)).count() as u32;
            assert_eq!(e.count, holders);
            let mine = sets[e.owner as usize].iter().find(|x| x.digest == e.digest);
            assert_eq!(mine.map(|x| x.node), Some(e.node), "the owner must hold the region, at the node named");
        }
    }

    /// The merge written the obvious way (hash maps, sorting), as an oracle.
    fn reference_merge(left: &[HashFreq], right: &[HashFreq], threshold: usize) -> Vec<HashFreq> {
        use std::collections::HashMap;
        let in_right: HashMap<Digest, &HashFreq> = right.iter().map(|e| (e.digest, e)).collect();
        let in_left: HashMap<Digest, &HashFreq> = left.iter().map(|e| (e.digest, e)).collect();
        let mut load: HashMap<u32, u64> = HashMap::new();
        let mut result = Vec::new();
        for (mine, other) in [(left, &in_right), (right, &in_left)] {
            for e in mine.iter().filter(|e| !other.contains_key(&e.digest)) {
                *load.entry(e.owner).or_default() += e.bytes;
                result.push(*e);
            }
        }
        let mut shared: Vec<(&HashFreq, &HashFreq)> =
            left.iter().filter_map(|l| in_right.get(&l.digest).map(|r| (l, *r))).collect();
        shared.sort_by_key(|(l, _)| (l.node.first_chunk(), l.digest));
        let cap = (shared.iter().map(|(l, _)| l.bytes).sum::<u64>() / LOCALITY_RUNS).max(1);
        let (mut run_owner, mut run_bytes) = (u32::MAX, 0u64);
        for (l, r) in shared {
            let continues = run_bytes < cap && (run_owner == l.owner || run_owner == r.owner);
            let w = if continues {
                if run_owner == l.owner { l } else { r }
            } else {
                let (ll, rl) = (load.get(&l.owner).copied().unwrap_or(0), load.get(&r.owner).copied().unwrap_or(0));
                if (ll, l.owner) <= (rl, r.owner) { l } else { r }
            };
            if continues {
                run_bytes += w.bytes;
            } else {
                (run_owner, run_bytes) = (w.owner, w.bytes);
            }
            *load.entry(w.owner).or_default() += w.bytes;
            result.push(HashFreq { count: l.count + r.count, ..*w });
        }
        result.sort_by(|a, b| b.saved().cmp(&a.saved()).then(a.digest.cmp(&b.digest)));
        result.truncate(threshold);
        result.sort_by_key(|e| e.digest);
        result
    }

    proptest::proptest! {
        #[test]
        fn merge_matches_the_reference(
            a in proptest::collection::vec((0u128..60, 1u64..5000), 0..50),
            b in proptest::collection::vec((0u128..60, 1u64..5000), 0..50),
            k in 1usize..80,
        ) {
            // The same digest has the same size on every rank.
            let size = |x: u128| 1 + (x as u64 * 977) % 5000;
            let left = local_set(3, a.iter().map(|&(x, _)| (d(x), size(x), NodeId::leaf(x as u64))), 1000);
            let right = local_set(1, b.iter().map(|&(x, _)| (d(x), size(x), NodeId::leaf(2 * x as u64))), 1000);
            let got = merge(&left, &right, k);
            proptest::prop_assert_eq!(&got, &reference_merge(&left, &right, k));
            let mut wire = vec![0u64; wire_words(k)];
            proptest::prop_assert!(encode_wire(&got, &mut wire));
            proptest::prop_assert_eq!(decode_wire(&wire), Some(got));
        }
    }

    #[test]
    fn local_sets_beyond_the_threshold_keep_the_largest_regions() {
        let set = local_set(0, (0..10u128).map(|i| (d(i), 100 * i as u64, NodeId::leaf(0))), 3);
        let mut sizes: Vec<u64> = set.iter().map(|e| e.bytes).collect();
        sizes.sort_unstable();
        assert_eq!(sizes, [700, 800, 900]);
        assert!(set.windows(2).all(|w| w[0].digest < w[1].digest));
    }

    #[test]
    fn wire_rejects_overflowing_counts() {
        let mut wire = vec![0u64; wire_words(2)];
        assert!(!encode_wire(
            &[HashFreq { digest: d(1), bytes: 1, node: NodeId::leaf(0), count: 1, owner: 0 }; 3],
            &mut wire
        ));
        wire[0] = 5;
        assert_eq!(decode_wire(&wire), None);
    }
}
