//! The host cache tier: a budget of host memory, lent out in fixed-size
//! segments to hold diff files until the first disk tier has them. A
//! background thread allocates and touches the segments (never in the
//! application's path, never during a call that asked for quiet), and only
//! as many as the files need: room for two of the largest file yet beside
//! those lent (at least 64 MiB in all), up to the budget. A
//! checkpoint copies its file into segments and returns; the flusher
//! writes them out and gives them back. When every segment is lent and
//! the budget is spent, a checkpoint waits (backpressure) and says how
//! long.
//!
//! A file the cache cannot hold now for a reason other than backpressure
//! is **spilled**: held in heap memory of its own, outside the budget,
//! until the first disk tier has it. That is a file larger than the whole
//! cache (never refused), or one that needs segments the background
//! thread is still making (a checkpoint does not wait for page-locked
//! allocations). One spilled file at a time: the next waits until the
//! previous one is written (and the report says how long). A file that
//! needs more than the cache has set out to make waits for segments (the
//! thread then makes them at once, quiet or not), or on the CUDA backend
//! stays in the GPU cache tier meanwhile ([`HostCache::defer`]).
//!
//! Segments move by ownership (a segment travels with its job), so the
//! application thread and the flusher never share a byte. On the CUDA
//! backend the segments are page-locked ([`crate::memory::SegmentMemory`]):
//! the device copies each diff into them directly ([`HostCache::store_with`]),
//! with no host copy after the D2H. A file the GPU cache tier holds while
//! every segment is lent ([`HostCache::defer`]) takes its segments later,
//! when the flusher first needs its bytes: the application does not wait.

mod pool;

use pool::*;

use crate::backend::{Deferred, DeferredFill, DeferredPeek, Fill, Ready};
use crate::error::{Error, Result};
use crate::memory::{HeapSegment, Segment, SegmentAlloc};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Bytes per segment.
pub const SEGMENT_BYTES: usize = 4 << 20;

/// The host cache.
pub struct HostCache {
    pool: Arc<Pool>,
    segments: usize,
    /// Where a spilled file's segments come from (one heap segment without it).
    spill: Option<SegmentAlloc>,
}

/// A diff file held in cache segments; its segments go back to the cache
/// when it is dropped. A file a device is still copying in carries the
/// wait for it ([`Cached::ready`]): every reader waits first, and so does
/// the drop, before the segments can be lent again. A deferred file
/// ([`HostCache::defer`]) has no segments until its first reader takes
/// them and has the device copy the file in.
pub struct Cached {
    segments: OnceLock<Vec<Segment>>,
    /// Bytes per segment: [`SEGMENT_BYTES`]; for a spilled file (segments of
    /// its own, outside the cache) the whole file's length, or a piece's.
    segment_len: usize,
    /// Whether it is spilled (its segment is freed, not lent again).
    spilled: bool,
    len: usize,
    pool: Arc<Pool>,
    gate: Mutex<Gate>,
    /// Whether the gate is still `Deferred` (read without its lock, which a
    /// reader holds while it waits for room).
    waiting: std::sync::atomic::AtomicBool,
    arrived: OnceLock<std::result::Result<(), String>>,
    /// A deferred file's copy for restores (without taking segments).
    peek: Option<DeferredPeek>,
}

/// What must happen before a cached file's bytes may be read.
enum Gate {
    /// Nothing: the bytes are there (or the outcome is in `arrived`).
    Open,
    /// A copy into the segments is running: wait for it.
    Copying(Ready),
    /// The bytes are elsewhere (the GPU cache tier): take segments, then
    /// copy them in.
    Deferred(DeferredFill),
}

impl std::fmt::Debug for HostCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostCache").field("segments", &self.segments).finish()
    }
}

impl std::fmt::Debug for Cached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let segments = self.segments.get().map_or(0, Vec::len);
        f.debug_struct("Cached").field("len", &self.len).field("segments", &segments).finish()
    }
}

impl Drop for Cached {
    fn drop(&mut self) {
        let gate = std::mem::replace(crate::sync::get_mut(&mut self.gate), Gate::Open);
        // A copy still running must end before the segments are lent again;
        // a deferred file never took any (dropping it frees its GPU copy).
        match gate {
            Gate::Copying(wait) => {
                let _ = wait();
            }
            Gate::Deferred(_) => self.pool.forget_deferred(),
            Gate::Open => {}
        }
        let segments = self.segments.take();
        if self.spilled {
            drop(segments);
            self.pool.unspill();
        } else if let Some(segments) = segments {
            self.pool.put(segments);
        }
    }
}

