//! De-duplication methods (the CPU engine): Full, Basic, List and Tree,
//! behind one trait so that benchmarks and tests run all four the same way.
//!
//! A method reads the protected bytes and the rank's [`DedupState`] and
//! returns an [`Outcome`]: the [`Diff`] to write and the [`Pending`] state
//! changes that become real only after the diff is durable
//! ([`DedupState::commit`]). A failed write therefore leaves the state as it
//! was (but a version that restarted a full record, [`limits`]: its backend
//! forgets the record, as the GPU's must), and the next checkpoint
//! de-duplicates against committed data only.

mod entries;
mod leaves;
pub mod limits;
mod tree;

use crate::diff::{Diff, FirstRun, RegionEncoding, ShiftRun};
use crate::error::{Error, Result};
use crate::hash::{Digest, HashAlgo};
use crate::layout::{Layout, NodeId};
use crate::record::{Record, RecordEntry};

pub use crate::method::Method;
pub use entries::record_entries;
pub use leaves::{LeafLabel, classify_leaves, hash_leaves};
pub use limits::{BoundsHit, Limits};

/// The implementation of each [`Method`].
impl Method {
    /// The implementation.
    pub fn deduplicator(self) -> &'static dyn Deduplicate {
        match self {
            Method::Full => &FullMethod,
            Method::Basic => &BasicMethod,
            Method::List => &ListMethod,
            Method::Tree => &TreeMethod,
        }
    }
}

/// What a rank remembers between versions.
#[derive(Debug, Clone)]
pub struct DedupState {
    /// Chunking of the protected buffer.
    pub layout: Layout,
    /// Digest algorithm.
    pub hash: HashAlgo,
    /// This rank.
    pub rank: u32,
    /// Leaf digests of the last committed version (`None` before the first).
    pub previous: Option<Vec<Digest>>,
    /// Every digest stored since the last baseline (or record restart).
    pub record: Record,
    /// What the limits cost the committed versions so far.
    pub bounds_hit: BoundsHit,
    /// Bounds on the record, the regions and the file of a version
    /// ([`limits`]; unlimited unless set).
    pub limits: Limits,
}

/// State changes of one checkpoint, applied by [`DedupState::commit`].
#[derive(Debug)]
pub struct Pending {
    /// The record restarts with this version's entries (a baseline, or a
    /// version that would have overfilled it).
    replace_record: bool,
    /// What the state's [`Limits`] cost this version (each count 0 or 1).
    bounds: BoundsHit,
    leaves: LeafUpdate,
    inserts: Record,
}

#[derive(Debug)]
enum LeafUpdate {
    Keep,
    Replace(Vec<Digest>),
    Patch(Vec<(u64, Digest)>),
}

/// A diff and the state changes it implies.
#[derive(Debug)]
pub struct Outcome {
    /// What to write.
    pub diff: Diff,
    /// What to remember once it is written.
    pub pending: Pending,
}

impl Pending {
    /// What the state's limits cost this version.
    pub fn bounds(&self) -> BoundsHit {
        self.bounds
    }

    /// Number of new record entries this checkpoint adds.
    pub fn new_entries(&self) -> usize {
        self.inserts.len()
    }

    /// The record entries this checkpoint adds, sorted by digest.
    pub fn entries(&self) -> Vec<(Digest, RecordEntry)> {
        self.inserts.sorted_entries()
    }

    /// Rewrites (or drops, on `None`) the record entries this checkpoint adds.
    pub fn remap_entries(&mut self, f: impl Fn(&RecordEntry) -> Option<RecordEntry> + Sync) {
        self.inserts.remap(f);
    }
}

/// The record entries of a committed version, held back from the record
/// until its collective step has said which of its regions other ranks
/// store ([`DedupState::commit_holding_inserts`]).
#[derive(Debug)]
pub struct HeldInserts {
    inserts: Record,
}

impl HeldInserts {
    /// Rewrites (or drops, on `None`) the held entries.
    pub fn remap(&mut self, f: impl Fn(&RecordEntry) -> Option<RecordEntry> + Sync) {
        self.inserts.remap(f);
    }

    /// Number of entries held.
    pub fn len(&self) -> usize {
        self.inserts.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.inserts.is_empty()
    }

