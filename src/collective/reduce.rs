//! The reduction of the collective step over MPI: every rank's tuple set is
//! merged up a binomial tree with the top-K merger ([`tree_children`]:
//! rank r receives from r + 1, r + 2, r + 4, … up to its lowest set bit,
//! then sends to its [`tree_parent`], r without that bit), so a set passes
//! ⌈log2 P⌉ merges on its way to rank 0, which broadcasts the result. Lower
//! ranks are always the merge's left side: the tree pairs the sets exactly
//! as [`merge::reduce_all`] does, and every rank gets the same owners.
//! Messages carry only the entries they hold (a count word, then 5 words an
//! entry).
//!
//! `MPI_Reduce` with the merger as a non-commutative user operation did the
//! same in one call, but OpenMPI's algorithms for such an operation let the
//! time grow about linearly with the ranks of a node (K = 2^17 on 16 cores:
//! 8.7 ms at 2 ranks, 78 ms at 16), and it sent `1 + 5K` words whatever the
//! sets held. The tree's point-to-point messages need a communicator that
//! carries no other point-to-point traffic: [`reduce_sets`] makes a
//! duplicate, and every [`Reducer`] in the crate runs on a communicator of
//! its own (the step's thread's, a collective handle's duplicate).

use super::merge::{self, HashFreq, decode_wire_into, encode_wire, wire_words};
use crate::error::{Error, Result};
use ::mpi::collective::SystemOperation;
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::*;

/// The tag of the tree's messages.
const TREE_TAG: i32 = 0x6463;

/// The count word of a set whose merge failed somewhere below: every rank
/// above passes it on, and rank 0 broadcasts it as the failure.
const FAILED_SET: u64 = u64::MAX;

/// Reduces every rank's tuple set (sorted by digest, at most `threshold`
/// entries) with the top-K merger up a binomial tree to rank 0, then
/// broadcasts it. Every rank returns the same set. Collective; the tree
/// runs on a duplicate of `comm` made for it. A [`Reducer`] kept across
/// reductions reuses its buffers.
pub fn reduce_sets<C: Communicator>(comm: &C, set: &[HashFreq], threshold: usize) -> Result<Vec<HashFreq>> {
    let own = comm.duplicate();
    Reducer::default().reduce(&own, set, threshold).map(<[HashFreq]>::to_vec)
}

/// The ranks rank `rank` of `ranks` receives from, in order: `rank + 1`,
/// `rank + 2`, `rank + 4`, … for every bit below its lowest set bit (all
/// bits for rank 0), while they exist.
pub fn tree_children(rank: u32, ranks: u32) -> impl Iterator<Item = u32> {
    let below = if rank == 0 { u32::BITS } else { rank.trailing_zeros() };
    (0..below).filter_map(move |bit| rank.checked_add(1u32.checked_shl(bit)?).filter(|&c| c < ranks))
}

/// The rank `rank` sends its merged subtree to (its lowest set bit
/// cleared); `None` for rank 0.
pub fn tree_parent(rank: u32) -> Option<u32> {
    (rank != 0).then(|| rank & (rank - 1))
}

/// The reduction's working memory, kept from one checkpoint's reduction to
/// the next: the wire buffers (grown to the largest reduction so far:
/// `1 + 5·min(K, every set's entries)` words, megabytes at the default K),
/// the merger's sets and the merged result. Fresh buffers of that size cost
/// more in page faults than the merge itself (on the 2-core machine, 2
/// ranks at K = 2^17: 45 ms a reduction with fresh buffers, 15 ms with
/// these).
#[derive(Default)]
pub struct Reducer {
    merger: merge::Merger,
    send: Vec<u64>,
    recv: Vec<u64>,
    mine: Vec<HashFreq>,
    theirs: Vec<HashFreq>,
}

impl std::fmt::Debug for Reducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reducer").field("words", &self.recv.len()).finish()
    }
}

