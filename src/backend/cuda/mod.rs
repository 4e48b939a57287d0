//! The CUDA backend. Its `unsafe` code is fenced: the driver calls outside
//! cudarc's safe API in `driver` (copies to and from raw device addresses,
//! page-locked memory, pointer queries), the kernel launches in `launch`
//! (one typed function per kernel) and `bounce` (the pipelined upload), and the few
//! functions that queue copies which outlive their call (each allows
//! `unsafe` by name, with its SAFETY argument); `tests/architecture.rs`
//! holds that list. libcuda and libnvrtc are loaded at run time, so the
//! crate builds and runs where there is no CUDA; [`available`] says
//! whether a device can be used.
//!
//! Kernels (`kernels/digests.cuh` + `dedup.cu` + `files.cu`) come built ahead of
//! time for the common architectures, or are compiled by NVRTC once per node
//! and cached on disk ([`kernels`]).

mod backend;
mod bounce;
mod device_cache;
mod driver;
mod gathered;
pub mod kernels;
mod launch;
mod pipeline;
mod restore;
mod staging;

pub use backend::{CudaBackend, GpuPending};
pub use device_cache::DeviceCache;
pub(crate) use launch::{DevAddr, Kernels, LevelArgs, TableArgs};
pub use pipeline::{GpuCheckpoint, GpuDedup, GpuTimings, PackedRuns, StoredRun};
pub use restore::{GpuRestoreTimings, restore_on_gpu};
pub use staging::DeviceStaging;

use crate::error::{Error, Result};
use crate::memory::DeviceRegion;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;

/// Kernel source: digests, then the stages, then the file they make.
const SOURCE: &str = concat!(
    include_str!("../../../kernels/digests.cuh"),
    "\n",
    include_str!("../../../kernels/dedup.cu"),
    "\n",
    include_str!("../../../kernels/files.cu")
);

pub(crate) fn cuda_err(e: impl std::fmt::Display) -> Error {
    Error::Gpu(e.to_string())
}

/// Whether libcuda and libnvrtc load and a device is present.
pub fn available() -> bool {
    driver::libraries_present() && CudaContext::device_count().is_ok_and(|n| n > 0)
}

/// A new device buffer holding `bytes` (synchronous).
pub fn upload(gpu: &Gpu, bytes: &[u8]) -> Result<cudarc::driver::CudaSlice<u8>> {
    gpu.stream.clone_htod(bytes).map_err(cuda_err)
}

/// Copies `bytes` into the device buffer `dst` of the same length (synchronous).
pub fn upload_into(gpu: &Gpu, bytes: &[u8], dst: &mut cudarc::driver::CudaSlice<u8>) -> Result<()> {
    if dst.len() != bytes.len() {
        return Err(Error::size_mismatch("host bytes for a device buffer", dst.len() as u64, bytes.len() as u64));
    }
    gpu.stream.memcpy_htod(bytes, dst).map_err(cuda_err)?;
    gpu.stream.synchronize().map_err(cuda_err)
}

impl<'a> DeviceRegion<'a> {
    /// The whole of a cudarc device slice. Waits for the work queued on the
    /// slice's stream first, so that a checkpoint reads what the application
    /// last wrote.
    pub fn of(slice: &'a CudaSlice<u8>) -> Result<Self> {
        let stream = slice.stream();
        stream.synchronize().map_err(cuda_err)?;
        let (ptr, _read) = slice.device_ptr(stream);
        Ok(DeviceRegion::new_unchecked(ptr, slice.len()))
    }

    /// The whole of a cudarc device slice, to restore into. Waits for the
    /// work queued on the slice's stream first.
    pub fn of_mut(slice: &'a mut CudaSlice<u8>) -> Result<Self> {
        Self::of(slice)
    }