    /// Adds the held entries to `record` (an entry already there stays:
    /// either names the same bytes).
    pub fn absorb_into(self, record: &mut Record) {
        if record.is_empty() {
            *record = self.inserts;
        } else {
            record.absorb(self.inserts);
        }
    }
}

impl Outcome {
    /// The record entries this checkpoint adds, sorted by digest.
    pub fn pending_entries(&self) -> Vec<(Digest, RecordEntry)> {
        self.pending.inserts.sorted_entries()
    }
}

impl DedupState {
    /// A fresh state (no history).
    pub fn new(layout: Layout, hash: HashAlgo, rank: u32) -> Self {
        DedupState {
            layout,
            hash,
            rank,
            previous: None,
            record: Record::new(),
            bounds_hit: BoundsHit::default(),
            limits: Limits::UNLIMITED,
        }
    }

    /// This state with `limits` (the GPU's budget, for byte-identical files).
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Applies a written checkpoint's changes.
    pub fn commit(&mut self, pending: Pending) {
        let held = self.commit_holding_inserts(pending);
        self.absorb(held);
    }

    /// Applies a checkpoint's changes but its record entries, which come
    /// back to be moved (the collective step gives regions away after the
    /// version is committed) and added by [`DedupState::absorb`] before the
    /// next de-duplication. A version restarting the record empties it now.
    pub fn commit_holding_inserts(&mut self, pending: Pending) -> HeldInserts {
        self.bounds_hit.record_restarts += pending.bounds.record_restarts;
        self.bounds_hit.stored_whole += pending.bounds.stored_whole;
        if pending.replace_record {
            self.record.clear();
        }
        self.commit_leaves(pending.leaves);
        HeldInserts { inserts: pending.inserts }
    }

    /// Adds record entries held back by [`DedupState::commit_holding_inserts`]
    /// (an entry already there stays: either names the same bytes).
    pub fn absorb(&mut self, held: HeldInserts) {
        held.absorb_into(&mut self.record);
    }

    fn commit_leaves(&mut self, leaves: LeafUpdate) {
        match leaves {
            LeafUpdate::Keep => {}
            LeafUpdate::Replace(v) => self.previous = Some(v),
            LeafUpdate::Patch(changes) => {
                if let Some(prev) = self.previous.as_mut() {
                    for (i, d) in changes {
                        prev[i as usize] = d;
                    }
                }
            }
        }
    }
}

/// Input of one de-duplication.
pub struct DedupInput<'a> {
    /// The protected bytes (exactly `state.layout.data_len()` long).
    pub data: &'a [u8],
    /// The version being taken.
    pub version: u64,
    /// Ignore history: reference nothing older than this version.
    pub baseline: bool,
}

