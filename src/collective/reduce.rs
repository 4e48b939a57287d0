//! The reduction of the collective step over MPI: every rank's tuple set is
//! merged up a binomial tree with the top-K merger (rank r receives from
//! r + 1, r + 2, r + 4, … while those exist and sends to r − 2^k at its
//! first set bit), so a set passes ⌈log2 P⌉ merges on its way to rank 0,
//! which broadcasts the result. Lower ranks are always the merge's left
//! side: the tree pairs the sets exactly as [`merge::reduce_all`] does, and
//! every rank gets the same owners. Messages carry only the entries they
//! hold (a count word, then 5 words an entry).
//!
//! `MPI_Reduce` with the merger as a non-commutative user operation did the
//! same in one call, but OpenMPI's algorithms for such an operation let the
//! time grow about linearly with the ranks of a node (K = 2^17 on 16 cores:
//! 8.7 ms at 2 ranks, 78 ms at 16), and it sent `1 + 5K` words whatever the
//! sets held. The point-to-point messages travel on the [`Reducer`]'s own
//! duplicate of the communicator, so they never meet the application's.

use super::merge::{self, HashFreq, decode_wire_into, encode_wire, wire_words};
use crate::{Error, Result};
use ::mpi::collective::SystemOperation;
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::*;

/// The tag of the tree's messages (on the reducer's own communicator).
const TREE_TAG: i32 = 0x6463;

/// The count word of a set whose merge failed somewhere below: every rank
/// above passes it on, and rank 0 broadcasts it as the failure.
const FAILED_SET: u64 = u64::MAX;

/// Reduces every rank's tuple set (sorted by digest, at most `threshold`
/// entries) with the top-K merger up a binomial tree to rank 0, then
/// broadcasts it. Every rank returns the same set. Collective. A
/// [`Reducer`] kept across reductions does the same without allocating.
pub fn reduce_sets<C: Communicator>(comm: &C, set: &[HashFreq], threshold: usize) -> Result<Vec<HashFreq>> {
    Reducer::default().reduce(comm, set, threshold).map(<[HashFreq]>::to_vec)
}

/// The reduction's working memory, kept from one checkpoint's reduction to
/// the next: its own duplicate of the communicator (made at the first
/// reduction; use a reducer with one communicator), the wire buffers
/// (`1 + 5K` words each, megabytes at the default K), the merger's sets and
/// the merged result. Fresh buffers of that size cost more in page faults
/// than the merge itself (on the 2-core machine, 2 ranks at K = 2^17: 45 ms
/// a reduction with fresh buffers, 15 ms with these).
#[derive(Default)]
pub struct Reducer {
    comm: Option<SimpleCommunicator>,
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
    /// [`reduce_sets`] in this reducer's buffers; the merged set (the same
    /// on every rank) lives until the next reduction. Collective.
    pub fn reduce<C: Communicator>(&mut self, comm: &C, set: &[HashFreq], threshold: usize) -> Result<&[HashFreq]> {
        // No partial result can hold more than every set together: size the
        // buffers for that when it is below K (small checkpoints stay cheap).
        let held = set.len().min(threshold) as u64;
        let mut total = 0u64;
        comm.all_reduce_into(&held, &mut total, SystemOperation::sum());
        // Every rank computes the same capacity (the same K, the same total).
        let threshold = threshold.min(usize::try_from(total).unwrap_or(usize::MAX)).clamp(1, merge::MAX_THRESHOLD);
        let words = wire_words(threshold);
        let own = self.comm.get_or_insert_with(|| comm.duplicate());
        let Reducer { merger, send, recv, mine, theirs, .. } = self;
        for buf in [&mut *send, &mut *recv] {
            if buf.len() < words {
                buf.resize(words, 0);
            }
        }
        mine.clear();
        mine.extend_from_slice(&set[..set.len().min(threshold)]);
        let ranks = own.size().max(1) as u32;
        let rank = own.rank().max(0) as u32;
        let mut failed = false;
        let mut mask = 1u32;
        while mask < ranks {
            if rank & mask != 0 {
                // This rank's subtree is merged: up to its parent.
                let len = if failed {
                    send[0] = FAILED_SET;
                    1
                } else {
                    encoded(mine, send)
                };
                own.process_at_rank((rank - mask) as i32).send_with_tag(&send[..len], TREE_TAG);
                break;
            }
            if let Some(child) = rank.checked_add(mask).filter(|&c| c < ranks) {
                let status = own.process_at_rank(child as i32).receive_into_with_tag(&mut recv[..words], TREE_TAG);
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
            mask <<= 1;
        }
        // Rank 0 holds every rank's merge: its count word first, then the set.
        let mut count = if failed { FAILED_SET } else { mine.len() as u64 };
        let root = own.process_at_rank(0);
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
        // Every rank received the same words, so every rank fails or none does.
        if rank != 0 && !decode_wire_into(&send[..len], mine) {
            return Err(Error::Collective("the reduction's broadcast was malformed".into()));
        }
        Ok(mine)
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
