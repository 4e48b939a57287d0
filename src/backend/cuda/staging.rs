//! The runtime's device staging buffer: the application's protected regions
//! (device memory, and host memory) gathered into one device buffer for a
//! checkpoint (device-to-device copies, no trip through host memory), and
//! scattered back after a restore.

use super::driver::{copy_dtod_async, copy_dtoh_async, copy_htod_async};
use super::{DevAddr, cuda_err};
use crate::error::{Error, Result};
use crate::memory::{DeviceRegion, Protected, ProtectedMut};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use std::sync::Arc;

/// One device buffer the regions are gathered into.
pub struct DeviceStaging {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    buf: CudaSlice<u8>,
}

impl std::fmt::Debug for DeviceStaging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceStaging").field("len", &self.buf.len()).finish()
    }
}

impl DeviceStaging {
    /// A zeroed buffer of `len` bytes on device `ordinal` (its primary
    /// context: the one the CUDA backend uses).
    pub fn new(ordinal: usize, len: usize) -> Result<Self> {
        let ctx = CudaContext::new(ordinal).map_err(cuda_err)?;
        let stream = ctx.new_stream().map_err(cuda_err)?;
        let buf = stream.alloc_zeros::<u8>(len.max(1)).map_err(cuda_err)?;
        Ok(DeviceStaging { ctx, stream, buf })
    }

    fn ptr(&self) -> DevAddr {
        DevAddr::of(&self.buf, &self.stream)
    }

    /// Checks that `len` bytes at `offset` lie in the buffer.
    fn span(&self, offset: usize, len: usize) -> Result<DevAddr> {
        match offset.checked_add(len) {
            Some(end) if end <= self.buf.len() => self.ptr().add(offset as u64),
            _ => Err(Error::Internal(format!("{len} bytes at {offset} pass the staging buffer's end"))),
        }
    }

    /// Copies every piece to its offset in the buffer (device memory
    /// device-to-device, host memory host-to-device) and waits.
    #[allow(unsafe_code)] // raw copies, completed before it returns; their SAFETY below
    pub fn gather(&mut self, pieces: &[(usize, Protected<'_>)]) -> Result<()> {
        self.ctx.bind_to_thread().map_err(cuda_err)?;
        for (offset, piece) in pieces {
            let dst = self.span(*offset, piece.len())?;
            match piece {
                Protected::Device(region) => {
                    let src = DevAddr::of_region_in(&self.ctx, region)?;
                    // SAFETY: both spans were checked to lie inside live
                    // device allocations (the staging buffer, which self
                    // owns; the region, which its constructor's contract
                    // keeps allocated and unwritten); the synchronize below
                    // completes the copy before either is used again.
                    unsafe { copy_dtod_async(dst, src, region.len(), &self.stream) }?;
                }
                Protected::Host(bytes) => {
                    // SAFETY: `dst` spans `bytes.len()` bytes of the staging
                    // buffer (checked); `bytes` outlives the copy, which the
                    // synchronize below completes.
                    unsafe { copy_htod_async(dst, bytes, &self.stream) }?;
                }
            }
        }
        self.stream.synchronize().map_err(cuda_err)
    }

    /// Copies the buffer's bytes at each piece's offset back into it
    /// (device-to-device, or device-to-host) and waits.
    #[allow(unsafe_code)] // raw copies, completed before it returns; their SAFETY below
    pub fn scatter(&self, pieces: &mut [(usize, ProtectedMut<'_>)]) -> Result<()> {
        self.ctx.bind_to_thread().map_err(cuda_err)?;
        for (offset, piece) in pieces.iter_mut() {
            let src = self.span(*offset, piece.len())?;
            match piece {
                ProtectedMut::Device(region) => {
                    let dst = DevAddr::of_region_in(&self.ctx, region)?;
                    // SAFETY: as in `gather`, with the roles swapped.
                    unsafe { copy_dtod_async(dst, src, region.len(), &self.stream) }?;
                }
                ProtectedMut::Host(bytes) => {
                    // SAFETY: `src` spans `bytes.len()` bytes of the staging
                    // buffer (checked); `bytes` is borrowed mutably until the
                    // synchronize below completes the copy.
                    unsafe { copy_dtoh_async(bytes, src, &self.stream) }?;
                }
            }
        }
        self.stream.synchronize().map_err(cuda_err)
    }

    /// The whole buffer, as checkpoint input or restore destination.
    pub fn region(&mut self) -> Result<DeviceRegion<'_>> {
        DeviceRegion::of_mut(&mut self.buf)
    }
}
