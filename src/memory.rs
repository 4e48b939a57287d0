//! The memory a checkpoint protects: host bytes, or a span of CUDA device
//! memory that the application owns. This is the one input type of the
//! engine and the backends; no cudarc type appears in it.
//!
//! A [`DeviceRegion`] is made at the API edge: from a cudarc slice
//! ([`DeviceRegion::of`], safe) or from a raw `CUdeviceptr` and a length
//! ([`DeviceRegion::from_raw`], `unsafe`: the caller vouches that the span is
//! device memory that stays allocated and unwritten while dckpt reads it —
//! what a C or Fortran application passes). Both live in the CUDA backend,
//! the one layer with `unsafe`; the CUDA backend also checks, before it
//! launches anything, that the span lies inside one allocation of its own
//! device (a clear error instead of an illegal-address fault).

use std::marker::PhantomData;

/// A span of device memory borrowed from the application for `'a`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceRegion<'a> {
    ptr: u64,
    len: usize,
    _borrow: PhantomData<&'a [u8]>,
}

impl DeviceRegion<'_> {
    /// Builds a region without any check; the public constructors (in the
    /// CUDA backend) establish what it promises.
    pub(crate) fn new_unchecked(ptr: u64, len: usize) -> Self {
        DeviceRegion { ptr, len, _borrow: PhantomData }
    }

    /// The device address of the first byte (a `CUdeviceptr`).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Bytes in the span.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the span is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// What one checkpoint reads: host memory or device memory.
#[derive(Clone, Copy, Debug)]
pub enum Protected<'a> {
    /// Host memory (the CUDA backend copies it to the device first).
    Host(&'a [u8]),
    /// Device memory (the CUDA backend only).
    Device(DeviceRegion<'a>),
}

impl<'a> Protected<'a> {
    /// Bytes protected.
    pub fn len(&self) -> usize {
        match self {
            Protected::Host(b) => b.len(),
            Protected::Device(d) => d.len(),
        }
    }

    /// Whether nothing is protected.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The host bytes, or an empty slice for device memory (the CPU engine
    /// reads FIRST bytes from here; the GPU carries its own).
    pub fn host_bytes(&self) -> &'a [u8] {
        match self {
            Protected::Host(b) => b,
            Protected::Device(_) => &[],
        }
    }
}

/// Host bytes: `&[u8]`, `&Vec<u8>`, `&[u8; N]`, ...
impl<'a, T: AsRef<[u8]> + ?Sized> From<&'a T> for Protected<'a> {
    fn from(bytes: &'a T) -> Self {
        Protected::Host(bytes.as_ref())
    }
}

impl<'a> From<DeviceRegion<'a>> for Protected<'a> {
    fn from(region: DeviceRegion<'a>) -> Self {
        Protected::Device(region)
    }
}

