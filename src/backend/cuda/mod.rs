//! The CUDA backend. This module is the one place with `unsafe`: kernel
//! launches and pinned allocations through cudarc. libcuda and libnvrtc are
//! loaded at run time, so the crate builds and runs where there is no CUDA;
//! [`available`] says whether a device can be used.
//!
//! Kernels (`kernels/digests.cuh` + `dedup.cu` + `files.cu`) come built ahead of
//! time for the common architectures, or are compiled by NVRTC once per node
//! and cached on disk ([`kernels`]).

#![allow(unsafe_code)]

mod backend;
mod bounce;
mod device_cache;
mod gathered;
pub mod kernels;
mod pipeline;
mod restore;
mod staging;

pub use backend::{CudaBackend, GpuPending};
pub use device_cache::DeviceCache;
pub use pipeline::{GpuCheckpoint, GpuDedup, GpuTimings, PackedRuns, StoredRun};
pub use restore::{GpuRestoreTimings, restore_on_gpu};
pub use staging::DeviceStaging;

use crate::error::{Error, Result};
use crate::memory::DeviceRegion;
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr};
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
    // SAFETY: only probes whether the shared libraries can be opened.
    let libs = unsafe { cudarc::driver::sys::is_culib_present() && cudarc::nvrtc::sys::is_culib_present() };
    libs && CudaContext::device_count().is_ok_and(|n| n > 0)
}