/// One checkpointing method.
pub trait Deduplicate: Sync {
    /// Computes the diff of `input` against `state` without changing `state`.
    fn deduplicate(&self, state: &DedupState, input: &DedupInput<'_>) -> Result<Outcome>;
}

/// Checks the input length and the version range; returns the version as the record stores it.
fn check_input(state: &DedupState, input: &DedupInput<'_>) -> Result<u32> {
    if input.data.len() as u64 != state.layout.data_len() {
        return Err(Error::size_mismatch(
            "the buffer to checkpoint (the store's data length)",
            state.layout.data_len(),
            input.data.len() as u64,
        ));
    }
    u32::try_from(input.version).map_err(|_| {
        Error::InvalidOption(format!("version {} exceeds the supported maximum {}", input.version, u32::MAX))
    })
}

/// Whether a version with `changed` of `chunks` chunks changed since the
/// previous one is stored densely: at least 15/16 of them changed. De-dup
/// would then save little and cost most (the paper's "deactivate incremental
/// checkpointing"), so the version is stored as one FIRST run, becomes a
/// baseline, and the record restarts empty. Shared by the CPU and GPU backends.
pub fn is_dense(changed: u64, chunks: u64) -> bool {
    changed.saturating_mul(16) >= chunks.saturating_mul(15)
}

/// The dense form of a version (see [`is_dense`]; also a version a bound
/// stores whole): one FIRST run, a baseline, the record restarts empty.
fn dense_outcome(
    state: &DedupState,
    input: &DedupInput<'_>,
    method: Method,
    had_previous: bool,
    changed: Vec<(u64, Digest)>,
) -> Outcome {
    let mut diff = empty_diff(state, input, method, RegionEncoding::Table);
    diff.baseline = true;
    diff.dense = true;
    diff.first.push(FirstRun { start: 0, count: state.layout.chunks() });
    let leaves = leaf_update(had_previous, changed);
    Outcome {
        diff,
        pending: Pending { replace_record: true, bounds: BoundsHit::default(), leaves, inserts: Record::new() },
    }
}

/// A labelled version: its diff, the record entries it adds, its regions
/// before coalescing, and the SHIFT entries of its file as a device writes
/// it (every coalesced run of plain roots an entry, and every repeat node;
/// before the encoder folds repeats: `format::diff_file::device_file_len`).
struct Labelled {
    diff: Diff,
    inserts: Record,
    roots: u64,
    device_shift_entries: u64,
}

/// Entries of `base` merged with `inserts`.
fn merged_len(base: &Record, inserts: &Record) -> u64 {
    let new = if base.is_empty() {
        inserts.len()
    } else {
        inserts.sorted_entries().iter().filter(|(d, _)| base.get(*d).is_none()).count()
    };
    (base.len() + new) as u64
}

/// Labels a version against the record (`label(base)`) within the
/// state's [`Limits`]: a record that would overfill restarts (the version
/// is labelled again against nothing but itself); a version still over a
/// bound is stored whole. The GPU pipeline applies the same rule.
fn bounded(
    state: &DedupState,
    input: &DedupInput<'_>,
    method: Method,
    stage: LeafStage<'_>,
    label: impl Fn(&[(u64, Digest)], &Record) -> Labelled,
) -> Outcome {
    let LeafStage { had_previous, changed, base } = stage;
    let limits = state.limits;
    let mut bounds = BoundsHit::default();
    let mut replace_record = input.baseline;
    let mut labelled = label(&changed, base);
    if !base.is_empty() && limits.record_overflows(merged_len(base, &labelled.inserts)) {
        labelled = label(&changed, &Record::new());
        replace_record = true;
        bounds.record_restarts = 1;
    }
    let Labelled { diff, inserts, roots, device_shift_entries } = labelled;
    if limits.record_overflows(inserts.len() as u64)
        || limits.must_store_whole(roots, crate::format::diff_file::device_file_len(&diff, device_shift_entries))
    {
        let mut whole = dense_outcome(state, input, method, had_previous, changed);
        whole.pending.bounds = BoundsHit { stored_whole: 1, ..bounds };
        return whole;
    }
    let leaves = leaf_update(had_previous, changed);
    Outcome { diff, pending: Pending { replace_record, bounds, leaves, inserts } }
}

fn empty_diff(state: &DedupState, input: &DedupInput<'_>, method: Method, encoding: RegionEncoding) -> Diff {
    Diff {
        version: input.version,
        rank: state.rank,
        layout: state.layout,
        hash: state.hash,
        method,
        baseline: input.baseline,
        dense: false,
        first: Vec::new(),
        shift: Vec::new(),
        encoding,
    }
}

/// Stores everything.
pub struct FullMethod;

impl Deduplicate for FullMethod {
    fn deduplicate(&self, state: &DedupState, input: &DedupInput<'_>) -> Result<Outcome> {
        check_input(state, input)?;
        let mut diff = empty_diff(state, input, Method::Full, RegionEncoding::Table);
        diff.baseline = true;
        diff.first.push(FirstRun { start: 0, count: state.layout.chunks() });
        let pending = Pending {
            replace_record: true,
            bounds: BoundsHit::default(),
            leaves: LeafUpdate::Keep,
            inserts: Record::new(),
        };
        Ok(Outcome { diff, pending })
    }
}

/// Changed-chunk bitmap.
pub struct BasicMethod;

impl Deduplicate for BasicMethod {
    fn deduplicate(&self, state: &DedupState, input: &DedupInput<'_>) -> Result<Outcome> {
        check_input(state, input)?;
        let empty = Record::new();
        let stage = match leaf_stage(state, input, Method::Basic, &empty) {
            Ok(stage) => stage,
            Err(dense) => return Ok(dense),
        };
        Ok(bounded(state, input, Method::Basic, stage, |changed, _| {
            let mut diff = empty_diff(state, input, Method::Basic, RegionEncoding::Bitmap);
            diff.first = changed.iter().map(|&(i, _)| FirstRun { start: i, count: 1 }).collect();
            diff.coalesce();
            Labelled { diff, inserts: Record::new(), roots: changed.len() as u64, device_shift_entries: 0 }
        }))
    }
}

/// The leaf pass every hashing method starts with, against the history the
/// version may use (none for a baseline).
struct LeafStage<'s> {
    /// Whether a previous version's leaves were compared against.
    had_previous: bool,
    /// Non-FIXED leaves, in index order.
    changed: Vec<(u64, Digest)>,
    /// The record the version may reference.
    base: &'s Record,
}

