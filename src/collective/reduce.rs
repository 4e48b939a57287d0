//! The reduction of the collective step over MPI: every rank's tuple set
//! travels as one element of a contiguous derived datatype of `1 + 5K`
//! words, reduced to rank 0 by a non-commutative user operation applying the
//! top-K merger, then broadcast as plain words.
//!
//! The only `unsafe` code outside the CUDA backend lives here: the MPI
//! views of the wire buffers and the user operation's access to them (see
//! the SAFETY notes).
#![allow(unsafe_code)]

use super::merge::{self, HashFreq, decode_wire_into, encode_wire, wire_words};
use crate::{Error, Result};
use ::mpi::collective::{SystemOperation, UserOperation};
use ::mpi::datatype::{MutView, UserDatatype, View};
use ::mpi::traits::*;

/// Reduces every rank's tuple set (sorted by digest, at most `threshold`
/// entries) with the top-K merger: `MPI_Reduce` to rank 0 with a
/// non-commutative user operation over one fixed-capacity element per rank,
/// then `MPI_Bcast`. Every rank returns the same set. Collective. A
/// [`Reducer`] kept across reductions does the same without allocating.
pub fn reduce_sets<C: Communicator>(comm: &C, set: &[HashFreq], threshold: usize) -> Result<Vec<HashFreq>> {
    Reducer::default().reduce(comm, set, threshold).map(<[HashFreq]>::to_vec)
}

/// The reduction's working memory, kept from one checkpoint's reduction to
/// the next: the wire buffers (`1 + 5K` words each, megabytes at the
/// default K), the merger's sets and the merged result. Fresh buffers of
/// that size cost more in page faults than the merge itself (on the 2-core
/// machine, 2 ranks at K = 2^17: 45 ms a reduction with fresh buffers).
#[derive(Default)]
pub struct Reducer {
    merger: std::sync::Mutex<merge::Merger>,
    send: Vec<u64>,
    recv: Vec<u64>,
    merged: Vec<HashFreq>,
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
        // messages for that when it is below K (small checkpoints stay cheap).
        let mine = set.len().min(threshold) as u64;
        let mut total = 0u64;
        comm.all_reduce_into(&mine, &mut total, SystemOperation::sum());
        // Every rank computes the same capacity (the same K, the same total).
        let threshold = threshold.min(usize::try_from(total).unwrap_or(usize::MAX)).clamp(1, merge::MAX_THRESHOLD);
        let words = wire_words(threshold);
        let Reducer { merger, send, recv, merged } = self;
        // Only the count word and the entries are read: stale words beyond
        // them are harmless, so a buffer of the right length is reused as is.
        for buf in [&mut *send, &mut *recv] {
            if buf.len() != words {
                buf.clear();
                buf.resize(words, 0);
            }
        }
        // A longer set is cut (callers build it with `local_set`, which keeps the largest regions).
        encode_wire(&set[..set.len().min(threshold)], send);
        // MAX_THRESHOLD keeps `words` within an MPI count.
        let count = i32::try_from(words).unwrap_or(i32::MAX);
        let element = UserDatatype::contiguous(count, &u64::equivalent_datatype());
        merger.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner).set_ranks(comm.size().max(1) as u32);
        let merger = &*merger;
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
        if !decode_wire_into(recv, merged) {
            return Err(Error::Collective(
                "the reduction's merge failed (a malformed or inconsistent tuple set); nothing was written".into(),
            ));
        }
        Ok(merged)
    }
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