/// A buffer of page-locked host memory allocated by the driver
/// (`cuMemHostAlloc`; the pageable copies' bounce buffers).
pub(crate) struct PinnedSegment {
    alloc: cudarc::driver::PinnedHostSlice<u8>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: `ptr` points into `alloc`, which the segment owns (cudarc's pinned
// allocations are Send and Sync); the bytes are reached only through `&self`
// and `&mut self`, so Rust's borrow rules order every access.
unsafe impl Send for PinnedSegment {}
// SAFETY: as above.
unsafe impl Sync for PinnedSegment {}

impl PinnedSegment {
    /// `len` page-locked bytes (not write-combined: the host reads them to
    /// write files), zeroed.
    pub(crate) fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        // SAFETY: the allocation is zeroed below before any of it is read.
        let mut alloc = unsafe { ctx.alloc_pinned_with_flags::<u8>(len, 0) }.map_err(cuda_err)?;
        let ptr = alloc.as_mut_ptr().map_err(cuda_err)?;
        let mut s = PinnedSegment { alloc, ptr, len };
        s.bytes_mut_raw().fill(0);
        Ok(s)
    }

    fn bytes_mut_raw(&mut self) -> &mut [u8] {
        // SAFETY: `ptr..ptr + len` is the live allocation `alloc` owns, and
        // `&mut self` makes this the only reference to it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl std::fmt::Debug for PinnedSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedSegment").field("len", &self.len).finish()
    }
}

impl crate::memory::SegmentMemory for PinnedSegment {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` is the live allocation `alloc` owns; `&self`
        // excludes any `&mut` access for the borrow's duration. No device
        // copy into it is in flight: `GpuDedup::finish` synchronizes the
        // stream before the segment leaves the backend.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self.bytes_mut_raw()
    }

    fn pinned(&self) -> bool {
        true
    }
}

impl Drop for PinnedSegment {
    fn drop(&mut self) {
        // The free (in cudarc's drop) may run on a flush thread.
        let _ = self.alloc.context().bind_to_thread();
    }
}

/// A segment of heap memory, written by the allocating thread, then
/// page-locked in place with `cuMemHostRegister` (the driver is held only
/// to pin pages already mapped) and unregistered when dropped.
pub(crate) struct RegisteredSegment {
    bytes: Box<[u8]>,
    ctx: Arc<CudaContext>,
}

impl RegisteredSegment {
    /// `len` bytes, zeroed and page-locked.
    pub(crate) fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        let mut bytes = crate::memory::prefaulted_here(len);
        ctx.bind_to_thread().map_err(cuda_err)?;
        // SAFETY: `bytes` is a live allocation of `len` bytes that this
        // segment owns and unregisters (in `drop`) before freeing it.
        let status = unsafe { cudarc::driver::sys::cuMemHostRegister_v2(bytes.as_mut_ptr().cast(), len, 0) };
        if status != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
            return Err(Error::Gpu(format!("page-locking {len} bytes of host memory: {status:?}")));
        }
        Ok(RegisteredSegment { bytes, ctx: Arc::clone(ctx) })
    }
}

impl std::fmt::Debug for RegisteredSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredSegment").field("len", &self.bytes.len()).finish()
    }
}

impl crate::memory::SegmentMemory for RegisteredSegment {
    fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }

    fn pinned(&self) -> bool {
        true
    }
}

impl Drop for RegisteredSegment {
    fn drop(&mut self) {
        // May run on a flush thread. No device copy into the bytes is in
        // flight: `GpuDedup::finish` synchronizes before a segment leaves.
        let _ = self.ctx.bind_to_thread();
        // SAFETY: `bytes` was registered in `new` and is still allocated.
        let _ = unsafe { cudarc::driver::sys::cuMemHostUnregister(self.bytes.as_mut_ptr().cast()) };
    }
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
    use cudarc::driver::sys::{CUpointer_attribute as A, cuPointerGetAttribute};
    if region.is_empty() {
        return Ok(());
    }
    ctx.bind_to_thread().map_err(cuda_err)?;
    let attr = |which: A, out: *mut std::ffi::c_void| -> bool {
        // SAFETY: `out` points to a live local of the size the attribute
        // returns (u64 for addresses and sizes, i32 for the ordinal); the
        // driver only reads `region.ptr()` as a number.
        let status = unsafe { cuPointerGetAttribute(out, which, region.ptr()) };
        status == cudarc::driver::sys::cudaError_enum::CUDA_SUCCESS
    };
    let (mut start, mut size, mut ordinal) = (0u64, 0u64, -1i32);
    let known = attr(A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (&raw mut start).cast())
        && attr(A::CU_POINTER_ATTRIBUTE_RANGE_SIZE, (&raw mut size).cast())
        && attr(A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (&raw mut ordinal).cast());
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

/// The kernels of `dedup.cu`.
pub(crate) struct Kernels {
    pub leaf_pass: [CudaFunction; 3],
    pub flag_ballot: CudaFunction,
    pub compact_flags: CudaFunction,
    pub scan_tiles: CudaFunction,
    pub scan_sums: CudaFunction,
    pub scan_add: CudaFunction,
    pub insert_leaves: CudaFunction,
    pub label_leaves: CudaFunction,
    pub stage1: CudaFunction,
    pub stage2: CudaFunction,
    pub top_root: CudaFunction,
    pub root_info: CudaFunction,
    pub run_heads: CudaFunction,
    pub emit_runs: CudaFunction,
    pub finish_runs: CudaFunction,
    pub first_roots: CudaFunction,
    pub gather: CudaFunction,
    pub write_header: CudaFunction,
    pub write_bitmap: CudaFunction,
    pub commit_leaves: CudaFunction,
    pub table_rollback: CudaFunction,
    pub block_digests: CudaFunction,
    pub table_locate: CudaFunction,
    pub gather_digests: CudaFunction,
    pub region_digests: CudaFunction,
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
        // SAFETY: page-locked memory the copies below write before anything reads it.
        let mut pinned = unsafe { self.ctx.alloc_pinned_with_flags::<u8>(bytes, 0) }.map_err(cuda_err)?;
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
        // SAFETY: probes whether the shared libraries can be opened.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::Gpu("libcuda is not installed (no NVIDIA driver found)".into()));
        }
        // SAFETY: as above.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
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
        let f = |name: &str| module.load_function(name).map_err(|e| Error::Gpu(format!("kernel {name}: {e}")));
        let k = Kernels {
            leaf_pass: [f("leaf_pass_murmur3")?, f("leaf_pass_xxh3")?, f("leaf_pass_blake3")?],
            flag_ballot: f("flag_ballot")?,
            compact_flags: f("compact_flags")?,
            scan_tiles: f("scan_tiles")?,
            scan_sums: f("scan_sums")?,
            scan_add: f("scan_add")?,
            insert_leaves: f("insert_leaves")?,
            label_leaves: f("label_leaves")?,
            stage1: f("stage1")?,
            stage2: f("stage2")?,
            top_root: f("top_root")?,
            root_info: f("root_info")?,
            run_heads: f("run_heads")?,
            emit_runs: f("emit_runs")?,
            finish_runs: f("finish_runs")?,
            first_roots: f("first_roots")?,
            gather: f("gather")?,
            write_header: f("write_header")?,
            write_bitmap: f("write_bitmap")?,
            commit_leaves: f("commit_leaves")?,
            table_rollback: f("table_rollback")?,
            block_digests: f("block_digests")?,
            table_locate: f("table_locate")?,
            gather_digests: f("gather_digests")?,
            region_digests: f("region_digests")?,
        };
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
    pub(crate) fn upload_to(&self, stream: &CudaStream, bytes: &[u8], dst: u64) -> Result<()> {
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
        // SAFETY: `dst` spans `bytes.len()` bytes of a live device allocation
        // reserved for this copy (the caller's contract); the driver reads a
        // pageable `bytes` before returning, and the caller keeps a
        // page-locked one unchanged until the stream has run the copy.
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, bytes, stream.cu_stream()) }.map_err(cuda_err)
    }
}

/// The record table as the kernels see it (`struct Table` in dedup.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct TableArgs {
    pub slots: u64,
    pub mask: u64,
    pub count: u64,
    pub overflow: u64,
    pub limit: u64,
}

// SAFETY: plain-old-data of device pointers and integers, laid out as the
// kernel's `struct Table`.
unsafe impl DeviceRepr for TableArgs {}

/// Per-level node arrays as the kernels see them (`struct Levels`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct LevelArgs {
    pub lab: u64,
    pub dig: u64,
    pub sver: u64,
    pub snode: u64,
}

// SAFETY: as for TableArgs.
unsafe impl DeviceRepr for LevelArgs {}