/// Runs the leaf pass; `Err(outcome)` is the dense form when most chunks changed.
#[allow(clippy::result_large_err)] // an early exit taken once per dense version, not an error path
fn leaf_stage<'s>(
    state: &'s DedupState,
    input: &DedupInput<'_>,
    method: Method,
    empty: &'s Record,
) -> std::result::Result<LeafStage<'s>, Outcome> {
    let prev = if input.baseline { None } else { state.previous.as_deref() };
    let base = if input.baseline { empty } else { &state.record };
    let changed = {
        let _span = crate::profile::Span::new("dedup-leaves", input.version);
        hash_leaves(input.data, state.layout, state.hash, prev)
    };
    if prev.is_some() && is_dense(changed.len() as u64, state.layout.chunks()) {
        return Err(dense_outcome(state, input, method, true, changed));
    }
    Ok(LeafStage { had_previous: prev.is_some(), changed, base })
}

fn leaf_update(had_previous: bool, changed: Vec<(u64, Digest)>) -> LeafUpdate {
    if had_previous {
        LeafUpdate::Patch(changed)
    } else {
        LeafUpdate::Replace(changed.into_iter().map(|(_, d)| d).collect())
    }
}

/// One entry per non-FIXED chunk.
pub struct ListMethod;

impl Deduplicate for ListMethod {
    fn deduplicate(&self, state: &DedupState, input: &DedupInput<'_>) -> Result<Outcome> {
        let version32 = check_input(state, input)?;
        let empty = Record::new();
        let stage = match leaf_stage(state, input, Method::List, &empty) {
            Ok(stage) => stage,
            Err(dense) => return Ok(dense),
        };
        Ok(bounded(state, input, Method::List, stage, |changed, base| {
            let mut inserts = Record::new();
            let labels = classify_leaves(changed, base, &mut inserts, version32, state.rank);
            let mut diff = empty_diff(state, input, Method::List, RegionEncoding::Table);
            for (&(i, _), label) in changed.iter().zip(&labels) {
                match label {
                    LeafLabel::First => diff.first.push(FirstRun { start: i, count: 1 }),
                    LeafLabel::Shift(src) => diff.shift.push(shift_run(i, 1, src)),
                }
            }
            let device_shift_entries = diff.shift.len() as u64;
            Labelled { diff, inserts, roots: changed.len() as u64, device_shift_entries }
        }))
    }
}

fn shift_run(start: u64, count: u64, src: &RecordEntry) -> ShiftRun {
    ShiftRun {
        start,
        count,
        src_version: u64::from(src.version),
        src_rank: src.rank,
        src_start: src.node.first_chunk(),
        reference: None,
        period: 0,
    }
}

/// Merkle-tree compaction.
pub struct TreeMethod;

