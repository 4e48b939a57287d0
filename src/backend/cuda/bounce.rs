//! Host-to-device copies of pageable memory through two page-locked
//! buffers. The driver copies pageable memory through its own small staging
//! buffers, one thread at a time (~11 GB/s on the H100's host); here the
//! cores copy one piece into a page-locked buffer while the device reads the
//! other one, so the copy runs near the page-locked rate. Used for restores
//! onto the device from plain host memory and for checkpoints of host
//! buffers on the CUDA backend; page-locked sources go straight to the
//! device.

#![allow(unsafe_code)] // the pipelined copy from its page-locked halves: part of the wall (see `driver`)

use super::driver::PinnedSegment;
use super::{DevAddr, cuda_err};
use crate::error::Result;
use crate::memory::SegmentMemory;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use rayon::prelude::*;
use std::sync::Arc;

/// Bytes of each of the two page-locked buffers.
pub(crate) const PIECE: usize = 16 << 20;

/// Sources smaller than this are copied by the driver directly.
const MIN_BOUNCED: usize = 2 * PIECE;

/// The two page-locked buffers and, for each, the event after the last copy
/// that reads it.
pub(crate) struct Bounce {
    halves: [PinnedSegment; 2],
    read: [Option<CudaEvent>; 2],
}

impl std::fmt::Debug for Bounce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bounce").field("piece", &PIECE).finish()
    }
}

impl Bounce {
    /// Two page-locked buffers of [`PIECE`] bytes on `ctx` (~20 ms of
    /// page-locking, paid once by the first large pageable copy).
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        Ok(Bounce { halves: [PinnedSegment::new(ctx, PIECE)?, PinnedSegment::new(ctx, PIECE)?], read: [None, None] })
    }

    /// Whether copying `bytes` through the buffers pays: large enough, and
    /// not page-locked already (the device reads those directly).
    pub(crate) fn pays_for(bytes: &[u8]) -> bool {
        bytes.len() >= MIN_BOUNCED && !super::driver::page_locked(bytes)
    }

    /// Queues the copy of `bytes` to the device address `dst` (which must
    /// span `bytes.len()` bytes of a live device allocation, untouched by
    /// other work until `stream` has run the copies) on `stream`, piece by
    /// piece. Returns once every piece is in a page-locked buffer and its
    /// copy is queued: work queued on `stream` afterwards sees the bytes;
    /// `bytes` may change at once.
    pub(crate) fn upload(&mut self, stream: &CudaStream, bytes: &[u8], dst: DevAddr) -> Result<()> {
        let queued = self.queue(stream, bytes, dst);
        if queued.is_err() {
            // Copies already queued may still read the buffers.
            let _ = stream.synchronize();
            self.read = [None, None];
        }
        queued
    }

    fn queue(&mut self, stream: &CudaStream, bytes: &[u8], dst: DevAddr) -> Result<()> {
        for (i, piece) in bytes.chunks(PIECE).enumerate() {
            let k = i % 2;
            if let Some(read) = self.read[k].take() {
                read.synchronize().map_err(cuda_err)?;
            }
            let buf = &mut self.halves[k].bytes_mut()[..piece.len()];
            buf.par_chunks_mut(1 << 20).zip(piece.par_chunks(1 << 20)).for_each(|(d, s)| d.copy_from_slice(s));
            // SAFETY: `dst + i·PIECE .. + piece.len()` lies inside the
            // destination the caller vouches for; `buf` is page-locked memory
            // this struct owns and writes again only after the event recorded
            // below has completed (waited for above, or by the stream
            // synchronization on an error).
            unsafe { super::driver::copy_htod_async(dst.add((i * PIECE) as u64)?, &*buf, stream) }?;
            self.read[k] = Some(stream.record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING)).map_err(cuda_err)?);
        }
        Ok(())
    }
}

impl Drop for Bounce {
    fn drop(&mut self) {
        // No copy may still read a buffer when it is freed.
        for read in self.read.iter_mut().filter_map(Option::take) {
            let _ = read.synchronize();
        }
    }
}
