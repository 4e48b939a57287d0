//! The host cache tier: a budget of host memory, allocated and touched
//! by a background thread from the moment the tiers open (never in the
//! application's path), lent out in fixed-size segments to hold diff
//! files until the first disk tier has them. A checkpoint copies its file
//! into segments and returns; the flusher writes them out and gives them
//! back. When every segment is lent, a checkpoint waits (backpressure) and
//! says how long.
//!
//! A file the cache cannot hold now for a reason other than backpressure
//! is **spilled**: held in heap memory of its own, outside the budget,
//! until the first disk tier has it. That is a file larger than the whole
//! cache (never refused), or one that needs segments the background
//! thread has not made yet (the first checkpoints after opening do not
//! wait for page-locked allocations). One spilled file at a time: the next
//! waits until the previous one is written (and the report says how long).
//!
//! Segments move by ownership (a segment travels with its job), so the
//! application thread and the flusher never share a byte. On the CUDA
//! backend the segments are page-locked ([`crate::memory::SegmentMemory`]):
//! the device copies each diff into them directly ([`HostCache::store_with`]),
//! with no host copy after the D2H. A file the GPU cache tier holds while
//! every segment is lent ([`HostCache::defer`]) takes its segments later,
//! when the flusher first needs its bytes: the application does not wait.

use crate::backend::{Deferred, DeferredFill, DeferredPeek, Fill, Ready};
use crate::memory::{HeapSegment, Segment, SegmentAlloc};
use crate::{Error, Result};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// Bytes per segment.
pub const SEGMENT_BYTES: usize = 4 << 20;

/// The host cache.
#[derive(Debug)]
pub struct HostCache {
    pool: Arc<Pool>,
    segments: usize,
}

/// The segments not lent out, and the deferred files still waiting for
/// theirs. Segments are lent in the order files came: while a deferred file
/// waits, no later file takes any (it is deferred too, or waits), so every
/// file holding segments is older than every deferred one, and the flusher,
/// which serves files in order, always finds the segments it waits for
/// coming back.
#[derive(Debug)]
struct Pool {
    state: Mutex<PoolState>,
    returned: Condvar,
}

#[derive(Debug)]
struct PoolState {
    free: Vec<Segment>,
    /// Deferred files that have taken no segments yet.
    deferred: usize,
    /// Segments made so far (the background thread makes the rest).
    made: usize,
    /// Page-locked segments among them.
    pinned: usize,
    /// Segments the cache will have.
    total: usize,
    /// Whether a spilled file is alive (one at a time).
    spilled: bool,
    /// Calls that asked for quiet ([`HostCache::quiet`]).
    quiet: usize,
    /// Whether the background thread is page-locking a segment now.
    allocating: bool,
    /// Takers waiting for segments (the background thread then goes on
    /// allocating, quiet or not: they may need what it makes).
    waiting: usize,
}