impl Reducer {
    /// [`reduce_sets`] in this reducer's buffers, on `comm` itself: it must
    /// carry no other point-to-point traffic (a duplicate made for the
    /// purpose). The merged set (the same on every rank) lives until the
    /// next reduction. A set naming an owner outside `comm`, on any rank,
    /// fails the reduction on every rank. Collective.
    pub fn reduce<C: Communicator>(&mut self, comm: &C, set: &[HashFreq], threshold: usize) -> Result<&[HashFreq]> {
        // No partial result can hold more than every set together: size the
        // buffers for that when it is below K (small checkpoints stay cheap).
        let held = set.len().min(threshold) as u64;
        let mut total = 0u64;
        comm.all_reduce_into(&held, &mut total, SystemOperation::sum());
        // Every rank computes the same capacity (the same K, the same total).
        let threshold = threshold.min(usize::try_from(total).unwrap_or(usize::MAX)).clamp(1, merge::MAX_THRESHOLD);
        let words = wire_words(threshold);
        let Reducer { merger, send, recv, mine, theirs } = self;
        for buf in [&mut *send, &mut *recv] {
            if buf.len() < words {
                buf.resize(words, 0);
            }
        }
        let ranks = comm.size().max(1) as u32;
        let rank = comm.rank().max(0) as u32;
        mine.clear();
        mine.extend_from_slice(&set[..set.len().min(threshold)]);
        let mut failed = !mine.iter().all(|e| e.owner < ranks);
        for child in tree_children(rank, ranks) {
            // Every child is received from, also after a failure: no message is left behind.
            let status = comm.process_at_rank(child as i32).receive_into_with_tag(&mut recv[..words], TREE_TAG);
            let got = usize::try_from(status.count(u64::equivalent_datatype())).unwrap_or(0);
            let valid = decode_wire_into(&recv[..got.min(words)], theirs)
                && theirs.len() <= threshold
                && theirs.iter().all(|e| e.owner < ranks);
            if !failed && valid {
                // Lower ranks on the left, as `reduce_all` merges them.
                merger.merge_sets(mine, theirs, threshold);
                merger.swap_out(mine);
            } else {
                failed = true;
            }
        }
        if let Some(parent) = tree_parent(rank) {
            // This rank's subtree is merged: up to its parent.
            let len = if failed {
                send[0] = FAILED_SET;
                1
            } else {
                encoded(mine, send)
            };
            comm.process_at_rank(parent as i32).send_with_tag(&send[..len], TREE_TAG);
        }
        // Rank 0 holds every rank's merge: its count word first, then the set.
        let mut count = if failed { FAILED_SET } else { mine.len() as u64 };
        let root = comm.process_at_rank(0);
        root.broadcast_into(&mut count);
        if count == FAILED_SET {
            return Err(Error::Collective(
                "the reduction's merge failed (a malformed or inconsistent tuple set); nothing was written".into(),
            ));
        }
        let len = wire_words(usize::try_from(count).unwrap_or(usize::MAX)).min(words);
        if rank == 0 {
            encoded(mine, send);
        }
        root.broadcast_into(&mut send[..len]);
        // Every rank received the same words (rank 0 encoded its own set).
        if rank != 0 && !decode_wire_into(&send[..len], mine) {
            return Err(Error::Collective("the reduction's broadcast was malformed".into()));
        }
        Ok(mine)
    }
}

/// A [`Reducer`] on a duplicate of a communicator made for it: what a
/// collective handle keeps, so that the tree's messages never meet the
/// application's and no communicator is made per checkpoint.
pub struct Reduction {
    comm: SimpleCommunicator,
    reducer: Reducer,
}

impl std::fmt::Debug for Reduction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reduction").field("reducer", &self.reducer).finish()
    }
}

impl Reduction {
    /// A reduction over a duplicate of `comm`. Collective.
    pub fn new<C: Communicator>(comm: &C) -> Self {
        Reduction { comm: comm.duplicate(), reducer: Reducer::default() }
    }

    /// [`Reducer::reduce`] on the duplicate. Collective.
    pub fn reduce(&mut self, set: &[HashFreq], threshold: usize) -> Result<&[HashFreq]> {
        self.reducer.reduce(&self.comm, set, threshold)
    }

