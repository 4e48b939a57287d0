//! The cache's pool of page-locked segments: who may take how many, the
//! one file at a time that may spill past it, and the background allocation
//! that grows it.

use super::*;

/// The segments not lent out, and the deferred files still waiting for
/// theirs. Segments are lent in the order files came: while a deferred file
/// waits, no later file takes any (it is deferred too, or waits), so every
/// file holding segments is older than every deferred one, and the flusher,
/// which serves files in order, always finds the segments it waits for
/// coming back.
#[derive(Debug)]
pub(super) struct Pool {
    pub(super) state: Mutex<PoolState>,
    pub(super) returned: Condvar,
}

#[derive(Debug)]
pub(super) struct PoolState {
    pub(super) free: Vec<Segment>,
    /// Deferred files that have taken no segments yet.
    pub(super) deferred: usize,
    /// Segments made so far (the background thread makes the rest).
    pub(super) made: usize,
    /// Page-locked segments among them.
    pub(super) pinned: usize,
    /// Segments the cache will have.
    pub(super) total: usize,
    /// Whether a spilled file is alive (one at a time).
    pub(super) spilled: bool,
    /// Calls that asked for quiet ([`HostCache::quiet`]).
    pub(super) quiet: usize,
    /// Whether the background thread is page-locking a segment now.
    pub(super) allocating: bool,
    /// Takers waiting for segments (the background thread then goes on
    /// allocating, quiet or not: they may need what it makes).
    pub(super) waiting: usize,
    /// Whether the background thread waits for [`super::HostCache::release`]
    /// before it makes anything (a restart's restore first: nothing made
    /// beside it competes with it), unless a taker waits.
    pub(super) held: bool,
    /// Segments the background thread is to have made by now: the cache
    /// grows with what its files ask for ([`PoolState::grow_for`]), never
    /// past `total`.
    pub(super) wanted: usize,
    /// The most segments one file has asked for.
    pub(super) largest: usize,
    /// Whether the cache is gone (the background thread stops).
    pub(super) closed: bool,
}

/// Segments made before any file asks (64 MiB): the first small diffs find
/// them made.
pub(super) const FIRST_SEGMENTS: usize = 16;

impl PoolState {
    /// Raises the segments wanted for a file of `need` segments: those lent
    /// now plus room for two of the largest file yet (at least
    /// [`FIRST_SEGMENTS`] in all), at most the whole cache. A file larger
    /// than the whole cache (a large baseline, always spilled) changes
    /// nothing. A cache grows only as
    /// far as its files need: every page-locked allocation holds the CUDA
    /// driver, so each one made and never used is a stall some call may
    /// wait on (span `cache-quiet`), for nothing.
    pub(super) fn grow_for(&mut self, need: usize) {
        if need > self.total {
            return; // spilled whatever the cache holds: it asks for nothing
        }
        self.largest = self.largest.max(need);
        let lent = self.made - self.free.len();
        let wanted = lent.saturating_add(2 * self.largest).max(FIRST_SEGMENTS);
        self.wanted = self.wanted.max(wanted).min(self.total);
    }

    /// Whether `need` segments not free now may be spilled instead of
    /// waited for: the file can never fit, or the segments it lacks are
    /// already being made (the cache is still growing toward them), and no
    /// other spilled file is alive. (A taker that waited may have had more
    /// made than wanted.)
    pub(super) fn may_spill(&self, need: usize, turn: bool) -> bool {
        !self.spilled
            && (need > self.total || (turn && need <= self.free.len() + self.wanted.saturating_sub(self.made)))
    }
}

/// What [`Pool::take`] lends.
pub(super) enum Lent {
    /// Segments, and how long the caller waited for them.
    Segments(Vec<Segment>, Duration),
    /// The right to spill one file outside the cache, and how long the
    /// caller waited for it.
    Spill(Duration),
}