/// Where restored bytes go: host memory, or device memory (the CUDA backend
/// only).
#[derive(Debug)]
pub enum ProtectedMut<'a> {
    /// Host memory.
    Host(&'a mut [u8]),
    /// Device memory, written by the CUDA backend.
    Device(DeviceRegion<'a>),
}

impl ProtectedMut<'_> {
    /// Bytes it holds.
    pub fn len(&self) -> usize {
        match self {
            ProtectedMut::Host(b) => b.len(),
            ProtectedMut::Device(d) => d.len(),
        }
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Host memory a cache lends in fixed-size segments: ordinary heap memory,
/// or page-locked memory the device copies into directly (the CUDA
/// backend's, [`crate::backend::Backend::host_segments`]).
pub trait SegmentMemory: Send + Sync + std::fmt::Debug {
    /// The segment's bytes.
    fn bytes(&self) -> &[u8];
    /// The segment's bytes, to fill.
    fn bytes_mut(&mut self) -> &mut [u8];
    /// Whether the memory is page-locked (a device copies into it at full speed).
    fn pinned(&self) -> bool {
        false
    }
    /// The segment's file name in its shared-memory directory, if it lies
    /// in one (`crate::shm`): what the journal names for the agent.
    fn shm_name(&self) -> Option<&str> {
        None
    }
}

/// A segment of heap memory.
#[derive(Debug)]
pub struct HeapSegment(Box<[u8]>);

impl HeapSegment {
    /// A segment over bytes already made.
    pub(crate) fn from_boxed(bytes: Box<[u8]>) -> Self {
        HeapSegment(bytes)
    }

    /// A segment of `len` bytes, written now (so that no later use pays its
    /// page faults).
    pub fn new(len: usize) -> Self {
        HeapSegment(vec![0xa5u8; len].into_boxed_slice())
    }

    /// A segment of `len` zero bytes whose pages are mapped now by every
    /// core at once (a file spilled outside a cache, which a device then
    /// copies into without paying a page fault per page on one thread).
    pub fn prefaulted(len: usize) -> Self {
        use rayon::prelude::*;
        const PAGE: usize = 4096;
        let mut bytes = vec![0u8; len].into_boxed_slice();
        // A zero the compiler cannot see: a store of a known zero into
        // zeroed memory could be dropped, and the page left unmapped.
        bytes
            .par_chunks_mut(1 << 21)
            .for_each(|c| c.iter_mut().step_by(PAGE).for_each(|b| *b = std::hint::black_box(0)));
        HeapSegment(bytes)
    }
}

/// Drops `value` on a thread of its own instead of the caller's: a large
/// structure (a decoded diff's run lists, a give-away's conversions) gives
/// its memory back to the system in milliseconds that no call should wait
/// for. One process-wide thread takes them in order; where it cannot be
/// started, `value` is dropped here.
pub fn drop_later<T: Send + 'static>(value: T) {
    use std::sync::mpsc::{Sender, channel};
    use std::sync::{Mutex, OnceLock};
    type Dropped = Box<dyn Send>;
    static LATER: OnceLock<Option<Mutex<Sender<Dropped>>>> = OnceLock::new();
    let later = LATER.get_or_init(|| {
        let (send, take) = channel::<Dropped>();
        std::thread::Builder::new()
            .name("dckpt-drop".into())
            .spawn(move || take.into_iter().for_each(drop))
            .ok()
            .map(|_| Mutex::new(send))
    });
    let value: Dropped = Box::new(value);
    match later {
        Some(send) => {
            let send = crate::sync::lock(send);
            // A send fails only if the thread is gone: the value comes back and drops here.
            let _ = send.send(value);
        }
        None => drop(value),
    }
}

/// `len` zero bytes whose pages are mapped now, by the calling thread.
pub(crate) fn prefaulted_here(len: usize) -> Box<[u8]> {
    const PAGE: usize = 4096;
    let mut bytes = vec![0u8; len].into_boxed_slice();
    // As in `HeapSegment::prefaulted`: a zero the compiler cannot drop.
    bytes.iter_mut().step_by(PAGE).for_each(|b| *b = std::hint::black_box(0));
    bytes
}

impl SegmentMemory for HeapSegment {
    fn bytes(&self) -> &[u8] {
        &self.0
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

/// One segment of host memory.
pub type Segment = Box<dyn SegmentMemory>;

/// Allocates a segment of the given length.
pub type SegmentAlloc = Box<dyn Fn(usize) -> crate::error::Result<Segment> + Send + Sync>;

/// Copies `src` into `dst` (of the same length), 1 MiB pieces in parallel
/// (one core's memcpy is the slowest stage of a restore's reads and of a
/// large copy).
pub(crate) fn parallel_copy(dst: &mut [u8], src: &[u8]) {
    use rayon::prelude::*;
    dst.par_chunks_mut(1 << 20).zip(src.par_chunks(1 << 20)).for_each(|(d, s)| d.copy_from_slice(s));
}
