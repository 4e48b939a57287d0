//! The historical record: every digest this rank ever stored, and where.
//!
//! Each entry maps a leaf or inner-node digest to the version, rank and node
//! where those bytes were stored *physically* (as a FIRST region), so a later
//! shifted duplicate can point straight at them. The map is sharded by the top
//! bits of the digest so that batches of inserts run in parallel and still
//! give the same result for every thread count (each shard sees its items in
//! input order; the first insert of a digest wins).
//!
//! Memory: an entry is 32 bytes (16-byte digest + 16-byte [`RecordEntry`]);
//! hashbrown adds one control byte per slot and keeps the load factor at or
//! below 7/8, so a record costs 37–74 bytes per unique node. It is bounded by
//! re-baselining (`max_chain`, `max_record_entries` in
//! [`crate::store::StoreOptions`]): a baseline version clears it.

use crate::hash::Digest;
use crate::layout::NodeId;
use hashbrown::HashMap;
use rayon::prelude::*;
use std::hash::{BuildHasher, Hasher};

/// Number of shards is `1 << SHARD_BITS`.
const SHARD_BITS: u32 = 6;

/// Items a thread partitions at a time in [`Record::insert_batch_collisions`].
const PARTITION_ITEMS: usize = 1 << 16;

/// Where the bytes of one digest were first stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordEntry {
    /// Version whose diff file holds the bytes.
    pub version: u32,
    /// Rank whose diff file holds the bytes.
    pub rank: u32,
    /// The node (leaf or inner) of that version's tree.
    pub node: NodeId,
}

/// Digests are already uniformly distributed: fold them instead of rehashing.
#[derive(Clone, Copy, Default)]
pub struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(29) ^ u64::from_le_bytes(b);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 ^= (v as u64) ^ ((v >> 64) as u64).rotate_left(32);
    }
}

/// Builds [`DigestHasher`]s.
#[derive(Clone, Copy, Default)]
pub struct BuildDigestHasher;

impl BuildHasher for BuildDigestHasher {
    type Hasher = DigestHasher;
    fn build_hasher(&self) -> DigestHasher {
        DigestHasher(0)
    }
}

type Shard = HashMap<Digest, RecordEntry, BuildDigestHasher>;

/// A sharded digest → [`RecordEntry`] map.
#[derive(Clone)]
pub struct Record {
    shards: Vec<Shard>,
}

impl Default for Record {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Record").field("len", &self.len()).finish()
    }
}

impl Record {
    /// An empty record.
    pub fn new() -> Self {
        Record { shards: (0..1usize << SHARD_BITS).map(|_| Shard::with_hasher(BuildDigestHasher)).collect() }
    }

