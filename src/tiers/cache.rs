//! The host cache tier: a budget of host memory, allocated and touched
//! once when the tiers open, lent out in fixed-size segments to hold diff
//! files until the first disk tier has them. A checkpoint copies its file
//! into segments and returns; the flusher writes them out and gives them
//! back. When every segment is lent, a checkpoint waits (backpressure) and
//! says how long.
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

/// The pre-allocated host cache.
#[derive(Debug)]
pub struct HostCache {
    pool: Arc<Pool>,
    segments: usize,
    pinned: usize,
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
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes `need` segments, waiting until that many are free (and, for a
    /// file that was not deferred, until no deferred file waits before it).
    fn take(&self, need: usize, deferred: bool) -> (Vec<Segment>, Duration) {
        let t = Instant::now();
        let mut st = self.lock();
        while st.free.len() < need || (!deferred && st.deferred > 0) {
            st = self.returned.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
        if deferred {
            st.deferred -= 1;
        }
        let at = st.free.len() - need;
        let taken = st.free.drain(at..).collect();
        drop(st);
        self.returned.notify_all();
        (taken, t.elapsed())
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

/// The first `len` bytes of `segments`, as consecutive slices (one per segment).
fn slices_of(segments: &mut [Segment], len: usize) -> Vec<&mut [u8]> {
    let mut left = len;
    segments
        .iter_mut()
        .map(|s| {
            let n = left.min(SEGMENT_BYTES);
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
        if let Some(segments) = self.segments.take() {
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
        let (mut segments, _) = self.pool.take(self.len.div_ceil(SEGMENT_BYTES).max(1), true);
        let mut slices = slices_of(&mut segments, self.len);
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
        // One piece per segment touched, copied in parallel.
        let mut jobs: Vec<(&mut [u8], &[u8])> = Vec::new();
        let mut rest: &mut [u8] = buf;
        let mut at = offset;
        while !rest.is_empty() {
            let seg = self.segments().get(at / SEGMENT_BYTES)?.bytes();
            let from = at % SEGMENT_BYTES;
            let n = rest.len().min(seg.len().checked_sub(from)?);
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

    /// The last 32 bytes (a diff file's trailer).
    pub fn trailer(&self) -> Option<[u8; 32]> {
        let start = self.len.checked_sub(32)?;
        let mut t = [0u8; 32];
        for (k, b) in t.iter_mut().enumerate() {
            let at = start + k;
            *b = *self.segments().get(at / SEGMENT_BYTES)?.bytes().get(at % SEGMENT_BYTES)?;
        }
        Some(t)
    }
}

impl HostCache {
    /// A cache of `bytes` (rounded up to whole segments, at least one) of
    /// heap memory, allocated and touched now.
    pub fn new(bytes: u64) -> Result<Self> {
        Self::with_memory(bytes, None)
    }

    /// A cache of `bytes` whose segments `alloc` makes (heap memory without
    /// it, or where it fails: a cache that cannot be page-locked still
    /// works, only its copies are slower), allocated now.
    pub fn with_memory(bytes: u64, alloc: Option<&SegmentAlloc>) -> Result<Self> {
        let segments = usize::try_from(bytes.div_ceil(SEGMENT_BYTES as u64))
            .map_err(|_| Error::InvalidOption(format!("host cache of {bytes} bytes")))?
            .max(1);
        let mut free: Vec<Segment> = Vec::with_capacity(segments);
        let mut alloc = alloc;
        for _ in 0..segments {
            let made = alloc.map(|a| a(SEGMENT_BYTES)).transpose().unwrap_or_else(|_| {
                alloc = None; // the rest on the heap
                None
            });
            // Heap segments are written now, so that no checkpoint pays the
            // page faults (a zeroed allocation maps its pages on first write).
            free.push(made.unwrap_or_else(|| Box::new(HeapSegment::new(SEGMENT_BYTES))));
        }
        let pinned = free.iter().filter(|s| s.pinned()).count();
        let pool = Pool { state: Mutex::new(PoolState { free, deferred: 0 }), returned: Condvar::new() };
        Ok(HostCache { pool: Arc::new(pool), segments, pinned })
    }

    /// Bytes of page-locked segments.
    pub fn pinned_bytes(&self) -> u64 {
        (self.pinned * SEGMENT_BYTES) as u64
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        (self.segments * SEGMENT_BYTES) as u64
    }

    /// Bytes lent out now.
    pub fn in_use(&self) -> u64 {
        let free = self.pool.lock().free.len();
        ((self.segments - free) * SEGMENT_BYTES) as u64
    }

    /// Copies a file given as consecutive `parts` into cache segments, the
    /// segments in parallel; waits while the cache is full. Returns the
    /// cached file and the time spent waiting.
    pub fn store_parts(&self, parts: &[&[u8]]) -> Result<(Cached, Duration)> {
        use rayon::prelude::*;
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let (mut segments, waited) = self.take(len)?;
        segments.par_iter_mut().enumerate().for_each(|(i, seg)| {
            let seg = seg.bytes_mut();
            let (lo, hi) = (i * SEGMENT_BYTES, ((i + 1) * SEGMENT_BYTES).min(len));
            let mut at = 0; // start of the current part in the file
            for p in parts {
                let (plo, phi) = (at, at + p.len());
                at = phi;
                let (s, e) = (lo.max(plo), hi.min(phi));
                if s < e {
                    seg[s - lo..e - lo].copy_from_slice(&p[s - plo..e - plo]);
                }
            }
        });
        Ok((Cached::new(&self.pool, Some(segments), len, Gate::Open, None), waited))
    }

    /// A file of `len` bytes that `fill` writes straight into cache
    /// segments (given as consecutive slices totalling `len` bytes); waits
    /// while the cache is full. The cached file and the time spent waiting;
    /// on an error the segments go back.
    pub fn store_with(&self, len: usize, fill: &mut Fill<'_>) -> Result<(Cached, Duration)> {
        let (mut segments, waited) = self.take(len)?;
        let mut slices = slices_of(&mut segments, len);
        let ready = match fill(&mut slices) {
            Ok(ready) => ready,
            Err(e) => {
                drop(slices);
                self.pool.put(segments);
                return Err(e);
            }
        };
        drop(slices);
        let gate = ready.map_or(Gate::Open, Gate::Copying);
        Ok((Cached::new(&self.pool, Some(segments), len, gate, None), waited))
    }

    /// A file of `len` bytes held elsewhere for now (the GPU cache tier):
    /// it takes no segments until its first reader ([`Cached::ready`],
    /// the flusher) waits for room and has its fill copy it in (a restore
    /// reads it where it is meanwhile: [`Cached::peek`]). Returns at
    /// once; an error only if the file could never fit.
    pub fn defer(&self, len: usize, file: Deferred) -> Result<Cached> {
        self.segments_for(len)?;
        self.pool.lock().deferred += 1;
        Ok(Cached::new(&self.pool, None, len, Gate::Deferred(file.fill), Some(file.peek)))
    }

    /// Whether a file of `len` bytes would get its segments now, without
    /// waiting: enough are free and no deferred file waits for its own
    /// (segments go in the order files came). Only the checkpointing thread
    /// takes segments for new files, so the answer holds for its next take.
    pub fn has_room(&self, len: usize) -> bool {
        let need = len.div_ceil(SEGMENT_BYTES).max(1);
        let st = self.pool.lock();
        st.free.len() >= need && st.deferred == 0
    }

    /// The segments a file of `len` bytes needs; an error if more than the cache has.
    fn segments_for(&self, len: usize) -> Result<usize> {
        let need = len.div_ceil(SEGMENT_BYTES).max(1);
        if need > self.segments {
            return Err(Error::InvalidOption(format!(
                "a {len}-byte diff does not fit the {}-byte host cache (raise host_cache_size)",
                self.capacity()
            )));
        }
        Ok(need)
    }

    /// Lends enough segments for `len` bytes, waiting for room.
    fn take(&self, len: usize) -> Result<(Vec<Segment>, Duration)> {
        let need = self.segments_for(len)?;
        Ok(self.pool.take(need, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_round_trip_through_segments_and_a_full_cache_waits() {
        let cache = std::sync::Arc::new(HostCache::new(3 * SEGMENT_BYTES as u64).expect("cache"));
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
        // Too large for the whole cache: an error, not a hang.
        assert!(cache.store_parts(&[&vec![0; 4 * SEGMENT_BYTES]]).is_err());
        // Parts across segment boundaries land in order.
        let (a, b) = bytes.split_at(SEGMENT_BYTES + 5);
        let (c, _) = cache.store_parts(&[a, &b[..10], &b[10..]]).expect("store");
        let mut back = Vec::new();
        c.write_to(&mut back).expect("write");
        assert_eq!(back, bytes);
        drop(c);
    }

    #[test]
    fn a_file_filled_in_place_spans_segments_and_a_failed_fill_gives_them_back() {
        let cache = HostCache::new(3 * SEGMENT_BYTES as u64).expect("cache");
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

    #[test]
    fn a_deferred_file_takes_its_segments_when_first_read_and_a_dropped_one_never_does() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let cache = Arc::new(HostCache::new(SEGMENT_BYTES as u64).expect("cache"));
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
        // One that could never fit is refused at once.
        assert!(cache.defer(2 * SEGMENT_BYTES, deferred(2)).is_err());
    }

    #[test]
    fn no_later_file_takes_segments_while_a_deferred_one_waits_for_its_own() {
        let cache = Arc::new(HostCache::new(2 * SEGMENT_BYTES as u64).expect("cache"));
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