    /// A span of device memory given by its address and length (what a C or
    /// Fortran application passes). The CUDA backend checks that the span
    /// lies inside one allocation of its device before reading it.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be CUDA device memory (or managed memory) that
    /// stays allocated, and that no other work writes (or, when dckpt
    /// restores into it, reads), for as long as the region is used (`'a`);
    /// the application's writes to it must be complete (its streams
    /// synchronized) before a checkpoint reads it.
    #[allow(unsafe_code)] // the application vouches for the span (above)
    pub unsafe fn from_raw(ptr: u64, len: usize) -> Self {
        DeviceRegion::new_unchecked(ptr, len)
    }
}

/// Checks that `region` lies inside one allocation on `gpu`'s device: a
/// host pointer, another device's memory or a span past its allocation's
/// end is an error here instead of an illegal-address fault in a kernel.
pub(crate) fn check_region(gpu: &Gpu, region: &DeviceRegion<'_>) -> Result<()> {
    check_region_in(&gpu.ctx, region)
}

/// [`check_region`] on the device of context `ctx`.
pub(crate) fn check_region_in(ctx: &Arc<CudaContext>, region: &DeviceRegion<'_>) -> Result<()> {
    if region.is_empty() {
        return Ok(());
    }
    let (known, (start, size, ordinal)) = match driver::allocation_of(ctx, region)? {
        Some(at) => (true, at),
        None => (false, (0, 0, -1)),
    };
    let end = region.ptr().checked_add(region.len() as u64);
    let ours = usize::try_from(ordinal).is_ok_and(|o| o == ctx.ordinal());
    if !known || !ours || end.is_none_or(|e| e > start.saturating_add(size)) {
        return Err(Error::InvalidOption(format!(
            "device region {:#x}+{} bytes is not inside one allocation of CUDA device {} ({})",
            region.ptr(),
            region.len(),
            ctx.ordinal(),
            if !known {
                "not device memory".to_string()
            } else if !ours {
                format!("it is on device {ordinal}")
            } else {
                format!("its allocation is {size} bytes from {start:#x}")
            }
        )));
    }
    Ok(())
}

/// Number of CUDA devices (0 when the driver or libnvrtc is missing).
pub fn device_count() -> usize {
    if !available() {
        return 0;
    }
    CudaContext::device_count().map_or(0, |n| usize::try_from(n).unwrap_or(0))
}

/// An open device with its compiled kernels.
pub struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) k: Kernels,
    /// Number of multiprocessors (sizes grid-stride launches).
    pub(crate) sms: u32,
    name: String,
    arch: String,
    /// Page-locked buffers for large copies from pageable host memory,
    /// made at the first one.
    bounce: std::sync::Mutex<Option<bounce::Bounce>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("name", &self.name).field("arch", &self.arch).finish()
    }
}

impl Gpu {
    /// The device's copy ceilings, the figures a benchmark compares its
    /// pipeline with: a device-to-device copy of `bytes` (read + write) and
    /// a device-to-host copy into page-locked memory, in GB/s, the best of
    /// three, timed with CUDA events.
    pub fn copy_ceilings(&self, bytes: usize) -> Result<(f64, f64)> {
        let st = &self.stream;
        let src = st.alloc_zeros::<u8>(bytes).map_err(cuda_err)?;
        let mut dst = st.alloc_zeros::<u8>(bytes).map_err(cuda_err)?;
        let mut pinned = driver::pinned_zeroed::<u8>(&self.ctx, bytes)?;
        let ev = || st.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(cuda_err);
        let (mut d2d, mut d2h) = (f64::MAX, f64::MAX);
        for _ in 0..3 {
            let a = ev()?;
            st.memcpy_dtod(&src, &mut dst).map_err(cuda_err)?;
            let b = ev()?;
            st.memcpy_dtoh(&src, &mut pinned).map_err(cuda_err)?;
            let c = ev()?;
            st.synchronize().map_err(cuda_err)?;
            d2d = d2d.min(f64::from(a.elapsed_ms(&b).map_err(cuda_err)?));
            d2h = d2h.min(f64::from(b.elapsed_ms(&c).map_err(cuda_err)?));
        }
        Ok((2.0 * bytes as f64 / d2d / 1e6, bytes as f64 / d2h / 1e6))
    }

