//! The CUDA driver calls dckpt makes outside cudarc's safe API, each in
//! one thin function (as cudarc's `result.rs` wraps the driver): the
//! asynchronous copies between host memory and raw device addresses, the
//! page-locked allocations, the registration of host memory, the pointer
//! queries, the probes for the libraries. A function is `unsafe` where its
//! caller must vouch for something the types cannot show (its `# Safety`
//! says what); the others uphold everything themselves.
//!
//! With `launch` (the kernels) and `bounce` (the
//! pipelined upload), this is where the CUDA backend's `unsafe` code is.

#![allow(unsafe_code)]

use super::{DevAddr, cuda_err};
use crate::error::{Error, Result};
use crate::memory::DeviceRegion;
use cudarc::driver::sys::{CUpointer_attribute, CUresult};
use cudarc::driver::{CudaContext, CudaStream, DeviceRepr, PinnedHostSlice, ValidAsZeroBits};
use std::sync::Arc;

/// Whether libcuda and libnvrtc can be loaded.
pub(crate) fn libraries_present() -> bool {
    // SAFETY: only probes whether the shared libraries can be opened.
    unsafe { cudarc::driver::sys::is_culib_present() && cudarc::nvrtc::sys::is_culib_present() }
}

/// Whether libcuda can be loaded.
pub(crate) fn driver_present() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether libnvrtc can be loaded.
pub(crate) fn nvrtc_present() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// `source` compiled by NVRTC with `options` to machine code (cubin), or
/// what failed and why (the compiler's log included).
pub(crate) fn nvrtc_cubin(source: &str, options: &[String]) -> std::result::Result<Vec<u8>, (&'static str, String)> {
    use cudarc::nvrtc::{result, sys};
    let src = std::ffi::CString::new(source).map_err(|e| ("could not read", e.to_string()))?;
    let prog = result::create_program(&src, None).map_err(|e| ("could not create a program of", e.to_string()))?;
    // SAFETY: `prog` was created above and is destroyed only at the end.
    let compiled = unsafe { result::compile_program(prog, options) };
    let out = match compiled {
        Ok(()) => {
            let mut size = 0usize;
            // SAFETY: `prog` is live and compiled; `size` is a valid out-pointer.
            let sized = unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }.result();
            let mut cubin = vec![0u8; size];
            // SAFETY: `cubin` holds the `size` bytes NVRTC said it writes.
            let got = sized.and_then(|()| unsafe { sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()) }.result());
            got.map(|()| cubin).map_err(|e| ("gave no machine code for", e.to_string()))
        }
        Err(e) => {
            // SAFETY: as above.
            let log = unsafe { result::get_program_log(prog) }
                .map(|l| l.iter().take_while(|&&c| c != 0).map(|&c| c as u8 as char).collect::<String>())
                .unwrap_or_default();
            Err(("could not compile", format!("{e}: {log}")))
        }
    };
    // SAFETY: created above, not destroyed before.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// `len` elements of page-locked host memory (not write-combined: the host
/// reads them), zeroed.
pub(crate) fn pinned_zeroed<T: DeviceRepr + ValidAsZeroBits + Default + Copy>(
    ctx: &Arc<CudaContext>,
    len: usize,
) -> Result<PinnedHostSlice<T>> {
    // SAFETY: cudarc returns the memory uninitialized; it is zero-filled
    // here, before any slice of it is read.
    let mut p = unsafe { ctx.alloc_pinned_with_flags::<T>(len, 0) }
        .map_err(|e| Error::Gpu(format!("page-locked host memory ({len} elements): {e}")))?;
    p.as_mut_slice().map_err(cuda_err)?.fill(T::default());
    Ok(p)
}

/// Queues the copy of host `src` to device address `dst` on `stream`.
///
/// # Safety
/// `dst`'s allocation (checked to hold `src.len()` bytes there) stays live,
/// and no other work touches the span, until `stream` has run the copy;
/// `src` stays allocated and unchanged until then (a pageable `src` is
/// read before this returns; a page-locked one is read by the device later).
pub(crate) unsafe fn copy_htod_async(dst: DevAddr, src: &[u8], stream: &CudaStream) -> Result<()> {
    let dst = dst.spanning(src.len() as u64)?;
    // SAFETY: the span is checked above; the rest is the caller's contract.
    unsafe { cudarc::driver::result::memcpy_htod_async(dst.get(), src, stream.cu_stream()) }.map_err(cuda_err)
}

/// Queues the copy of `dst.len()` bytes at device address `src` into host
/// `dst` on `stream`.
///
/// # Safety
/// `src`'s allocation (checked to hold `dst.len()` bytes there) stays live,
/// and nothing writes the span, until `stream` has run the copy; `dst`
/// stays allocated, and nothing reads or writes it, until then.
pub(crate) unsafe fn copy_dtoh_async(dst: &mut [u8], src: DevAddr, stream: &CudaStream) -> Result<()> {
    let src = src.spanning(dst.len() as u64)?;
    // SAFETY: the span is checked above; the rest is the caller's contract.
    unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, src.get(), stream.cu_stream()) }.map_err(cuda_err)
}

/// Queues the copy of `len` bytes from device address `src` to `dst` on
/// `stream`.
///
/// # Safety
/// Both allocations (checked to hold `len` bytes at the addresses) are of
/// `stream`'s context and stay live until `stream` has run the copy;
/// nothing else writes `src`'s span or touches `dst`'s until then.
pub(crate) unsafe fn copy_dtod_async(dst: DevAddr, src: DevAddr, len: usize, stream: &CudaStream) -> Result<()> {
    let (dst, src) = (dst.spanning(len as u64)?, src.spanning(len as u64)?);
    // SAFETY: the spans are checked above; the rest is the caller's contract.
    unsafe { cudarc::driver::result::memcpy_dtod_async(dst.get(), src.get(), len, stream.cu_stream()) }
        .map_err(cuda_err)
}