    /// Number of digests held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(HashMap::len).sum()
    }

    /// Whether the record is empty.
    pub fn is_empty(&self) -> bool {
        self.shards.iter().all(HashMap::is_empty)
    }

    /// Forgets everything (a re-baseline).
    pub fn clear(&mut self) {
        self.shards.iter_mut().for_each(HashMap::clear);
    }

    /// Approximate heap bytes in use.
    pub fn memory_bytes(&self) -> usize {
        let slot = std::mem::size_of::<(Digest, RecordEntry)>() + 1;
        self.shards.iter().map(|s| s.capacity() * slot).sum()
    }

    /// A record holding `entries`, which are sorted by digest and unique
    /// (shards are contiguous in that order and built in parallel).
    pub fn from_sorted_unique(entries: &[(Digest, RecordEntry)]) -> Self {
        let shards = (0..1usize << SHARD_BITS)
            .into_par_iter()
            .map(|s| {
                let lo = entries.partition_point(|(d, _)| d.shard(SHARD_BITS) < s);
                let hi = entries.partition_point(|(d, _)| d.shard(SHARD_BITS) <= s);
                let mut shard = Shard::with_capacity_and_hasher(hi - lo, BuildDigestHasher);
                shard.extend(entries[lo..hi].iter().copied());
                shard
            })
            .collect();
        Record { shards }
    }

    /// Where `digest` was stored, if ever.
    #[inline]
    pub fn get(&self, digest: Digest) -> Option<RecordEntry> {
        self.shards[digest.shard(SHARD_BITS)].get(&digest).copied()
    }

    /// Inserts unless present; returns the entry already there, if any.
    pub fn insert_if_absent(&mut self, digest: Digest, entry: RecordEntry) -> Option<RecordEntry> {
        match self.shards[digest.shard(SHARD_BITS)].entry(digest) {
            hashbrown::hash_map::Entry::Occupied(o) => Some(*o.get()),
            hashbrown::hash_map::Entry::Vacant(v) => {
                v.insert(entry);
                None
            }
        }
    }

    /// Inserts a batch in order, in parallel across shards. For each item
    /// returns the entry that was already there (`None` when it was inserted).
    /// The outcome is identical for any thread count.
    pub fn insert_batch(&mut self, items: &[(Digest, RecordEntry)]) -> Vec<Option<RecordEntry>> {
        let mut out = vec![None; items.len()];
        for (i, prev) in self.insert_batch_collisions(items) {
            out[i] = Some(prev);
        }
        out
    }

    /// Inserts a batch as [`Record::insert_batch`] does, returning only the
    /// items that were already present: `(index in items, entry there)`, in
    /// no particular order.
    ///
    /// The items are first split by shard (in parallel, a part of the batch
    /// at a time, input order kept), so that each shard's inserts read their
    /// items sequentially while its table stays in cache; reading them by
    /// index from the whole batch costs a cache miss each.
    pub fn insert_batch_collisions(&mut self, items: &[(Digest, RecordEntry)]) -> Vec<(usize, RecordEntry)> {
        let shards = self.shards.len();
        // Per part of the batch, per shard: (index, digest, entry), in order.
        let parts: Vec<Vec<Vec<(usize, Digest, RecordEntry)>>> = items
            .par_chunks(PARTITION_ITEMS)
            .enumerate()
            .map(|(p, part)| {
                let mut counts = vec![0usize; shards];
                part.iter().for_each(|(d, _)| counts[d.shard(SHARD_BITS)] += 1);
                let mut split: Vec<Vec<_>> = counts.into_iter().map(Vec::with_capacity).collect();
                for (k, &(d, e)) in part.iter().enumerate() {
                    split[d.shard(SHARD_BITS)].push((p * PARTITION_ITEMS + k, d, e));
                }
                split
            })
            .collect();
        let parts = &parts;
        self.shards
            .par_iter_mut()
            .enumerate()
            .flat_map_iter(|(s, shard)| {
                shard.reserve(parts.iter().map(|p| p[s].len()).sum());
                parts
                    .iter()
                    .flat_map(|p| &p[s])
                    .filter_map(|&(i, d, e)| match shard.entry(d) {
                        hashbrown::hash_map::Entry::Occupied(o) => Some((i, *o.get())),
                        hashbrown::hash_map::Entry::Vacant(v) => {
                            v.insert(e);
                            None
                        }
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Merges another record into this one (existing entries win).
    pub fn absorb(&mut self, other: Record) {
        self.shards.par_iter_mut().zip(other.shards.into_par_iter()).for_each(|(mine, theirs)| {
            mine.reserve(theirs.len());
            for (d, e) in theirs {
                mine.entry(d).or_insert(e);
            }
        });
    }

    /// Rewrites every entry with `f`, dropping those it maps to `None`
    /// (collective checkpoints move entries to the ranks that own the bytes).
    pub fn remap(&mut self, f: impl Fn(&RecordEntry) -> Option<RecordEntry> + Sync) {
        self.shards.par_iter_mut().for_each(|shard| {
            shard.retain(|_, e| match f(e) {
                Some(moved) => {
                    *e = moved;
                    true
                }
                None => false,
            });
        });
    }

    /// Every entry, sorted by digest (deterministic order for persistence).
    pub fn sorted_entries(&self) -> Vec<(Digest, RecordEntry)> {
        let mut v: Vec<(Digest, RecordEntry)> =
            self.shards.iter().flat_map(|s| s.iter().map(|(d, e)| (*d, *e))).collect();
        v.par_sort_unstable_by_key(|(d, _)| *d);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(version: u32, idx: u64) -> RecordEntry {
        RecordEntry { version, rank: 0, node: NodeId::leaf(idx) }
    }

    #[test]
    fn a_batch_over_several_parts_matches_inserting_one_by_one() {
        // More items than one partition, a third of them repeats spread
        // across parts, and some already in the record.
        let n = 3 * PARTITION_ITEMS as u64 + 17;
        let digest = |k: u64| Digest(u128::from(k).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834) ^ 0x5a5a);
        let items: Vec<(Digest, RecordEntry)> =
            (0..n).map(|i| (digest(if i % 3 == 2 { (i * 7919) % (n / 2) } else { i }), e(2, i))).collect();
        let mut batch = Record::new();
        let mut one_by_one = Record::new();
        for k in (0..n).step_by(101) {
            batch.insert_if_absent(digest(k), e(1, k));
            one_by_one.insert_if_absent(digest(k), e(1, k));
        }
        let expected: Vec<Option<RecordEntry>> =
            items.iter().map(|&(d, en)| one_by_one.insert_if_absent(d, en)).collect();
        assert!(expected.iter().filter(|p| p.is_some()).count() > (n / 8) as usize);
        assert_eq!(batch.insert_batch(&items), expected);
        assert_eq!(batch.sorted_entries(), one_by_one.sorted_entries());
    }

    #[test]
    fn batch_insert_keeps_the_first_occurrence() {
        let mut r = Record::new();
        let items: Vec<(Digest, RecordEntry)> = (0..1000u64)
            .map(|i| (Digest(u128::from(i % 300).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834)), e(1, i)))
            .collect();
        let prev = r.insert_batch(&items);
        assert_eq!(r.len(), 300);
        for (i, p) in prev.iter().enumerate() {
            if i < 300 {
                assert_eq!(*p, None);
            } else {
                assert_eq!(*p, Some(e(1, (i % 300) as u64)));
            }
        }
        assert_eq!(r.insert_if_absent(items[0].0, e(9, 9)), Some(e(1, 0)));
        let mut other = Record::new();
        other.insert_if_absent(Digest(5), e(2, 5));
        r.absorb(other);
        assert_eq!(r.get(Digest(5)), Some(e(2, 5)));
        assert_eq!(r.sorted_entries().len(), 301);
        r.remap(|e| (e.version != 2).then_some(RecordEntry { rank: 7, ..*e }));
        assert_eq!(r.get(Digest(5)), None);
        assert_eq!(r.get(items[0].0), Some(RecordEntry { rank: 7, ..e(1, 0) }));
        assert_eq!(r.len(), 300);
        r.clear();
        assert!(r.is_empty());
    }
}
