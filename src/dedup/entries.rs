//! The record entries a version adds, derived from its diff alone.
//!
//! A leaf is FIRST exactly when it lies in a FIRST run, and (Tree) an inner
//! node is FIRST exactly when all its leaves are, so the entries that
//! Algorithm 1 inserts can be recomputed from the FIRST runs and their bytes.
//! The collective GPU path uses this to move the device record's entries for
//! the regions it gives away; tests check it agrees with the CPU's inserts.

use super::Method;
use crate::diff::Diff;
use crate::hash::Digest;
use crate::layout::NodeId;
use crate::record::RecordEntry;
use rayon::prelude::*;

/// Entries `(digest, where)` that checkpoint `diff` adds to the record, sorted
/// by digest. `first_data` is the diff's FIRST data (the runs' bytes in order).
pub fn record_entries(diff: &Diff, first_data: &[u8]) -> Vec<(Digest, RecordEntry)> {
    if !diff.method.uses_record() || diff.dense {
        return Vec::new();
    }
    let Ok(version) = u32::try_from(diff.version) else { return Vec::new() };
    let layout = diff.layout;
    let cs = layout.chunk_size() as usize;
    let mut offsets = Vec::with_capacity(diff.first.len());
    let mut at = 0usize;
    for r in &diff.first {
        offsets.push(at);
        let b = layout.chunk_bytes(r.start..r.start + r.count);
        at += (b.end - b.start) as usize;
    }
    let tree = diff.method == Method::Tree;
    let entry = |node| RecordEntry { version, rank: diff.rank, node };
    let mut all: Vec<(Digest, RecordEntry)> = diff
        .first
        .par_iter()
        .zip(offsets.par_iter())
        .flat_map_iter(|(run, &off)| {
            let b = layout.chunk_bytes(run.start..run.start + run.count);
            let bytes = &first_data[off..off + (b.end - b.start) as usize];
            let mut level: Vec<Digest> = bytes.chunks(cs).map(|c| diff.hash.leaf(c)).collect();
            let mut out: Vec<(Digest, RecordEntry)> =
                level.iter().enumerate().map(|(j, d)| (*d, entry(NodeId::leaf(run.start + j as u64)))).collect();
            // Inner nodes inside [start, end): indices [lo, hi) at each level.
            let (mut lo, mut hi) = (run.start, run.start + run.count);
            let mut k = 0;
            while tree && k + 1 < layout.levels() && !level.is_empty() {
                let len_k = layout.level_len(k);
                let plo = lo.div_ceil(2);
                // A parent is inside if both children are, or it is carried and its child is.
                let phi = if hi == len_k && len_k % 2 == 1 { hi.div_ceil(2) } else { hi / 2 };
                let mut next = Vec::with_capacity(phi.saturating_sub(plo) as usize);
                for p in plo..phi {
                    let l = level[(2 * p - lo) as usize];
                    if 2 * p + 1 >= len_k {
                        next.push(l);
                    } else {
                        let d = diff.hash.node(l, level[(2 * p + 1 - lo) as usize]);
                        out.push((d, entry(NodeId::new(k + 1, p))));
                        next.push(d);
                    }
                }
                level = next;
                (lo, hi) = (plo, phi.max(plo));
                k += 1;
            }
            out
        })
        .collect();
    all.par_sort_unstable_by_key(|(d, _)| *d);
    all.dedup_by_key(|(d, _)| *d);
    all
}
