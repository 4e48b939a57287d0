//! The leaf pass shared by Basic, List and Tree: hash every chunk, drop the
//! FIXED ones (unchanged since the previous version), and label the others
//! FIRST or SHIFT against the record with the lowest-index-wins rule.

use crate::hash::{Digest, HashAlgo};
use crate::layout::{Layout, NodeId};
use crate::record::{Record, RecordEntry};
use rayon::prelude::*;

/// Leaves per rayon task: large enough to amortise scheduling.
const LEAVES_PER_TASK: usize = 4096;

/// Hashes every chunk of `data`; returns `(index, digest)` of each chunk
/// whose digest differs from `previous` (all chunks when there is none), in
/// index order.
pub fn hash_leaves(data: &[u8], layout: Layout, hash: HashAlgo, previous: Option<&[Digest]>) -> Vec<(u64, Digest)> {
    let cs = layout.chunk_size() as usize;
    let block = cs * LEAVES_PER_TASK;
    let parts: Vec<Vec<(u64, Digest)>> = data
        .par_chunks(block)
        .enumerate()
        .map(|(b, bytes)| {
            let base = (b * LEAVES_PER_TASK) as u64;
            let mut out = Vec::new();
            for (j, chunk) in bytes.chunks(cs).enumerate() {
                let i = base + j as u64;
                let d = hash.leaf(chunk);
                let fixed = previous.is_some_and(|p| p[i as usize] == d);
                if !fixed {
                    out.push((i, d));
                }
            }
            out
        })
        .collect();
    let total = parts.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(total);
    for p in parts {
        out.extend(p);
    }
    out
}

/// Label of a non-FIXED leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeafLabel {
    /// First occurrence: stored in this version.
    First,
    /// Shifted duplicate of bytes stored at this entry.
    Shift(RecordEntry),
}

/// Labels the `changed` leaves: SHIFT when the record (or a lower-index leaf
/// of this version) already holds the digest, FIRST otherwise. FIRST leaves
/// are added to `inserts`.
pub fn classify_leaves(
    changed: &[(u64, Digest)],
    record: &Record,
    inserts: &mut Record,
    version: u32,
    rank: u32,
) -> Vec<LeafLabel> {
    let mut labels: Vec<Option<LeafLabel>> =
        changed.par_iter().with_min_len(1024).map(|&(_, d)| record.get(d).map(LeafLabel::Shift)).collect();
    let misses: Vec<usize> = labels.iter().enumerate().filter(|(_, l)| l.is_none()).map(|(k, _)| k).collect();
    let batch: Vec<(Digest, RecordEntry)> = misses
        .iter()
        .map(|&k| {
            let (i, d) = changed[k];
            (d, RecordEntry { version, rank, node: NodeId::leaf(i) })
        })
        .collect();
    // A miss already inserted by a lower-index leaf of this batch is SHIFT;
    // every other miss is FIRST.
    for (j, prev) in inserts.insert_batch_collisions(&batch) {
        labels[misses[j]] = Some(LeafLabel::Shift(prev));
    }
    labels.into_iter().map(|l| l.unwrap_or(LeafLabel::First)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_chunks_are_dropped_and_duplicates_point_at_the_lowest_index() {
        let lay = Layout::new(32 * 6, 32).unwrap();
        let mut data = vec![0u8; 32 * 6];
        for (i, c) in data.chunks_mut(32).enumerate() {
            c.fill(i as u8 % 3); // chunks 0,3 equal; 1,4 equal; 2,5 equal
        }
        let all = hash_leaves(&data, lay, HashAlgo::Murmur3, None);
        assert_eq!(all.len(), 6);
        let mut inserts = Record::new();
        let labels = classify_leaves(&all, &Record::new(), &mut inserts, 1, 0);
        assert_eq!(&labels[..3], &[LeafLabel::First; 3]);
        assert_eq!(labels[3], LeafLabel::Shift(RecordEntry { version: 1, rank: 0, node: NodeId::leaf(0) }));
        assert_eq!(labels[5], LeafLabel::Shift(RecordEntry { version: 1, rank: 0, node: NodeId::leaf(2) }));
        let prev: Vec<Digest> = all.iter().map(|x| x.1).collect();
        data[33] = 9;
        let changed = hash_leaves(&data, lay, HashAlgo::Murmur3, Some(&prev));
        assert_eq!(changed.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1]);
    }
}
