//! Reopening a store: the de-duplication state is rebuilt from the latest
//! committed version, which a restart restores anyway, instead of being
//! persisted beside the diffs.
//!
//! The latest version is restored (every byte verified, every cross-rank
//! reference checked) and de-duplicated as if it were a baseline, which
//! yields its leaf digests (the "previous" leaves) and, for List and Tree,
//! one record entry per distinct leaf and per inner node of it. Each entry
//! is then moved to where its bytes are physically stored: the restore's
//! resolution maps every chunk to a FIRST run of some version of some rank
//! (the owner's copy in a collective store). An inner node is kept only
//! when all its chunks sit contiguously in one file at an aligned node of
//! the same shape there; a leaf always is.
//!
//! What a rebuilt record cannot find: content that older versions of the
//! chain stored but the latest version no longer holds (an uninterrupted
//! run still remembers it), and inner nodes whose bytes are spread over
//! several files or shifted off node alignment (their leaves are found).
//! Both cost stored bytes, never correctness; BENCHMARKS.md measures it.

use crate::Result;
use crate::dedup::{DedupInput, DedupState};
use crate::layout::{Layout, NodeId};
use crate::record::RecordEntry;
use crate::restore::{self, Catalog, Source};
use crate::store::StoreOptions;
use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

/// A state rebuilt by [`rebuild_state`], with the time each part took.
#[derive(Debug)]
pub struct Rebuilt {
    /// The de-duplication state the next checkpoint continues from.
    pub state: DedupState,
    /// Seconds spent restoring (and verifying) the latest version.
    pub restore_seconds: f64,
    /// Seconds spent hashing and building the record after the restore.
    pub rebuild_seconds: f64,
}

/// Rebuilds the state of `rank` from its committed version `latest`.
pub fn rebuild_state(root: &Path, rank: u32, latest: u64, layout: Layout, opts: &StoreOptions) -> Result<Rebuilt> {
    let t0 = Instant::now();
    let mut catalog = Catalog::new(root);
    let (data, _stats, res) = restore::restore_in(&mut catalog, rank, latest)?;
    let t1 = Instant::now();
    let mut state = DedupState::new(layout, opts.hash, rank);
    if opts.method.uses_previous() {
        let input = DedupInput { data: &data, version: latest, baseline: true };
        let outcome = opts.method.deduplicator().deduplicate(&state, &input)?;
        state.commit(outcome.pending);
        if opts.method.uses_record() {
            let mut layouts = HashMap::new();
            for s in &res.sources {
                if let std::collections::hash_map::Entry::Vacant(v) = layouts.entry(s.rank) {
                    v.insert(catalog.store(s.rank)?.layout()?);
                }
            }
            let runs = coalesce(res.sources);
            state.record.remap(|e| locate(e, &layout, &runs, &layouts));
        }
    }
    Ok(Rebuilt { state, restore_seconds: (t1 - t0).as_secs_f64(), rebuild_seconds: t1.elapsed().as_secs_f64() })
}

/// Merges neighbouring pieces that continue each other in the same file.
fn coalesce(sources: Vec<Source>) -> Vec<Source> {
    let mut out: Vec<Source> = Vec::with_capacity(sources.len());
    for s in sources {
        match out.last_mut() {
            Some(l)
                if l.rank == s.rank
                    && l.version == s.version
                    && l.dst + l.count == s.dst
                    && l.src + l.count == s.src =>
            {
                l.count += s.count;
            }
            _ => out.push(s),
        }
    }
    out
}

/// Where the bytes of node `e.node` of the latest version are stored, as a
/// record entry (a node of the same shape in the holding file), if they are
/// contiguous and aligned there.
fn locate(e: &RecordEntry, layout: &Layout, runs: &[Source], layouts: &HashMap<u32, Layout>) -> Option<RecordEntry> {
    let c = layout.node_chunks(e.node);
    let s = runs.get(runs.partition_point(|s| s.dst + s.count <= c.start))?;
    if s.dst > c.start || c.end > s.dst + s.count {
        return None;
    }
    let first = s.src + (c.start - s.dst);
    let k = e.node.level();
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
        let runs = coalesce(vec![src(0, 4, 1, 0), src(4, 4, 1, 4), src(8, 4, 2, 9), src(12, 4, 3, 12)]);
        assert_eq!(runs.len(), 3, "the first two pieces continue each other");
        let at = |node| RecordEntry { version: 9, rank: 0, node };
        let whole = locate(&at(NodeId::new(3, 0)), &layout, &runs, &layouts).expect("aligned, one file");
        assert_eq!((whole.version, whole.node), (1, NodeId::new(3, 0)));
        assert_eq!(locate(&at(NodeId::new(2, 2)), &layout, &runs, &layouts), None, "shifted off alignment");
        let leaf = locate(&at(NodeId::leaf(9)), &layout, &runs, &layouts).expect("leaves always");
        assert_eq!((leaf.version, leaf.node), (2, NodeId::leaf(10)));
        assert_eq!(locate(&at(NodeId::new(4, 0)), &layout, &runs, &layouts), None, "spans three files");
        let top = locate(&at(NodeId::new(2, 3)), &layout, &runs, &layouts).expect("aligned");
        assert_eq!((top.version, top.node), (3, NodeId::new(2, 3)));
    }
}