    /// Its communicator and reducer, for a collective step run in the call.
    pub(crate) fn parts(&mut self) -> (&SimpleCommunicator, &mut Reducer) {
        (&self.comm, &mut self.reducer)
    }
}

/// Encodes `set` at the start of `wire`; the words written. A set longer
/// than `wire` holds (none is: every set is cut to the capacity the wire was
/// sized for) goes as a failed one.
fn encoded(set: &[HashFreq], wire: &mut [u64]) -> usize {
    let len = wire_words(set.len());
    if len <= wire.len() && encode_wire(set, &mut wire[..len]) {
        return len;
    }
    wire[0] = FAILED_SET;
    1
}

/// A communicator that a background thread owns: the collective step run
/// off the application's path ([`super::background`]). Made only where MPI
/// granted `MPI_THREAD_MULTIPLE`.
pub(crate) struct ThreadComm(::mpi::topology::SimpleCommunicator);

impl ThreadComm {
    /// `comm` for another thread, or `None` when MPI's thread level does
    /// not let two threads call it at once.
    pub(crate) fn new(comm: ::mpi::topology::SimpleCommunicator) -> Option<Self> {
        (::mpi::environment::threading_support() == ::mpi::Threading::Multiple).then_some(ThreadComm(comm))
    }

    /// The communicator.
    pub(crate) fn comm(&self) -> &::mpi::topology::SimpleCommunicator {
        &self.0
    }
}

// SAFETY: a `SimpleCommunicator` is a handle (an `MPI_Comm` value) that
// rsmpi does not mark `Send` only because it wraps a raw pointer. MPI lets
// any thread call it under `MPI_THREAD_MULTIPLE`, which `ThreadComm::new`
// checks; the handle is moved, never shared (no `Sync`), so one thread at a
// time uses it, and it is freed (`MPI_Comm_free`) by the thread that owns it
// before the application finalizes MPI (the owner joins that thread on drop).
#[allow(unsafe_code)]
unsafe impl Send for ThreadComm {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::merge::{local_set, reduce_all};
    use crate::hash::Digest;
    use crate::layout::NodeId;

    /// The tree's schedule run in one process: each rank merges its
    /// children's subtrees in `tree_children` order, then hands the result
    /// to `tree_parent`.
    fn tree_reduce(sets: &[Vec<HashFreq>], k: usize) -> Vec<HashFreq> {
        let ranks = sets.len() as u32;
        let mut merged: Vec<Option<Vec<HashFreq>>> = vec![None; sets.len()];
        // A rank's subtree is complete once its children's are: from the highest rank down.
        for r in (0..ranks).rev() {
            let mut mine = sets[r as usize].clone();
            for c in tree_children(r, ranks) {
                let theirs = merged[c as usize].take().expect("a child's subtree merged before its parent's");
                mine = merge::merge(&mine, &theirs, k);
            }
            merged[r as usize] = Some(mine);
        }
        merged[0].take().unwrap_or_default()
    }

    #[test]
    fn the_tree_pairs_the_ranks_as_reduce_all_does() {
        let d = |x: u64| Digest(u128::from(x).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834));
        for ranks in 1..=17u32 {
            let sets: Vec<Vec<HashFreq>> = (0..ranks)
                .map(|r| {
                    let shared = (0..20u64).map(|i| (d(i), 100 * (1 + i % 7), NodeId::new(1, i)));
                    let own =
                        (0..5 + u64::from(r)).map(|i| (d(1000 * (u64::from(r) + 1) + i), 64 + i, NodeId::new(0, i)));
                    local_set(r, shared.chain(own), 1 << 17)
                })
                .collect();
            for k in [1usize << 17, 24, 5] {
                assert_eq!(tree_reduce(&sets, k), reduce_all(&sets, k), "{ranks} ranks, K = {k}");
            }
            // Every rank but 0 has one parent, lower than itself, that lists it as a child.
            for r in 1..ranks {
                let p = tree_parent(r).unwrap();
                assert!(p < r && tree_children(p, ranks).any(|c| c == r), "rank {r} of {ranks}");
            }
            assert_eq!(tree_parent(0), None);
        }
    }
}
