//! Region digests on their way back from the device: the collective step's
//! offer reads a version's FIRST subtree digests off the tree the pipeline
//! just built (`gather_digests`), copied in stream order into page-locked
//! memory. The application's call only enqueues the gather; the collective
//! step's thread waits for the copy ([`GatheredDigests::wait`]), so the
//! call never waits for the device here. The page-locked buffers are
//! reused ([`DigestPool`]): allocating them costs more than the copy.

use super::{Gpu, cuda_err};
use crate::error::{Error, Result};
use crate::hash::Digest;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream, PinnedHostSlice};
use std::sync::{Arc, Mutex};

/// Words per node in `gather_digests`' output: the digest's two words, then
/// 1 where the node is one of the version's FIRST subtrees (its digest is
/// known), 0 where not.
pub(crate) const GATHER_WORDS: usize = 3;

/// Buffers the pool keeps (one version is in flight at a time, plus the
/// one being gathered).
const POOLED: usize = 2;

/// Page-locked buffers for gathered digests, shared by the pipeline (which
/// takes one per gather) and each [`GatheredDigests`] (which gives it back
/// when dropped, on whichever thread).
#[derive(Clone, Default)]
pub(crate) struct DigestPool(Arc<Mutex<Vec<PinnedHostSlice<u64>>>>);

impl std::fmt::Debug for DigestPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held = self.0.lock().map_or(0, |p| p.len());
        write!(f, "DigestPool({held} buffers)")
    }
}

impl DigestPool {
    /// A buffer of at least `words` words: a pooled one not much larger
    /// (the whole buffer is copied), or a new one (zero-filled, a power of
    /// two of at least 4096 words).
    pub(crate) fn take(&self, words: usize, gpu: &Gpu) -> Result<PinnedHostSlice<u64>> {
        let want = words.max(4096).next_power_of_two();
        {
            let mut pool = crate::sync::lock(&self.0);
            if let Some(i) = pool.iter().position(|p| p.len() >= want && p.len() <= 4 * want) {
                return Ok(pool.swap_remove(i));
            }
        }
        super::driver::pinned_zeroed::<u64>(&gpu.ctx, want)
    }

    /// Keeps `buffer`, dropping the oldest kept one when the pool is full
    /// (so buffers of a size no longer asked for go).
    fn give_back(&self, buffer: PinnedHostSlice<u64>) {
        let oldest = {
            let mut pool = crate::sync::lock(&self.0);
            pool.push(buffer);
            (pool.len() > POOLED).then(|| pool.remove(0))
        };
        // Dropped outside the lock: cudarc waits for its copy before freeing it.
        drop(oldest);
    }
}

/// The digests of `count` nodes, copied (or being copied) into a pooled
/// page-locked buffer by the pipeline's stream; `done` is recorded after
/// the copy (cudarc records no event of its own on a single stream).
pub(crate) struct GatheredDigests {
    host: Option<PinnedHostSlice<u64>>,
    count: usize,
    done: Option<CudaEvent>,
    pool: DigestPool,
}

impl GatheredDigests {
    /// The digests of `count` nodes whose copy into `host` was the last
    /// work enqueued on `stream` (none at all for no nodes).
    pub(crate) fn after(
        stream: &CudaStream,
        host: PinnedHostSlice<u64>,
        count: usize,
        pool: DigestPool,
    ) -> Result<Self> {
        let done = match count {
            0 => None,
            _ => Some(stream.record_event(Some(CUevent_flags::CU_EVENT_BLOCKING_SYNC)).map_err(cuda_err)?),
        };
        Ok(GatheredDigests { host: Some(host), count, done, pool })
    }

    /// Waits for the copy; each node's digest, or `None` where the device's
    /// tree holds none of this version's bytes for it (not a FIRST
    /// subtree). Any thread; blocks without spinning.
    pub(crate) fn wait(&self) -> Result<Vec<Option<Digest>>> {
        if let Some(done) = &self.done {
            done.synchronize().map_err(cuda_err)?;
        }
        let host = self.host.as_ref().ok_or_else(|| Error::Internal("gathered digests taken".into()))?;
        let words = host.as_slice().map_err(cuda_err)?;
        let words = words
            .get(..GATHER_WORDS * self.count)
            .ok_or_else(|| Error::Internal("gathered digests: buffer too short".into()))?;
        Ok(words
            .chunks_exact(GATHER_WORDS)
            .map(|w| (w[2] != 0).then(|| Digest(u128::from(w[0]) | (u128::from(w[1]) << 64))))
            .collect())
    }
}

impl Drop for GatheredDigests {
    fn drop(&mut self) {
        // A pooled buffer is idle: the copy into it has ended (normally long
        // before; cudarc would not wait for it before freeing the buffer). A
        // failed wait means the device is gone, and no copy runs any more.
        if let Some(done) = &self.done {
            let _ = done.synchronize();
        }
        if let Some(host) = self.host.take() {
            self.pool.give_back(host);
        }
    }
}
