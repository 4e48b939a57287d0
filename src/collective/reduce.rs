//! The reduction of the collective step over MPI: every rank's tuple set
//! travels as one element of a contiguous derived datatype of `1 + 5K`
//! words, reduced to rank 0 by a non-commutative user operation applying the
//! top-K merger, then broadcast as plain words.
//!
//! The only `unsafe` code outside the CUDA backend lives here: the MPI
//! views of the wire buffers and the user operation's access to them (see
//! the SAFETY notes).
#![allow(unsafe_code)]

use super::merge::{self, HashFreq, decode_wire, encode_wire, wire_words};
use crate::{Error, Result};
use ::mpi::collective::{SystemOperation, UserOperation};
use ::mpi::datatype::{MutView, UserDatatype, View};
use ::mpi::traits::*;

/// Reduces every rank's tuple set (sorted by digest, at most `threshold`
/// entries) with the top-K merger: `MPI_Reduce` to rank 0 with a
/// non-commutative user operation over one fixed-capacity element per rank,
/// then `MPI_Bcast`. Every rank returns the same set. Collective.
pub fn reduce_sets<C: Communicator>(comm: &C, set: &[HashFreq], threshold: usize) -> Result<Vec<HashFreq>> {
    // No partial result can hold more than every set together: size the
    // messages for that when it is below K (small checkpoints stay cheap).
    let mine = set.len().min(threshold) as u64;
    let mut total = 0u64;
    comm.all_reduce_into(&mine, &mut total, SystemOperation::sum());
    // Every rank computes the same capacity (the same K, the same total).
    let threshold = threshold.min(usize::try_from(total).unwrap_or(usize::MAX)).clamp(1, merge::MAX_THRESHOLD);
    let words = wire_words(threshold);
    let mut send = vec![0u64; words];
    // A longer set is cut (callers build it with `local_set`, which keeps the largest regions).
    encode_wire(&set[..set.len().min(threshold)], &mut send);
    let mut recv = vec![0u64; words];
    // MAX_THRESHOLD keeps `words` within an MPI count.
    let count = i32::try_from(words).unwrap_or(i32::MAX);
    let element = UserDatatype::contiguous(count, &u64::equivalent_datatype());
    let merger = std::sync::Mutex::new(merge::Merger::for_ranks(comm.size().max(1) as u32));
    let op = UserOperation::associative(move |invec, mut inoutvec| {
        // SAFETY: both buffers hold one element of `element`, i.e. `words`
        // u64 words, allocated by MPI or by `send`/`recv` below, and are
        // distinct (MPI passes separate input and in-out buffers).
        if invec.len() != 1 || inoutvec.len() != 1 {
            return; // not the one-element call this operation is used with
        }
        let (left, right) = unsafe {
            (
                std::slice::from_raw_parts(invec.as_ptr() as *const u64, words),
                std::slice::from_raw_parts_mut(inoutvec.as_mut_ptr() as *mut u64, words),
            )
        };
        // MPI computes inoutvec = invec (lower ranks) ∘ inoutvec (higher ranks).
        // A poisoned lock (a panic cannot happen here) still holds usable buffers.
        let mut m = merger.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !m.merge_wire(left, right, threshold) {
            // Poison the partial result: every later merge fails too, and
            // every rank decodes the broadcast as a failure.
            right[0] = u64::MAX;
        }
    });
    let root = comm.process_at_rank(0);
    {
        // SAFETY: `send` and `recv` are `words` u64 words long: exactly one
        // element of the contiguous datatype, no padding.
        let sv = unsafe { View::with_count_and_datatype(&send[..], 1, &element) };
        if comm.rank() == 0 {
            let mut rv = unsafe { MutView::with_count_and_datatype(&mut recv[..], 1, &element) };
            root.reduce_into_root(&sv, &mut rv, &op);
        } else {
            root.reduce_into(&sv, &op);
        }
    }
    // The broadcast applies no operation, so it may cut the set into
    // segments and pipeline them: send it as plain words.
    root.broadcast_into(&mut recv[..]);
    // Every rank received the same words, so every rank fails or none does.
    decode_wire(&recv).ok_or_else(|| {
        Error::Collective(
            "the reduction's merge failed (a malformed or inconsistent tuple set); nothing was written".into(),
        )
    })
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
unsafe impl Send for ThreadComm {}