impl Deduplicate for TreeMethod {
    fn deduplicate(&self, state: &DedupState, input: &DedupInput<'_>) -> Result<Outcome> {
        let version32 = check_input(state, input)?;
        let empty = Record::new();
        let stage = match leaf_stage(state, input, Method::Tree, &empty) {
            Ok(stage) => stage,
            Err(dense) => return Ok(dense),
        };
        Ok(bounded(state, input, Method::Tree, stage, |changed, base| {
            let mut inserts = Record::new();
            let labels = {
                let _span = crate::profile::Span::new("dedup-classify", input.version);
                classify_leaves(changed, base, &mut inserts, version32, state.rank)
            };
            let roots = {
                let _span = crate::profile::Span::new("dedup-tree", input.version);
                tree::compact(state.layout, state.hash, changed, &labels, base, &mut inserts, version32, state.rank)
            };
            let _span = crate::profile::Span::new("dedup-regions", input.version);
            let mut diff = empty_diff(state, input, Method::Tree, RegionEncoding::Table);
            let mut pieces = Vec::new();
            for root in &roots {
                let r = state.layout.node_chunks(root.node);
                let count = r.end - r.start;
                match (root.source, root.source.and_then(|src| tree::repeat_period(count, src.node))) {
                    (None, _) => diff.first.push(FirstRun { start: r.start, count }),
                    (Some(src), None) => diff.shift.push(shift_run(r.start, count, &src)),
                    // A repeat node: its source once per period.
                    (Some(src), Some(period)) => {
                        pieces.extend((r.start..r.end).step_by(period as usize).map(|at| shift_run(at, period, &src)))
                    }
                }
            }
            diff.first.sort_unstable_by_key(|r| r.start);
            diff.shift.sort_unstable_by_key(|r| r.start);
            // As the device writes them: plain roots coalesced, a repeat node one entry.
            let heads = diff.shift.iter().zip(diff.shift.iter().skip(1)).filter(|(a, b)| !a.extended_by(b)).count();
            let repeat_roots = roots.len() - diff.first.len() - diff.shift.len();
            let device_shift_entries = (diff.shift.len().min(1) + heads + repeat_roots) as u64;
            if !pieces.is_empty() {
                diff.shift.append(&mut pieces);
                diff.shift.sort_unstable_by_key(|r| r.start);
            }
            diff.coalesce();
            Labelled { diff, inserts, roots: roots.len() as u64, device_shift_entries }
        }))
    }
}

/// A region root chosen by the compaction: FIRST when `source` is `None`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Root {
    /// The node covering the region.
    pub node: NodeId,
    /// Where its bytes are stored, for a SHIFT region.
    pub source: Option<RecordEntry>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::HashAlgo;

    /// A buffer of 64 chunks of 64 bytes: chunk i holds `f(i)` repeated.
    fn buffer(f: impl Fn(usize) -> u8) -> Vec<u8> {
        (0..64 * 64).map(|b| f(b / 64)).collect()
    }

    /// Committing with the record entries held, then absorbing them, leaves
    /// the state a plain commit leaves (a baseline restarting the record
    /// too), and entries remapped while held come back remapped.
    #[test]
    fn holding_the_inserts_then_absorbing_them_is_a_commit() {
        let layout = Layout::new(64 * 64, 64).expect("layout");
        let versions = [
            buffer(|i| i as u8),
            buffer(|i| if i % 7 == 0 { 200 } else { i as u8 }),
            buffer(|i| (i * 3 % 64) as u8),
            buffer(|i| if i < 20 { 9 } else { i as u8 }),
        ];
        let mut plain = DedupState::new(layout, HashAlgo::Murmur3, 0);
        let mut held = DedupState::new(layout, HashAlgo::Murmur3, 0);
        for (v, data) in versions.iter().enumerate() {
            let version = v as u64 + 1;
            let baseline = version == 1 || version == 3;
            let input = DedupInput { data, version, baseline };
            let a = Method::Tree.deduplicator().deduplicate(&plain, &input).expect("dedup");
            let b = Method::Tree.deduplicator().deduplicate(&held, &input).expect("dedup");
            assert_eq!(a.diff, b.diff, "version {version}: the states differ already");
            plain.commit(a.pending);
            let h = held.commit_holding_inserts(b.pending);
            assert!(baseline || held.record.len() <= plain.record.len());
            held.absorb(h);
            assert_eq!(plain.record.sorted_entries(), held.record.sorted_entries(), "version {version}: records");
            assert_eq!(plain.previous, held.previous, "version {version}: leaves");
        }
        // Remapped while held: every entry of the next version moves.
        let changed = buffer(|i| match i {
            40..48 => 100 + i as u8,
            0..20 => 9,
            _ => i as u8,
        });
        let input = DedupInput { data: &changed, version: 5, baseline: false };
        let out = Method::Tree.deduplicator().deduplicate(&held, &input).expect("dedup");
        let mut h = held.commit_holding_inserts(out.pending);
        let added = h.len();
        assert!(added > 0, "the version added no entries");
        h.remap(|e| Some(RecordEntry { rank: 7, ..*e }));
        held.absorb(h);
        let moved = held.record.sorted_entries().iter().filter(|(_, e)| e.rank == 7).count();
        assert_eq!(moved, added);
    }
}
