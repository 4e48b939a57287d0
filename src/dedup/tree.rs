//! Algorithm 1's inner-node passes (Tan et al., ICPP'23, §2.2).
//!
//! Stage 1 climbs the FIRST subtrees level by level: a node whose two
//! children are FIRST is FIRST, and its digest enters the record. Stage 2
//! then climbs the SHIFT subtrees: a node whose two children are SHIFT is
//! SHIFT if its digest is in the record (possibly thanks to stage 1 of this
//! very version). Every node that cannot merge with its sibling is a region
//! root. Work is proportional to the non-FIXED leaves, not to the tree.
//!
//! Beyond the paper, stage 2 also merges two whole, identical SHIFT
//! children whose parent is not in the record into a **repeat node**: the
//! parent keeps its children's source, a node smaller than itself, and
//! stands for that source repeated ([`repeat_period`]). A buffer of one
//! repeated chunk so has O(log n) roots instead of one per chunk, and a
//! repeat node's runs are exactly those its children would have given.
//! The device's stage 2 applies the same rule (`kernels/dedup.cu`), so
//! that both backends count the same roots against their bounds.

use super::{LeafLabel, Root};
use crate::format::diff_file::MAX_PERIOD;
use crate::hash::{Digest, HashAlgo};
use crate::layout::{Layout, NodeId};
use crate::record::{Record, RecordEntry};
use rayon::prelude::*;

/// A SHIFT node: its digest and where the record says its bytes are.
type ShiftNode = (Digest, RecordEntry);
/// A stage-2 pairing: the SHIFT parent, or the two children that become roots.
type Merge = Result<(u64, ShiftNode), [(u64, RecordEntry); 2]>;

/// How a parent arises from level `k`'s active nodes.
enum Parent<T> {
    /// Both children active: the parent must be hashed.
    Pair(u64, T, T),
    /// The node is the odd last one of its level: carried up unchanged.
    Carry(u64, T),
}

/// The period, in chunks, of a SHIFT root of `chunks` chunks taking its
/// bytes from `source`: the source's size where the root is a repeat node
/// (larger than its source), `None` for a plain SHIFT root.
pub fn repeat_period(chunks: u64, source: NodeId) -> Option<u64> {
    let period = 1u64 << source.level();
    (chunks > period).then_some(period)
}

/// Whether two SHIFT siblings at `level` (the left one `left`) make a repeat
/// node: identical digests and sources, both whole (`2 * left + 2` nodes
/// of the level fit `chunks`), and a source small enough to be a repeat
/// entry's period.
fn repeats(level: u32, left: u64, chunks: u64, l: ShiftNode, r: ShiftNode) -> bool {
    l == r && (left + 2) << level <= chunks && (1u64 << l.1.node.level()) <= MAX_PERIOD
}

/// Pairs the sorted active nodes of `level`; nodes whose sibling is not
/// active become roots (`on_root`).
fn pair_up<T: Copy>(layout: Layout, level: u32, nodes: &[(u64, T)], mut on_root: impl FnMut(u64, T)) -> Vec<Parent<T>> {
    let len = layout.level_len(level);
    let mut parents = Vec::with_capacity(nodes.len() / 2 + 1);
    let mut j = 0;
    while j < nodes.len() {
        let (i, t) = nodes[j];
        if i % 2 == 0 && i + 1 == len {
            parents.push(Parent::Carry(i / 2, t));
        } else if i % 2 == 0 && j + 1 < nodes.len() && nodes[j + 1].0 == i + 1 {
            parents.push(Parent::Pair(i / 2, t, nodes[j + 1].1));
            j += 1;
        } else {
            on_root(i, t);
        }
        j += 1;
    }
    parents
}

/// Runs both stages and returns the region roots (unsorted).
#[allow(clippy::too_many_arguments)]
pub(super) fn compact(
    layout: Layout,
    hash: HashAlgo,
    changed: &[(u64, Digest)],
    labels: &[LeafLabel],
    base: &Record,
    inserts: &mut Record,
    version: u32,
    rank: u32,
) -> Vec<Root> {
    let top = layout.levels() - 1;
    let chunks = layout.chunks();
    let mut roots = Vec::new();

    // Stage 1: FIRST subtrees.
    let mut nodes: Vec<(u64, Digest)> =
        changed.iter().zip(labels).filter(|(_, l)| matches!(l, LeafLabel::First)).map(|(&(i, d), _)| (i, d)).collect();
    for level in 0..top {
        if nodes.is_empty() {
            break;
        }
        let parents =
            pair_up(layout, level, &nodes, |i, _| roots.push(Root { node: NodeId::new(level, i), source: None }));
        let next: Vec<(u64, Digest, bool)> = parents
            .par_iter()
            .with_min_len(1024)
            .map(|p| match *p {
                Parent::Pair(i, l, r) => (i, hash.node(l, r), true),
                Parent::Carry(i, d) => (i, d, false),
            })
            .collect();
        let batch: Vec<(Digest, RecordEntry)> = next
            .iter()
            .filter(|x| x.2)
            .map(|&(i, d, _)| (d, RecordEntry { version, rank, node: NodeId::new(level + 1, i) }))
            .collect();
        inserts.insert_batch_collisions(&batch);
        nodes = next.into_iter().map(|(i, d, _)| (i, d)).collect();
    }
    // Whatever survives every level is the root itself (the loop only
    // breaks early once nothing is left).
    for (i, _) in nodes {
        roots.push(Root { node: NodeId::new(top, i), source: None });
    }

    // Stage 2: SHIFT subtrees, looking up the record completed by stage 1.
    let inserts: &Record = inserts;
    let mut nodes: Vec<(u64, ShiftNode)> = changed
        .iter()
        .zip(labels)
        .filter_map(|(&(i, d), l)| match l {
            LeafLabel::Shift(e) => Some((i, (d, *e))),
            LeafLabel::First => None,
        })
        .collect();
    for level in 0..top {
        if nodes.is_empty() {
            break;
        }
        let parents = pair_up(layout, level, &nodes, |i, (_, e)| {
            roots.push(Root { node: NodeId::new(level, i), source: Some(e) })
        });
        let resolved: Vec<Merge> = parents
            .par_iter()
            .with_min_len(1024)
            .map(|p| match *p {
                Parent::Carry(i, t) => Ok((i, t)),
                Parent::Pair(i, (dl, el), (dr, er)) => {
                    let d = hash.node(dl, dr);
                    match base.get(d).or_else(|| inserts.get(d)) {
                        Some(e) => Ok((i, (d, e))),
                        None if repeats(level, 2 * i, chunks, (dl, el), (dr, er)) => Ok((i, (d, el))),
                        None => Err([(2 * i, el), (2 * i + 1, er)]),
                    }
                }
            })
            .collect();
        nodes = Vec::with_capacity(resolved.len());
        for r in resolved {
            match r {
                Ok(n) => nodes.push(n),
                Err(children) => {
                    for (c, e) in children {
                        roots.push(Root { node: NodeId::new(level, c), source: Some(e) });
                    }
                }
            }
        }
    }
    for (i, (_, e)) in nodes {
        roots.push(Root { node: NodeId::new(top, i), source: Some(e) });
    }
    roots
}