/// What [`Pool::take`] lends.
enum Lent {
    /// Segments, and how long the caller waited for them.
    Segments(Vec<Segment>, Duration),
    /// The right to spill one file outside the cache, and how long the
    /// caller waited for it.
    Spill(Duration),
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes `need` segments, waiting until that many are free (and, for a
    /// file that was not deferred, until no deferred file waits before it).
    /// Where `may_spill`, lends the right to spill instead of waiting when
    /// the file can never fit (`need` over the total) or when the segments
    /// it lacks are not made yet: once no other spilled file is alive.
    fn take(&self, need: usize, deferred: bool, may_spill: bool) -> Lent {
        let t = Instant::now();
        let mut st = self.lock();
        loop {
            let turn = deferred || st.deferred == 0;
            if need <= st.free.len() && turn {
                break;
            }
            let unmade = st.total - st.made;
            let spill = need > st.total || (turn && need <= st.free.len() + unmade);
            if may_spill && spill && !st.spilled {
                st.spilled = true;
                return Lent::Spill(t.elapsed());
            }
            if st.waiting == 0 {
                self.returned.notify_all(); // the allocation may go on now
            }
            st.waiting += 1;
            st = self.returned.wait(st).unwrap_or_else(PoisonError::into_inner);
            st.waiting -= 1;
        }
        if deferred {
            st.deferred -= 1;
        }
        let at = st.free.len() - need;
        let taken = st.free.drain(at..).collect();
        drop(st);
        self.returned.notify_all();
        Lent::Segments(taken, t.elapsed())
    }

    /// A spilled file is gone: the next may spill.
    fn unspill(&self) {
        self.lock().spilled = false;
        self.returned.notify_all();
    }

    /// Waits until no call asked for quiet (or a taker waits for
    /// segments), then marks a page-locking allocation as running.
    fn begin_allocation(&self) {
        let mut st = self.lock();
        while st.quiet > 0 && st.waiting == 0 {
            st = self.returned.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
        st.allocating = true;
    }

    /// Adds a segment the background thread made (its allocation ended).
    fn add_made(&self, segment: Segment) {
        let mut st = self.lock();
        st.allocating = false;
        st.made += 1;
        st.pinned += usize::from(segment.pinned());
        st.free.push(segment);
        drop(st);
        self.returned.notify_all();
    }

    /// A deferred file that will never take segments (dropped unread).
    fn forget_deferred(&self) {
        let mut st = self.lock();
        st.deferred = st.deferred.saturating_sub(1);
        drop(st);
        self.returned.notify_all();
    }

    fn put(&self, segments: Vec<Segment>) {
        if segments.is_empty() {
            return;
        }
        self.lock().free.extend(segments);
        self.returned.notify_all();
    }
}

/// The first `len` bytes of `segments` of `seg_len` bytes each, as
/// consecutive slices (one per segment).
fn slices_of(segments: &mut [Segment], len: usize, seg_len: usize) -> Vec<&mut [u8]> {
    let mut left = len;
    segments
        .iter_mut()
        .map(|s| {
            let n = left.min(seg_len);
            left -= n;
            &mut s.bytes_mut()[..n]
        })
        .collect()
}

/// A diff file held in cache segments; its segments go back to the cache
/// when it is dropped. A file a device is still copying in carries the
/// wait for it ([`Cached::ready`]): every reader waits first, and so does
/// the drop, before the segments can be lent again. A deferred file
/// ([`HostCache::defer`]) has no segments until its first reader takes
/// them and has the device copy the file in.
pub struct Cached {
    segments: OnceLock<Vec<Segment>>,
    /// Bytes per segment: [`SEGMENT_BYTES`], or the whole file's length for
    /// a spilled file (one segment of its own, outside the cache).
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

impl std::fmt::Debug for Cached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let segments = self.segments.get().map_or(0, Vec::len);
        f.debug_struct("Cached").field("len", &self.len).field("segments", &segments).finish()
    }
}

impl Drop for Cached {
    fn drop(&mut self) {
        let gate = std::mem::replace(self.gate.get_mut().unwrap_or_else(PoisonError::into_inner), Gate::Open);
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
        let mut gate = self.gate.lock().unwrap_or_else(PoisonError::into_inner);
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
    /// file's, whole), borrowed; `None` where they span segments or run
    /// past the file.
    pub fn contiguous(&self, range: std::ops::Range<usize>) -> Option<&[u8]> {
        if range.end > self.len || range.start > range.end {
            return None;
        }
        let seg = self.segments().get(range.start / self.segment_len)?.bytes();
        let from = range.start % self.segment_len;
        seg.get(from..from + range.len())
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
    /// one by one from now on; a file that needs segments not made yet is
    /// spilled meanwhile ([`Cached::spilled`]), so no checkpoint waits for
    /// an allocation.
    pub fn with_memory(bytes: u64, alloc: Option<SegmentAlloc>) -> Result<Self> {
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
        };
        let pool = Arc::new(Pool { state: Mutex::new(state), returned: Condvar::new() });
        let weak = Arc::downgrade(&pool);
        std::thread::Builder::new()
            .name("dckpt-cache-alloc".into())
            .spawn(move || make_segments(&weak, segments, alloc))
            .map_err(|e| Error::Internal(format!("starting the host cache's allocation thread: {e}")))?;
        Ok(HostCache { pool, segments })
    }

    /// Waits until the background thread has made every segment (tests and
    /// benchmarks that must not see spills).
    pub fn wait_made(&self) {
        let mut st = self.pool.lock();
        while st.made < st.total {
            st = self.pool.returned.wait(st).unwrap_or_else(PoisonError::into_inner);
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
            st = self.pool.returned.wait(st).unwrap_or_else(PoisonError::into_inner);
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
        let (mut segments, seg_len, waited, spilled) = self.lend(len);
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
        let (mut segments, seg_len, waited, spilled) = self.lend(len);
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
        self.pool.lock().deferred += 1;
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
        (st.free.len() >= need && turn)
            || (!st.spilled && (need > st.total || (turn && need <= st.free.len() + st.total - st.made)))
    }

    /// Segments (or a spill's one segment) for a file of `len` bytes: the
    /// segments, the bytes per segment, the wait, and whether it spilled.
    fn lend(&self, len: usize) -> (Vec<Segment>, usize, Duration, bool) {
        let need = len.div_ceil(SEGMENT_BYTES).max(1);
        match self.pool.take(need, false, true) {
            Lent::Segments(segments, waited) => (segments, SEGMENT_BYTES, waited, false),
            Lent::Spill(waited) => {
                let seg: Segment = Box::new(HeapSegment::prefaulted(len.max(1)));
                (vec![seg], len.max(1), waited, true)
            }
        }
    }

    /// A cached file over `segments` (a spill's one segment where `spilled`).
    fn cached(
        &self,
        segments: Vec<Segment>,
        len: usize,
        gate: Gate,
        peek: Option<DeferredPeek>,
        spilled: bool,
    ) -> Cached {
        let mut c = Cached::new(&self.pool, Some(segments), len, gate, peek);
        if spilled {
            c.spilled = true;
            c.segment_len = len.max(1);
        }
        c
    }
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

/// The background thread's work: makes the cache's segments one by one
/// (page-locked by `alloc` where it works, outside any call that asked for
/// quiet; heap memory written now otherwise, so that no checkpoint pays the
/// page faults) until there are `total`, or the cache is gone.
fn make_segments(pool: &std::sync::Weak<Pool>, total: usize, mut alloc: Option<SegmentAlloc>) {
    let started = Instant::now();
    let (mut allocating, mut longest) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..total {
        // Page-locking holds the CUDA driver; writing heap memory takes a
        // core the call's own work (the CPU backend's) would use: neither
        // starts during a call's quiet.
        match pool.upgrade() {
            Some(pool) => pool.begin_allocation(),
            None => return,
        }
        let t = Instant::now();
        let made = alloc.as_ref().map(|a| a(SEGMENT_BYTES)).transpose().unwrap_or_else(|_| {
            alloc = None; // the rest on the heap
            None
        });
        let segment = made.unwrap_or_else(|| Box::new(HeapSegment::new(SEGMENT_BYTES)));
        allocating += t.elapsed();
        longest = longest.max(t.elapsed());
        match pool.upgrade() {
            Some(pool) => pool.add_made(segment),
            None => return,
        }
    }
    crate::profile::record("cache-made", 0, started.elapsed());
    crate::profile::record("cache-allocating", 0, allocating);
    crate::profile::record("cache-longest-allocation", 0, longest);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_round_trip_through_segments_and_a_full_cache_waits() {
        let cache = std::sync::Arc::new(HostCache::new(3 * SEGMENT_BYTES as u64).expect("cache"));
        cache.wait_made();
        let bytes: Vec<u8> = (0..SEGMENT_BYTES * 2 + 77).map(|i| (i * 7 % 251) as u8).collect();
        let (c, waited) = cache.store_parts(&[&bytes]).expect("store");
        assert!(waited < Duration::from_secs(1));
        let mut back = Vec::new();
        c.write_to(&mut back).expect("write");
        assert_eq!(back, bytes);
        assert_eq!(c.trailer().expect("trailer").as_slice(), &bytes[bytes.len() - 32..]);
        assert_eq!(cache.in_use(), 3 * SEGMENT_BYTES as u64);
        // Full: the next store waits until the first file is given back.
        let other = std::sync::Arc::clone(&cache);
        let t = std::thread::spawn(move || other.store_parts(&[&[1; 10]]).expect("store").1);
        std::thread::sleep(Duration::from_millis(50));
        drop(c);
        assert!(t.join().expect("join") >= Duration::from_millis(40), "it waited for room");
        // Too large for the whole cache: spilled outside it, not refused.
        let big: Vec<u8> = (0..4 * SEGMENT_BYTES + 3).map(|i| (i % 253) as u8).collect();
        let (spilled, _) = cache.store_parts(&[&big[..10], &big[10..]]).expect("spilled");
        assert!(spilled.spilled());
        let mut back = Vec::new();
        spilled.write_to(&mut back).expect("write");
        assert_eq!(back, big);
        let mut mid = vec![0u8; SEGMENT_BYTES + 9];
        spilled.read_at(SEGMENT_BYTES - 4, &mut mid).expect("read_at");
        assert_eq!(mid, big[SEGMENT_BYTES - 4..2 * SEGMENT_BYTES + 5]);
        assert_eq!(spilled.trailer().expect("trailer").as_slice(), &big[big.len() - 32..]);
        assert_eq!(spilled.contiguous(5..3 * SEGMENT_BYTES), Some(&big[5..3 * SEGMENT_BYTES]), "one segment");
        assert_eq!(spilled.contiguous(5..big.len() + 1), None, "past the end");
        assert_eq!(cache.in_use(), 0, "a spilled file lends no segment");
        drop(spilled);
        // Parts across segment boundaries land in order.
        let (a, b) = bytes.split_at(SEGMENT_BYTES + 5);
        let (c, _) = cache.store_parts(&[a, &b[..10], &b[10..]]).expect("store");
        assert_eq!(c.contiguous(7..SEGMENT_BYTES), Some(&bytes[7..SEGMENT_BYTES]));
        assert_eq!(c.contiguous(SEGMENT_BYTES - 1..SEGMENT_BYTES + 1), None, "across segments");
        let mut back = Vec::new();
        c.write_to(&mut back).expect("write");
        assert_eq!(back, bytes);
        drop(c);
    }

    #[test]
    fn a_file_filled_in_place_spans_segments_and_a_failed_fill_gives_them_back() {
        let cache = HostCache::new(3 * SEGMENT_BYTES as u64).expect("cache");
        cache.wait_made();
        let bytes: Vec<u8> = (0..SEGMENT_BYTES + 99).map(|i| (i * 13 % 251) as u8).collect();
        let (c, _) = cache
            .store_with(bytes.len(), &mut |slices| {
                assert_eq!(slices.iter().map(|s| s.len()).collect::<Vec<_>>(), [SEGMENT_BYTES, 99]);
                let mut at = 0;
                for s in slices.iter_mut() {
                    s.copy_from_slice(&bytes[at..at + s.len()]);
                    at += s.len();
                }
                Ok(None)
            })
            .expect("store");
        let mut back = Vec::new();
        c.write_to(&mut back).expect("write");
        assert_eq!(back, bytes);
        drop(c);
        let failed = cache.store_with(10, &mut |_| Err(Error::Internal("device copy failed".into())));
        assert!(failed.is_err());
        assert_eq!(cache.in_use(), 0, "the segments went back");
        assert_eq!(cache.pinned_bytes(), 0);
    }

    /// A 100-byte file whose copy "is still running": its wait counts in
    /// `waits` and fails when `fails`.
    fn gated(cache: &HostCache, waits: &Arc<std::sync::atomic::AtomicUsize>, fails: bool) -> Cached {
        let (c, _) = cache
            .store_with(100, &mut |_| {
                let waits = Arc::clone(waits);
                Ok(Some(Box::new(move || {
                    waits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if fails { Err(Error::Gpu("copy failed".into())) } else { Ok(()) }
                })))
            })
            .expect("store");
        c
    }

    #[test]
    fn a_file_still_being_copied_in_is_waited_for_before_reads_and_before_its_segments_go_back() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let cache = HostCache::new(2 * SEGMENT_BYTES as u64).expect("cache");
        cache.wait_made();
        let waits = Arc::new(AtomicUsize::new(0));
        let c = gated(&cache, &waits, false);
        assert_eq!(waits.load(Ordering::SeqCst), 0, "nothing waits before a reader");
        c.ready().expect("ready");
        c.ready().expect("ready again");
        assert_eq!(waits.load(Ordering::SeqCst), 1, "the wait runs once");
        drop(c);
        // A failed copy stays failed.
        let c = gated(&cache, &waits, true);
        assert!(c.ready().is_err() && c.ready().is_err(), "a failed copy stays failed");
        drop(c);
        // Dropped unread: the wait runs before the segments are lent again.
        drop(gated(&cache, &waits, false));
        assert_eq!(waits.load(Ordering::SeqCst), 3);
        assert_eq!(cache.in_use(), 0, "the segments went back");
    }

    /// A slow page-locking allocator stand-in: counts the allocations begun.
    fn slow_alloc(begun: &Arc<std::sync::atomic::AtomicUsize>) -> SegmentAlloc {
        let begun = Arc::clone(begun);
        Box::new(move |len| {
            begun.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20));
            Ok(Box::new(HeapSegment::new(len)) as Segment)
        })
    }