impl Cached {
    fn new(
        pool: &Arc<Pool>,
        segments: Option<Vec<Segment>>,
        len: usize,
        gate: Gate,
        peek: Option<DeferredPeek>,
    ) -> Cached {
        let cell = OnceLock::new();
        if let Some(segments) = segments {
            let _ = cell.set(segments);
        }
        let waiting = std::sync::atomic::AtomicBool::new(matches!(gate, Gate::Deferred(_)));
        Cached {
            segments: cell,
            segment_len: SEGMENT_BYTES,
            spilled: false,
            len,
            pool: Arc::clone(pool),
            gate: Mutex::new(gate),
            waiting,
            arrived: OnceLock::new(),
            peek,
        }
    }

    /// A copy of a deferred file's bytes, read where they are held (the GPU
    /// cache tier) without taking segments or waiting for room: what a
    /// restore reads while the file waits for the flusher. `None` once the
    /// file is no longer deferred ([`Cached::ready`] then has its bytes
    /// here soon, the copy in having started).
    pub fn peek(&self) -> Result<Option<Vec<u8>>> {
        let Some(peek) = self.peek.as_ref().filter(|_| self.deferred()) else { return Ok(None) };
        let mut bytes = vec![0u8; self.len];
        Ok(peek(&mut bytes)?.then_some(bytes))
    }

    /// Waits until the file's bytes are all there (at once for a file
    /// copied in on the host); an error if the copy failed (every call
    /// after says so too). Call before reading. A deferred file takes its
    /// segments now (waiting for room) and has its bytes copied in.
    pub fn ready(&self) -> Result<()> {
        // Held while waiting: a second reader waits for the same outcome.
        let mut gate = crate::sync::lock(&self.gate);
        match std::mem::replace(&mut *gate, Gate::Open) {
            Gate::Open => {}
            Gate::Copying(wait) => {
                let _ = self.arrived.set(wait().map_err(|e| e.to_string()));
            }
            Gate::Deferred(fill) => {
                let _ = self.arrived.set(self.arrive(fill).map_err(|e| e.to_string()));
                self.waiting.store(false, std::sync::atomic::Ordering::SeqCst);
            }
        }
        drop(gate);
        match self.arrived.get() {
            Some(Err(e)) => Err(Error::Gpu(format!("the copy of a diff into the host cache failed: {e}"))),
            _ => Ok(()),
        }
    }

    /// Takes segments for a deferred file and has `fill` copy it in.
    fn arrive(&self, fill: DeferredFill) -> Result<()> {
        let Lent::Segments(mut segments, _) = self.pool.take(self.len.div_ceil(SEGMENT_BYTES).max(1), true, false)
        else {
            return Err(Error::Internal("a deferred file was lent a spill".into()));
        };
        let mut slices = slices_of(&mut segments, self.len, SEGMENT_BYTES);
        let copied = fill(&mut slices).and_then(|ready| ready.map_or(Ok(()), |wait| wait()));
        drop(slices);
        match copied {
            Ok(()) => {
                let _ = self.segments.set(segments);
                Ok(())
            }
            Err(e) => {
                self.pool.put(segments);
                Err(e)
            }
        }
    }

    /// Whether the file's bytes are not in host memory yet (held by the GPU
    /// cache tier until a reader's [`Cached::ready`] has copied them in).
    /// Never waits.
    pub fn deferred(&self) -> bool {
        self.waiting.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn segments(&self) -> &[Segment] {
        self.segments.get().map_or(&[], Vec::as_slice)
    }

    /// The file's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The file's bytes, segment by segment.
    pub fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        let mut left = self.len;
        self.segments().iter().map(move |s| {
            let s = s.bytes();
            let n = left.min(s.len());
            left -= n;
            &s[..n]
        })
    }

    /// Writes the whole file to `out`.
    pub fn write_to(&self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        self.pieces().try_for_each(|p| out.write_all(p))
    }

    /// Copies the file's bytes `offset..offset + buf.len()` into `buf`;
    /// `None` if they run past the file.
    pub fn read_at(&self, offset: usize, buf: &mut [u8]) -> Option<()> {
        if offset.checked_add(buf.len())? > self.len {
            return None;
        }
        // One piece per segment touched (at most a segment's size: a
        // spill's one segment too), copied in parallel.
        let mut jobs: Vec<(&mut [u8], &[u8])> = Vec::new();
        let mut rest: &mut [u8] = buf;
        let mut at = offset;
        while !rest.is_empty() {
            let seg = self.segments().get(at / self.segment_len)?.bytes();
            let from = at % self.segment_len;
            let n = rest.len().min(seg.len().checked_sub(from)?).min(SEGMENT_BYTES);
            if n == 0 {
                return None;
            }
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(n);
            jobs.push((piece, &seg[from..from + n]));
            rest = tail;
            at += n;
        }
        use rayon::prelude::*;
        jobs.into_par_iter().for_each(|(d, s)| d.copy_from_slice(s));
        Some(())
    }

