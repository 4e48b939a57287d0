//! The GPU cache tier: a device arena, part of the one budget
//! (`DevicePlan::cache_bytes`, allocated once at open), that holds diff
//! files between the pipeline's output buffer and the host cache.
//!
//! A version's file moves into the arena with one device-to-device copy in
//! the pipeline stream's order, right after its kernels (~3 TB/s on an
//! H100): the output buffer is free for the next version at once, and the
//! copy to the host runs on the arena's own stream, overlapping the next
//! versions' kernels instead of preceding them. When the host cache has no
//! room, the file waits here and the application does not
//! ([`crate::backend::FileSink::defer`]): the flusher copies it out when it
//! needs the bytes. When the arena has no room either, the checkpoint takes
//! the direct path (and the host cache's backpressure).
//!
//! Ordering, all by CUDA events: the arena stream waits for the event
//! recorded after a file's device copy before copying it out; a span is
//! reused by a later device copy (on the pipeline stream) only once its copy
//! out is known to have ended or after the pipeline stream was made to wait
//! for it ([`crate::backend::ring`]).

use super::{DevAddr, Gpu, cuda_err};
use crate::backend::Ready;
use crate::backend::ring::Ring;
use crate::error::{Error, Result};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};
use std::sync::{Arc, Mutex};

/// The arena and its stream.
pub struct DeviceCache {
    buf: CudaSlice<u8>,
    base: DevAddr,
    copy: Arc<CudaStream>,
    ring: Mutex<Ring<Arc<CudaEvent>>>,
}

impl std::fmt::Debug for DeviceCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceCache").field("bytes", &self.buf.len()).finish()
    }
}

impl Drop for DeviceCache {
    fn drop(&mut self) {
        // No copy out may still read the arena when it is freed.
        let _ = self.copy.synchronize();
    }
}

impl DeviceCache {
    /// An arena of `bytes` on `gpu`, allocated now.
    pub fn new(gpu: &Gpu, bytes: u64) -> Result<Arc<DeviceCache>> {
        let len = usize::try_from(bytes).map_err(|_| Error::InvalidOption(format!("GPU cache of {bytes} bytes")))?;
        let buf = gpu.stream.alloc_zeros::<u8>(len.max(1)).map_err(|e| Error::Gpu(format!("device memory: {e}")))?;
        // The allocation is ordered on the pipeline stream; the arena stream
        // reads it only after events recorded there later, but make it
        // plainly complete before anything else sees it.
        gpu.stream.synchronize().map_err(cuda_err)?;
        let base = DevAddr::of(&buf, &gpu.stream);
        let copy = gpu.ctx.new_stream().map_err(cuda_err)?;
        Ok(Arc::new(DeviceCache { base, copy, ring: Mutex::new(Ring::new(len as u64)), buf }))
    }

    /// The arena's size in bytes.
    pub fn capacity(&self) -> u64 {
        self.buf.len() as u64
    }

    /// Bytes of files it holds or is copying out now.
    pub fn in_use(&self) -> u64 {
        crate::sync::lock(&self.ring).in_use()
    }

    /// Copies `len` bytes at device address `src` into the arena, in
    /// `main`'s order (after the work queued there; later work there may
    /// overwrite `src`). `None` when the arena has no room.
    #[allow(unsafe_code)] // one raw copy; its SAFETY below
    pub(crate) fn stage(self: &Arc<Self>, main: &Arc<CudaStream>, src: DevAddr, len: usize) -> Result<Option<Staged>> {
        let reserved = {
            let mut ring = crate::sync::lock(&self.ring);
            ring.reserve(
                len as u64,
                |copied| copied.try_is_complete().map_err(cuda_err),
                |copied| main.wait(copied).map_err(cuda_err),
            )?
        };
        let Some(span) = reserved else { return Ok(None) };
        let at = self.base.add(span.start)?;
        // SAFETY: `src..src + len` lies in a device allocation the caller owns
        // and keeps until `main` has run this copy; `at..at + len` lies in
        // the arena (the ring placed it within its capacity) and no other
        // span overlaps it; the copy is queued on `main`, the stream of both
        // allocations, behind every earlier use of either span.
        let copied = unsafe { super::driver::copy_dtod_async(at, src, len, main) }
            .and_then(|()| main.record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING)).map_err(cuda_err));
        match copied {
            Ok(landed) => Ok(Some(Staged { cache: Arc::clone(self), id: span.id, at, len, landed, out: false })),
            Err(e) => {
                // Nothing reads the span: give it back (the next device copy
                // into it is ordered behind this one on `main`).
                crate::sync::lock(&self.ring).free(span.id);
                Err(e)
            }
        }
    }
}