    #[test]
    fn no_allocation_begins_while_a_call_asks_for_quiet() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let begun = Arc::new(AtomicUsize::new(0));
        let cache = HostCache::with_memory(8 * SEGMENT_BYTES as u64, Some(slow_alloc(&begun))).expect("cache");
        let quiet = cache.quiet();
        let before = begun.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(begun.load(Ordering::SeqCst), before, "an allocation began during quiet");
        assert!(before < 8, "the allocations did not wait at all");
        drop(quiet);
        cache.wait_made();
        assert_eq!(begun.load(Ordering::SeqCst), 8);
    }

    #[test]
    fn a_file_waiting_for_segments_lets_the_allocation_go_on_during_quiet() {
        use std::sync::atomic::AtomicUsize;
        let begun = Arc::new(AtomicUsize::new(0));
        let cache =
            Arc::new(HostCache::with_memory(4 * SEGMENT_BYTES as u64, Some(slow_alloc(&begun))).expect("cache"));
        let (done, got) = std::sync::mpsc::channel();
        let c = Arc::clone(&cache);
        // Quiet at once (at most the first segment is made by then).
        let quiet = cache.quiet();
        std::thread::spawn(move || {
            let _quiet = quiet;
            // The first file spills (its segments are not made yet); the
            // second waits for segments while the first is alive: only
            // the allocation, going on despite the quiet, can serve it.
            let (first, _) = c.store_parts(&[&vec![1u8; 3 * SEGMENT_BYTES]]).expect("first");
            let (second, _) = c.store_parts(&[&vec![2u8; 3 * SEGMENT_BYTES]]).expect("second");
            let _ = done.send((first.spilled(), second.spilled()));
        });
        let (first, second) = got.recv_timeout(Duration::from_secs(20)).expect("no deadlock");
        assert!(first && !second, "the first spills, the second takes made segments");
    }