    /// Whether the file is spilled: held in heap memory of its own, outside
    /// the cache (see the module documentation).
    pub fn spilled(&self) -> bool {
        self.spilled
    }

    /// The file's bytes `range` where they lie in one segment (a spilled
    /// file's: its one heap segment, or one of its pieces), borrowed; `None` where they span segments or run
    /// past the file.
    pub fn contiguous(&self, range: std::ops::Range<usize>) -> Option<&[u8]> {
        if range.end > self.len || range.start > range.end {
            return None;
        }
        let seg = self.segments().get(range.start / self.segment_len)?.bytes();
        let from = range.start % self.segment_len;
        seg.get(from..from + range.len())
    }

    /// Where the file's bytes lie in shared memory (`crate::shm`): its
    /// segments' file names and the bytes per segment; `None` unless every
    /// byte is there now (not deferred, not still arriving, no failed copy)
    /// in segments that all lie in shared memory.
    pub fn shm_layout(&self) -> Option<(Vec<String>, usize)> {
        let gate = self.gate.try_lock().ok()?;
        if !matches!(*gate, Gate::Open) || matches!(self.arrived.get(), Some(Err(_))) {
            return None;
        }
        let names =
            self.segments.get()?.iter().map(|s| s.shm_name().map(str::to_string)).collect::<Option<Vec<_>>>()?;
        Some((names, self.segment_len))
    }

    /// The last 32 bytes (a diff file's trailer).
    pub fn trailer(&self) -> Option<[u8; 32]> {
        let start = self.len.checked_sub(32)?;
        let mut t = [0u8; 32];
        for (k, b) in t.iter_mut().enumerate() {
            let at = start + k;
            *b = *self.segments().get(at / self.segment_len)?.bytes().get(at % self.segment_len)?;
        }
        Some(t)
    }
}

impl HostCache {
    /// A cache of `bytes` (rounded up to whole segments, at least one) of
    /// heap memory, made by a background thread.
    pub fn new(bytes: u64) -> Result<Self> {
        Self::with_memory(bytes, None)
    }

    /// A cache of `bytes` whose segments `alloc` makes (heap memory without
    /// it, or once it fails: a cache that cannot be page-locked still
    /// works, only its copies are slower). A background thread makes them
    /// one by one as the files need them (see the module documentation); a
    /// file that needs segments still being made is spilled meanwhile
    /// ([`Cached::spilled`]), so no checkpoint waits for an allocation.
    pub fn with_memory(bytes: u64, alloc: Option<SegmentAlloc>) -> Result<Self> {
        Self::make(bytes, alloc, false)
    }

    /// [`HostCache::with_memory`], its thread making nothing until
    /// [`HostCache::release`] (or a file waiting for segments): a store
    /// opened for a restart restores before anything is allocated beside it.
    pub fn held(bytes: u64, alloc: Option<SegmentAlloc>) -> Result<Self> {
        Self::make(bytes, alloc, true)
    }

    /// Spilled files' segments from `alloc` from now on (shared memory, for
    /// the agent), not the heap.
    pub fn spill_into(&mut self, alloc: SegmentAlloc) {
        self.spill = Some(alloc);
    }

    /// Lets the background thread make the segments (once held).
    pub fn release(&self) {
        let mut st = self.pool.lock();
        if st.held {
            st.held = false;
            drop(st);
            self.pool.returned.notify_all();
        }
    }

    fn make(bytes: u64, alloc: Option<SegmentAlloc>, held: bool) -> Result<Self> {
        let segments = usize::try_from(bytes.div_ceil(SEGMENT_BYTES as u64))
            .map_err(|_| Error::InvalidOption(format!("host cache of {bytes} bytes")))?
            .max(1);
        let state = PoolState {
            free: Vec::new(),
            deferred: 0,
            made: 0,
            pinned: 0,
            total: segments,
            spilled: false,
            quiet: 0,
            allocating: false,
            waiting: 0,
            held,
            wanted: FIRST_SEGMENTS.min(segments),
            largest: 0,
            closed: false,
        };
        let pool = Arc::new(Pool { state: Mutex::new(state), returned: Condvar::new() });
        let weak = Arc::downgrade(&pool);
        std::thread::Builder::new()
            .name("dckpt-cache-alloc".into())
            .spawn(move || make_segments(&weak, segments, alloc))
            .map_err(|e| Error::no_thread("the host cache's allocation thread", e))?;
        Ok(HostCache { pool, segments, spill: None })
    }