    /// Opens device `ordinal`, compiling (or loading cached) kernels.
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>> {
        if !driver::driver_present() {
            return Err(Error::Gpu("libcuda is not installed (no NVIDIA driver found)".into()));
        }
        if !driver::nvrtc_present() {
            return Err(Error::Gpu("libnvrtc is not found (add CUDA's lib64 to LD_LIBRARY_PATH)".into()));
        }
        let ctx = CudaContext::new(ordinal).map_err(cuda_err)?;
        let (major, minor) = ctx.compute_capability().map_err(cuda_err)?;
        let sms = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(cuda_err)? as u32;
        let name = ctx.name().map_err(cuda_err)?;
        let arch = format!("sm_{major}{minor}");
        let module = {
            let _span = crate::profile::Span::new("kernels-load", 0);
            let (module, source) = kernels::load(&ctx, &arch)?;
            let what = match source {
                kernels::KernelSource::Prebuilt => "kernels-prebuilt",
                kernels::KernelSource::Cached => "kernels-cached",
                kernels::KernelSource::Compiled => "kernels-compiled",
            };
            crate::profile::count(what, 0, 1);
            module
        };
        let k = Kernels::load(&module)?;
        let stream = ctx.default_stream();
        Ok(Arc::new(Gpu { ctx, stream, k, sms, name, arch, bounce: std::sync::Mutex::new(None) }))
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device's architecture (`sm_90`, ...).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Copies a device buffer to a new host vector (synchronously).
    pub fn stream_clone_dtoh(&self, src: &cudarc::driver::CudaSlice<u8>) -> Result<Vec<u8>> {
        self.stream.clone_dtoh(src).map_err(cuda_err)
    }

    /// (free, total) device memory in bytes.
    pub fn memory(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().map_err(cuda_err)
    }

    /// Queues the copy of host `bytes` to device address `dst` on `stream`:
    /// a large pageable source through the page-locked bounce buffers
    /// (`bounce`, returning once `bytes` may change), anything else
    /// directly (a page-locked source must then stay unchanged until
    /// `stream` has run the copy). `dst` must span `bytes.len()` bytes of a
    /// live device allocation that no other work touches until `stream` has
    /// run the copy; work queued on `stream` afterwards sees the bytes.
    #[allow(unsafe_code)] // one raw copy; its SAFETY below
    pub(crate) fn upload_to(&self, stream: &CudaStream, bytes: &[u8], dst: DevAddr, dst_len: usize) -> Result<()> {
        if dst_len != bytes.len() {
            return Err(Error::size_mismatch("host bytes for a device buffer", dst_len as u64, bytes.len() as u64));
        }
        self.ctx.bind_to_thread().map_err(cuda_err)?;
        if bounce::Bounce::pays_for(bytes) {
            let mut slot = crate::sync::lock(&self.bounce);
            if slot.is_none() {
                // Where page-locking fails, the driver's own path below.
                *slot = bounce::Bounce::new(&self.ctx).ok();
            }
            if let Some(b) = slot.as_mut() {
                return b.upload(stream, bytes, dst);
            }
        }
        // SAFETY: `dst` is a live device allocation's address (`DevAddr`)
        // spanning `bytes.len()` bytes (checked above) that the caller
        // reserved for this copy; the driver reads a pageable `bytes` before
        // returning, and a page-locked one is read by the time the stream is
        // synchronized below, before the borrow ends.
        unsafe { driver::copy_htod_async(dst, bytes, stream) }?;
        if driver::page_locked(bytes) {
            stream.synchronize().map_err(cuda_err)?;
        }
        Ok(())
    }
}