    #[test]
    fn a_deferred_file_takes_its_segments_when_first_read_and_a_dropped_one_never_does() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let cache = Arc::new(HostCache::new(SEGMENT_BYTES as u64).expect("cache"));
        cache.wait_made();
        let (held, _) = cache.store_parts(&[&[7u8; 100]]).expect("store");
        assert!(!cache.has_room(10), "the one segment is lent");
        let fills = Arc::new(AtomicUsize::new(0));
        // As the GPU cache tier holds a file: the fill takes it away, a
        // peek copies it while it is still held.
        let deferred = |byte: u8| -> crate::backend::Deferred {
            let fills = Arc::clone(&fills);
            let held = Arc::new(Mutex::new(Some(byte)));
            let kept = Arc::clone(&held);
            crate::backend::Deferred {
                fill: Box::new(move |bufs: &mut [&mut [u8]]| {
                    fills.fetch_add(1, Ordering::SeqCst);
                    let byte = held.lock().expect("lock").take().expect("filled once");
                    bufs.iter_mut().for_each(|b| b.fill(byte));
                    Ok(None)
                }),
                peek: Box::new(move |buf: &mut [u8]| {
                    let held = kept.lock().expect("lock");
                    held.iter().for_each(|&b| buf.fill(b));
                    Ok(held.is_some())
                }),
            }
        };
        // Taken at once, although the cache is full.
        let d = cache.defer(50, deferred(9)).expect("defer");
        assert!(d.deferred() && d.pieces().next().is_none());
        // A restore reads it where it is, taking no segments.
        assert_eq!(d.peek().expect("peek"), Some(vec![9u8; 50]));
        assert_eq!((fills.load(Ordering::SeqCst), cache.in_use()), (0, SEGMENT_BYTES as u64));
        // Its first reader waits for room; the held file goes back meanwhile.
        let reader = {
            let d = Arc::new(d);
            let r = Arc::clone(&d);
            (std::thread::spawn(move || r.ready().map(|()| r.pieces().flatten().copied().collect::<Vec<u8>>())), d)
        };
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(fills.load(Ordering::SeqCst), 0, "no room yet");
        drop(held);
        assert_eq!(reader.0.join().expect("join").expect("ready"), vec![9u8; 50]);
        assert!(!reader.1.deferred());
        assert_eq!(reader.1.peek().expect("peek"), None, "in the segments now");
        assert_eq!(cache.in_use(), SEGMENT_BYTES as u64);
        drop(reader.1);
        // Dropped unread: it never takes segments nor runs its fill.
        drop(cache.defer(50, deferred(1)).expect("defer"));
        assert_eq!((fills.load(Ordering::SeqCst), cache.in_use()), (1, 0));
        // One that could never fit is spilled, filled now.
        let spilled = cache.defer(2 * SEGMENT_BYTES, deferred(2)).expect("spilled");
        assert!(spilled.spilled() && !spilled.deferred());
        assert!(spilled.pieces().flatten().all(|&b| b == 2));
        assert_eq!(fills.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn one_spilled_file_at_a_time_and_the_next_waits_for_it() {
        let cache = Arc::new(HostCache::new(SEGMENT_BYTES as u64).expect("cache"));
        cache.wait_made();
        let (a, waited) = cache.store_parts(&[&vec![1u8; 2 * SEGMENT_BYTES]]).expect("spill a");
        assert!(a.spilled() && waited < Duration::from_millis(20));
        // A file that fits still takes the segment meanwhile.
        let (small, _) = cache.store_parts(&[&[5u8; 10]]).expect("small");
        assert!(!small.spilled());
        let next = {
            let cache = Arc::clone(&cache);
            std::thread::spawn(move || cache.store_parts(&[&vec![2u8; 3 * SEGMENT_BYTES]]).expect("spill b"))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!next.is_finished(), "the second spill waits for the first");
        drop(a);
        let (b, waited) = next.join().expect("join");
        assert!(b.spilled() && waited > Duration::ZERO, "{waited:?}");
        assert!(b.pieces().flatten().all(|&x| x == 2) && b.len() == 3 * SEGMENT_BYTES);
        // A fill that fails gives the spill's right back.
        drop(b);
        assert!(cache.store_with(2 * SEGMENT_BYTES, &mut |_| Err(Error::Internal("failed".into()))).is_err());
        let (c, _) = cache.store_parts(&[&vec![3u8; 2 * SEGMENT_BYTES]]).expect("spill c");
        assert!(c.spilled());
        drop((c, small));
        assert_eq!(cache.in_use(), 0);
    }

    #[test]
    fn no_later_file_takes_segments_while_a_deferred_one_waits_for_its_own() {
        let cache = Arc::new(HostCache::new(2 * SEGMENT_BYTES as u64).expect("cache"));
        cache.wait_made();
        let (a, _) = cache.store_parts(&[&[1u8; 10]]).expect("store");
        let b = cache
            .defer(
                10,
                crate::backend::Deferred {
                    fill: Box::new(|bufs: &mut [&mut [u8]]| {
                        bufs.iter_mut().for_each(|x| x.fill(2));
                        Ok(None)
                    }),
                    peek: Box::new(|_: &mut [u8]| Ok(false)),
                },
            )
            .expect("defer");
        // One segment is free, but it is the deferred file's turn.
        assert!(!cache.has_room(10));
        let later = {
            let cache = Arc::clone(&cache);
            std::thread::spawn(move || cache.store_parts(&[&[3u8; 10]]).expect("store"))
        };
        std::thread::sleep(Duration::from_millis(30));
        assert!(!later.is_finished(), "a later file waits behind the deferred one");
        b.ready().expect("the deferred file gets the free segment");
        assert_eq!(b.pieces().flatten().copied().collect::<Vec<u8>>(), vec![2u8; 10]);
        drop(a);
        let (c, waited) = later.join().expect("join");
        assert!(waited >= Duration::from_millis(25));
        assert_eq!(c.pieces().flatten().copied().collect::<Vec<u8>>(), vec![3u8; 10]);
        drop((b, c));
        // A deferred file dropped unread no longer holds the line.
        let unread = crate::backend::Deferred {
            fill: Box::new(|_: &mut [&mut [u8]]| Ok(None)),
            peek: Box::new(|_: &mut [u8]| Ok(false)),
        };
        drop(cache.defer(10, unread).expect("defer"));
        assert!(cache.has_room(10));
    }
}