impl Pool {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        crate::sync::lock(&self.state)
    }

    /// Takes `need` segments, waiting until that many are free (and, for a
    /// file that was not deferred, until no deferred file waits before it).
    /// Where `may_spill`, lends the right to spill instead of waiting when
    /// the file can never fit (`need` over the total) or when the segments
    /// it lacks are not made yet: once no other spilled file is alive.
    pub(super) fn take(&self, need: usize, deferred: bool, may_spill: bool) -> Lent {
        let t = Instant::now();
        let mut st = self.lock();
        loop {
            let turn = deferred || st.deferred == 0;
            if need <= st.free.len() && turn {
                break;
            }
            if may_spill && st.may_spill(need, turn) {
                st.spilled = true;
                st.grow_for(need);
                drop(st);
                self.returned.notify_all();
                return Lent::Spill(t.elapsed());
            }
            st.grow_for(need);
            if st.waiting == 0 {
                self.returned.notify_all(); // the allocation may go on now
            }
            st.waiting += 1;
            st = crate::sync::wait(&self.returned, st);
            st.waiting -= 1;
        }
        if deferred {
            st.deferred -= 1;
        }
        let at = st.free.len() - need;
        let taken = st.free.drain(at..).collect();
        st.grow_for(need); // room for the next file, made between calls
        drop(st);
        self.returned.notify_all();
        Lent::Segments(taken, t.elapsed())
    }

    /// A spilled file is gone: the next may spill.
    pub(super) fn unspill(&self) {
        self.lock().spilled = false;
        self.returned.notify_all();
    }

    /// Waits until the cache is released, wants another segment and no
    /// call asked for quiet (or a taker waits for segments), then marks a
    /// page-locking allocation as running; `false` once the cache is gone.
    pub(super) fn begin_allocation(&self) -> bool {
        let mut st = self.lock();
        while !st.closed && (st.held || st.quiet > 0 || st.made >= st.wanted) && st.waiting == 0 {
            st = crate::sync::wait(&self.returned, st);
        }
        st.allocating = !st.closed;
        st.allocating
    }

    /// Adds a segment the background thread made (its allocation ended).
    pub(super) fn add_made(&self, segment: Segment) {
        let mut st = self.lock();
        st.allocating = false;
        st.made += 1;
        st.pinned += usize::from(segment.pinned());
        st.free.push(segment);
        drop(st);
        self.returned.notify_all();
    }

    /// A deferred file that will never take segments (dropped unread).
    pub(super) fn forget_deferred(&self) {
        let mut st = self.lock();
        st.deferred = st.deferred.saturating_sub(1);
        drop(st);
        self.returned.notify_all();
    }

    pub(super) fn put(&self, segments: Vec<Segment>) {
        if segments.is_empty() {
            return;
        }
        self.lock().free.extend(segments);
        self.returned.notify_all();
    }
}

/// The first `len` bytes of `segments` of `seg_len` bytes each, as
/// consecutive slices (one per segment).
pub(super) fn slices_of(segments: &mut [Segment], len: usize, seg_len: usize) -> Vec<&mut [u8]> {
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

/// The background thread's work: makes the cache's segments one by one as
/// they are wanted (page-locked by `alloc` where it works, outside any call
/// that asked for quiet; heap memory written now otherwise, so that no
/// checkpoint pays the page faults) until there are `total`, or the cache
/// is gone.
pub(super) fn make_segments(pool: &std::sync::Weak<Pool>, total: usize, mut alloc: Option<SegmentAlloc>) {
    let started = Instant::now();
    let (mut allocating, mut longest) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..total {
        // Page-locking holds the CUDA driver; writing heap memory takes a
        // core the call's own work (the CPU backend's) would use: neither
        // starts during a call's quiet.
        match pool.upgrade() {
            Some(pool) if pool.begin_allocation() => {}
            _ => return,
        }
        let t = Instant::now();
        let made = alloc.as_ref().map(|a| a(SEGMENT_BYTES)).transpose().unwrap_or_else(|e| {
            // Shared memory full (the agent's segments) or page-locking refused.
            tracing::warn!(
                "the host cache: {e}; its other segments are ordinary memory (slower device copies, and a \
                 checkpoint in them dies with the process)"
            );
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