    /// Waits until the background thread has made every segment (tests and
    /// benchmarks that must not see spills).
    pub fn wait_made(&self) {
        self.release();
        let mut st = self.pool.lock();
        st.wanted = st.total;
        self.pool.returned.notify_all();
        while st.made < st.total {
            st = crate::sync::wait(&self.pool.returned, st);
        }
    }

    /// Keeps the background thread from starting a page-locked allocation
    /// until the returned guard is dropped, after waiting for the one it
    /// may be making (one segment, a few milliseconds). Page-locking holds
    /// the CUDA driver, process-wide: a kernel launch issued meanwhile
    /// waits for it, so a checkpoint's pipeline asks for quiet while it
    /// runs. The thread still allocates while a file waits for segments.
    pub fn quiet(&self) -> Quiet {
        let t = Instant::now();
        let mut st = self.pool.lock();
        st.quiet += 1;
        while st.allocating && st.waiting == 0 {
            st = crate::sync::wait(&self.pool.returned, st);
        }
        drop(st);
        Quiet { pool: Arc::clone(&self.pool), waited: t.elapsed() }
    }

    /// Bytes of page-locked segments made so far.
    pub fn pinned_bytes(&self) -> u64 {
        (self.pool.lock().pinned * SEGMENT_BYTES) as u64
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        (self.segments * SEGMENT_BYTES) as u64
    }

    /// Bytes lent out now (a spilled file is outside the cache and not counted).
    pub fn in_use(&self) -> u64 {
        let st = self.pool.lock();
        ((st.made - st.free.len()) * SEGMENT_BYTES) as u64
    }

    /// Copies a file given as consecutive `parts` into cache segments, the
    /// segments in parallel; waits while the cache is full (or spills it:
    /// see the module documentation). Returns the cached file and the time
    /// spent waiting.
    pub fn store_parts(&self, parts: &[&[u8]]) -> Result<(Cached, Duration)> {
        use rayon::prelude::*;
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let (mut segments, seg_len, waited, spill) = self.lend(len);
        let spilled = (spill, seg_len);
        // Copied in pieces of at most a segment's size, in parallel (a
        // spill's one segment too).
        let mut pieces: Vec<(usize, &mut [u8])> = Vec::new();
        for (i, seg) in segments.iter_mut().enumerate() {
            let (lo, hi) = (i * seg_len, ((i + 1) * seg_len).min(len));
            let mut at = lo;
            for piece in seg.bytes_mut()[..hi - lo].chunks_mut(SEGMENT_BYTES) {
                let n = piece.len();
                pieces.push((at, piece));
                at += n;
            }
        }
        pieces.into_par_iter().for_each(|(at, piece)| copy_parts(parts, at, piece));
        Ok((self.cached(segments, len, Gate::Open, None, spilled), waited))
    }

    /// A file of `len` bytes that `fill` writes straight into cache
    /// segments (given as consecutive slices totalling `len` bytes); waits
    /// while the cache is full (or spills it). The cached file and the time
    /// spent waiting; on an error the segments go back.
    pub fn store_with(&self, len: usize, fill: &mut Fill<'_>) -> Result<(Cached, Duration)> {
        let (mut segments, seg_len, waited, spill) = self.lend(len);
        let spilled = (spill, seg_len);
        let mut slices = slices_of(&mut segments, len, seg_len);
        let ready = match fill(&mut slices) {
            Ok(ready) => ready,
            Err(e) => {
                drop(slices);
                // Dropped as a file, so that a spill's right goes back too.
                drop(self.cached(segments, len, Gate::Open, None, spilled));
                return Err(e);
            }
        };
        drop(slices);
        let gate = ready.map_or(Gate::Open, Gate::Copying);
        Ok((self.cached(segments, len, gate, None, spilled), waited))
    }