/// A file in the arena, not yet copied out; dropping it gives its span back.
pub(crate) struct Staged {
    cache: Arc<DeviceCache>,
    id: u64,
    at: DevAddr,
    len: usize,
    landed: CudaEvent,
    out: bool,
}

impl std::fmt::Debug for Staged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staged").field("len", &self.len).finish()
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.out {
            crate::sync::lock(&self.cache.ring).free(self.id);
        }
    }
}

impl Staged {
    /// Starts copying the file into the consecutive host buffers `bufs`
    /// (page-locked for full speed) on the arena's stream, zeroing what the
    /// file leaves of them (its trailer, sealed later); returns the wait
    /// for the copy. The buffers must stay untouched until it has run.
    pub(crate) fn copy_out(mut self, bufs: &mut [&mut [u8]]) -> Result<Ready> {
        let copy = Arc::clone(&self.cache.copy);
        // This may run on another thread (a flush worker).
        copy.context().bind_to_thread().map_err(cuda_err)?;
        let issued = copy.wait(&self.landed).map_err(cuda_err).and_then(|()| self.issue(&copy, bufs));
        let done = match issued {
            Ok(done) => Arc::new(done),
            Err(e) => {
                // Copies already queued must end before the buffers go back.
                let _ = copy.synchronize();
                return Err(e);
            }
        };
        crate::sync::lock(&self.cache.ring).leave(self.id, Arc::clone(&done));
        self.out = true;
        Ok(Box::new(move || done.synchronize().map_err(cuda_err)))
    }

    /// Copies the file into the start of `buf` (host memory at least as
    /// long) now, on the arena's stream, zeroing the rest of `buf` (its
    /// trailer, sealed later), and leaves it in the arena: a restore's read
    /// of a file still waiting there for room in the host cache.
    #[allow(unsafe_code)] // one raw copy; its SAFETY below
    pub(crate) fn read_into(&self, buf: &mut [u8]) -> Result<()> {
        let Some((head, tail)) = buf.split_at_mut_checked(self.len) else {
            return Err(Error::Internal("a peek buffer shorter than the file".into()));
        };
        tail.fill(0);
        let copy = &self.cache.copy;
        // This runs on the restoring thread.
        copy.context().bind_to_thread().map_err(cuda_err)?;
        copy.wait(&self.landed).map_err(cuda_err)?;
        // SAFETY: `at..at + len` is this file's span of the arena, reserved
        // while `self` lives (it is not copied out: `copy_out` takes `self`
        // by value, which this borrow excludes); `head` is `len` bytes of
        // host memory that nothing else touches until the copy has ended,
        // which this function waits for (on an error too, below).
        let copied = unsafe { super::driver::copy_dtoh_async(head, self.at, copy) }
            .and_then(|()| copy.record_event(Some(CUevent_flags::CU_EVENT_BLOCKING_SYNC)).map_err(cuda_err))
            .and_then(|done| done.synchronize().map_err(cuda_err));
        if copied.is_err() {
            let _ = copy.synchronize();
        }
        copied
    }

    /// Queues the device-to-host copies on `copy`; the event after them.
    #[allow(unsafe_code)] // raw copies; their SAFETY below
    fn issue(&self, copy: &CudaStream, bufs: &mut [&mut [u8]]) -> Result<CudaEvent> {
        let mut done = 0usize;
        for buf in bufs.iter_mut() {
            let n = (self.len - done).min(buf.len());
            let (head, tail) = buf.split_at_mut(n);
            if n > 0 {
                // SAFETY: `at + done .. at + done + n` lies in this file's
                // span of the arena, which stays reserved until the event
                // recorded below has completed (the ring takes it back only
                // then, or after ordering the pipeline stream behind it);
                // `head` is host memory the caller keeps untouched until the
                // returned wait has run (FileSink's contract).
                unsafe { super::driver::copy_dtoh_async(head, self.at.add(done as u64)?, copy) }?;
            }
            tail.fill(0);
            done += n;
        }
        if done != self.len {
            return Err(Error::Internal("the host buffers are shorter than the file".into()));
        }
        copy.record_event(Some(CUevent_flags::CU_EVENT_BLOCKING_SYNC)).map_err(cuda_err)
    }
}