/// Where a device address lies: the start and size of its allocation and
/// its device's ordinal; `None` when the driver does not know it as device
/// memory.
pub(crate) fn allocation_of(ctx: &Arc<CudaContext>, region: &DeviceRegion<'_>) -> Result<Option<(u64, u64, i32)>> {
    use CUpointer_attribute as A;
    ctx.bind_to_thread().map_err(cuda_err)?;
    let attr = |which: A, out: *mut std::ffi::c_void| -> bool {
        // SAFETY: `out` points to a live local of the size the attribute
        // returns (u64 for addresses and sizes, i32 for the ordinal); the
        // driver only reads `region.ptr()` as a number.
        let status = unsafe { cudarc::driver::sys::cuPointerGetAttribute(out, which, region.ptr()) };
        status == CUresult::CUDA_SUCCESS
    };
    let (mut start, mut size, mut ordinal) = (0u64, 0u64, -1i32);
    let known = attr(A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (&raw mut start).cast())
        && attr(A::CU_POINTER_ATTRIBUTE_RANGE_SIZE, (&raw mut size).cast())
        && attr(A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (&raw mut ordinal).cast());
    Ok(known.then_some((start, size, ordinal)))
}

/// Whether `bytes` starts in page-locked memory the driver knows: allocated
/// page-locked (`cuMemHostAlloc`) or registered (`cuMemHostRegister`, as
/// the host cache's segments are).
pub(crate) fn page_locked(bytes: &[u8]) -> bool {
    use cudarc::driver::sys::{cuMemHostGetDevicePointer_v2, cuMemHostGetFlags};
    let host = bytes.as_ptr().cast_mut().cast::<std::ffi::c_void>();
    let mut flags = 0u32;
    // SAFETY: the driver only looks the address up in its table of
    // page-locked allocations; an unknown address is an error, not a read.
    let allocated = unsafe { cuMemHostGetFlags(&mut flags, host) } == CUresult::CUDA_SUCCESS;
    let mut device = 0;
    // SAFETY: as above, for its table of registered ranges (the device
    // address it writes is not used).
    allocated || unsafe { cuMemHostGetDevicePointer_v2(&mut device, host, 0) } == CUresult::CUDA_SUCCESS
}

/// The calling thread's voluntary and involuntary context switches so far
/// (what `DCKPT_GPU_PROFILE=sync` prints beside each stage).
pub(crate) fn thread_switches() -> [i64; 2] {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `u` is a live, writable rusage the call fills.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, u.as_mut_ptr()) };
    if rc != 0 {
        return [0, 0];
    }
    // SAFETY: zero-initialized, then filled by a successful getrusage.
    let u = unsafe { u.assume_init() };
    [u.ru_nvcsw, u.ru_nivcsw]
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
        let mut alloc = pinned_zeroed::<u8>(ctx, len)?;
        let ptr = alloc.as_mut_ptr().map_err(cuda_err)?;
        Ok(PinnedSegment { alloc, ptr, len })
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

/// A segment of host memory (heap memory written by the allocating thread,
/// or a shared-memory segment, `crate::shm`), page-locked in place with
/// `cuMemHostRegister` (the driver is held only to pin pages already
/// mapped) and unregistered when dropped, before its memory goes.
pub(crate) struct RegisteredSegment {
    inner: crate::memory::Segment,
    ctx: Arc<CudaContext>,
}

impl RegisteredSegment {
    /// `len` bytes of heap memory, zeroed and page-locked.
    pub(crate) fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        Self::pin(ctx, Box::new(crate::memory::HeapSegment::from_boxed(crate::memory::prefaulted_here(len))))
    }

    /// `inner`, its pages already mapped, page-locked.
    pub(crate) fn pin(ctx: &Arc<CudaContext>, mut inner: crate::memory::Segment) -> Result<Self> {
        let bytes = inner.bytes_mut();
        let len = bytes.len();
        ctx.bind_to_thread().map_err(cuda_err)?;
        // SAFETY: `bytes` is live memory of `len` bytes that this segment
        // owns (through `inner`) and unregisters (in `drop`) before `inner`
        // frees or unmaps it.
        let status = unsafe { cudarc::driver::sys::cuMemHostRegister_v2(bytes.as_mut_ptr().cast(), len, 0) };
        if status != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
            return Err(Error::Gpu(format!("page-locking {len} bytes of host memory: {status:?}")));
        }
        Ok(RegisteredSegment { inner, ctx: Arc::clone(ctx) })
    }
}

impl std::fmt::Debug for RegisteredSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredSegment").field("inner", &self.inner).finish()
    }
}

impl crate::memory::SegmentMemory for RegisteredSegment {
    fn bytes(&self) -> &[u8] {
        self.inner.bytes()
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self.inner.bytes_mut()
    }

    fn pinned(&self) -> bool {
        true
    }

    fn shm_name(&self) -> Option<&str> {
        self.inner.shm_name()
    }
}

impl Drop for RegisteredSegment {
    fn drop(&mut self) {
        // May run on a flush thread. No device copy into the bytes is in
        // flight: `GpuDedup::finish` synchronizes before a segment leaves.
        let _ = self.ctx.bind_to_thread();
        // SAFETY: these bytes were registered in `pin` and `inner` still holds them.
        let _ = unsafe { cudarc::driver::sys::cuMemHostUnregister(self.inner.bytes_mut().as_mut_ptr().cast()) };
    }
}