    /// A file of `len` bytes held elsewhere for now (the GPU cache tier):
    /// it takes no segments until its first reader ([`Cached::ready`],
    /// the flusher) waits for room and has its fill copy it in (a restore
    /// reads it where it is meanwhile: [`Cached::peek`]). Returns at
    /// once; a file larger than the whole cache is spilled now instead
    /// (filled outside the cache, which may wait for the previous spill).
    pub fn defer(&self, len: usize, file: Deferred) -> Result<Cached> {
        if len.div_ceil(SEGMENT_BYTES) > self.segments {
            let mut once = Some(file.fill);
            let (cached, _) = self.store_with(len, &mut |bufs| {
                once.take().ok_or_else(|| Error::Internal("a deferred file was filled twice".into()))?(bufs)
            })?;
            return Ok(cached);
        }
        let mut st = self.pool.lock();
        st.deferred += 1;
        st.grow_for(len.div_ceil(SEGMENT_BYTES).max(1)); // made before its reader asks
        drop(st);
        self.pool.returned.notify_all();
        Ok(Cached::new(&self.pool, None, len, Gate::Deferred(file.fill), Some(file.peek)))
    }

    /// Whether a file of `len` bytes would be taken now without waiting for
    /// the flusher: enough segments are free and no deferred file waits for
    /// its own (segments go in the order files came), or it would be
    /// spilled. Only the checkpointing thread takes segments for new
    /// files, so the answer holds for its next take.
    pub fn has_room(&self, len: usize) -> bool {
        let need = len.div_ceil(SEGMENT_BYTES).max(1);
        let st = self.pool.lock();
        let turn = st.deferred == 0;
        (st.free.len() >= need && turn) || st.may_spill(need, turn)
    }

    /// Segments (or a spill's own) for a file of `len` bytes: the segments,
    /// the bytes per segment, the wait, and whether it spilled.
    fn lend(&self, len: usize) -> (Vec<Segment>, usize, Duration, bool) {
        let need = len.div_ceil(SEGMENT_BYTES).max(1);
        match self.pool.take(need, false, true) {
            Lent::Segments(segments, waited) => (segments, SEGMENT_BYTES, waited, false),
            Lent::Spill(waited) => {
                let len = len.max(1);
                if let Some(alloc) = &self.spill {
                    match spill_pieces(alloc, len) {
                        Ok(pieces) => return (pieces, SPILL_PIECE.min(len), waited, true),
                        Err(e) => tracing::debug!("a spill in shared memory: {e}; on the heap instead"),
                    }
                }
                (vec![Box::new(HeapSegment::prefaulted(len))], len, waited, true)
            }
        }
    }

    /// A cached file over `segments` of `seg_len` bytes each (a spill's own
    /// where `spilled`).
    fn cached(
        &self,
        segments: Vec<Segment>,
        len: usize,
        gate: Gate,
        peek: Option<DeferredPeek>,
        spilled: (bool, usize),
    ) -> Cached {
        let mut c = Cached::new(&self.pool, Some(segments), len, gate, peek);
        if spilled.0 {
            c.spilled = true;
            c.segment_len = spilled.1;
        }
        c
    }
}

/// Bytes per piece of a spill made by a segment allocator (shared memory:
/// one file each, so that pieces are reserved and mapped on every core at
/// once; a single file's space is reserved by one thread at a time).
const SPILL_PIECE: usize = 64 << 20;

/// A spill of `len` bytes in pieces of [`SPILL_PIECE`] from `alloc`, made in parallel.
fn spill_pieces(alloc: &SegmentAlloc, len: usize) -> Result<Vec<Segment>> {
    use rayon::prelude::*;
    (0..len.div_ceil(SPILL_PIECE)).into_par_iter().map(|i| alloc(SPILL_PIECE.min(len - i * SPILL_PIECE))).collect()
}

/// Copies bytes `lo..lo + dst.len()` of the file given as consecutive
/// `parts` into `dst`.
fn copy_parts(parts: &[&[u8]], lo: usize, dst: &mut [u8]) {
    let hi = lo + dst.len();
    let mut at = 0; // start of the current part in the file
    for p in parts {
        let (plo, phi) = (at, at + p.len());
        at = phi;
        let (s, e) = (lo.max(plo), hi.min(phi));
        if s < e {
            dst[s - lo..e - lo].copy_from_slice(&p[s - plo..e - plo]);
        }
    }
}

impl Drop for HostCache {
    /// Stops the background thread (the files still cached keep their
    /// segments until they are dropped).
    fn drop(&mut self) {
        self.pool.lock().closed = true;
        self.pool.returned.notify_all();
    }
}

/// A call's quiet ([`HostCache::quiet`]): no page-locked allocation
/// starts until it is dropped.
#[derive(Debug)]
pub struct Quiet {
    pool: Arc<Pool>,
    /// How long the call waited for an allocation in progress.
    pub waited: Duration,
}

impl Drop for Quiet {
    fn drop(&mut self) {
        self.pool.lock().quiet -= 1;
        self.pool.returned.notify_all();
    }
}

#[cfg(test)]
mod tests;
