//! The host cache's tests: files through segments, waits, deferred fills, quiet.
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
fn a_held_cache_makes_nothing_until_released_or_a_file_waits() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let begun = Arc::new(AtomicUsize::new(0));
    let cache = HostCache::held(4 * SEGMENT_BYTES as u64, Some(slow_alloc(&begun))).expect("cache");
    std::thread::sleep(Duration::from_millis(60));
    assert_eq!(begun.load(Ordering::SeqCst), 0, "a held cache allocated");
    cache.release();
    cache.wait_made();
    assert_eq!(begun.load(Ordering::SeqCst), 4);
    // Held again: a file too large to spill beside a live spilled one
    // waits for segments, and the thread makes them for it.
    let begun = Arc::new(AtomicUsize::new(0));
    let cache = Arc::new(HostCache::held(4 * SEGMENT_BYTES as u64, Some(slow_alloc(&begun))).expect("cache"));
    let (done, got) = std::sync::mpsc::channel();
    let c = Arc::clone(&cache);
    std::thread::spawn(move || {
        let (first, _) = c.store_parts(&[&vec![1u8; 3 * SEGMENT_BYTES]]).expect("first");
        let (second, _) = c.store_parts(&[&vec![2u8; 3 * SEGMENT_BYTES]]).expect("second");
        let _ = done.send((first.spilled(), second.spilled()));
    });
    let (first, second) = got.recv_timeout(Duration::from_secs(20)).expect("no deadlock");
    assert!(first && !second, "the first spills, the second takes segments made for it");
}

#[test]
fn a_file_waiting_for_segments_lets_the_allocation_go_on_during_quiet() {
    use std::sync::atomic::AtomicUsize;
    let begun = Arc::new(AtomicUsize::new(0));
    let cache = Arc::new(HostCache::with_memory(4 * SEGMENT_BYTES as u64, Some(slow_alloc(&begun))).expect("cache"));
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

#[test]
fn the_cache_grows_only_as_far_as_its_files_need() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let settled = |begun: &AtomicUsize, want: usize| {
        let t = Instant::now();
        while begun.load(Ordering::SeqCst) < want && t.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(80)); // time to make more, were it to
        begun.load(Ordering::SeqCst)
    };
    let begun = Arc::new(AtomicUsize::new(0));
    let total = 48;
    let cache = HostCache::with_memory((total * SEGMENT_BYTES) as u64, Some(slow_alloc(&begun))).expect("cache");
    assert_eq!(settled(&begun, pool::FIRST_SEGMENTS), pool::FIRST_SEGMENTS, "made before any file asks");
    // Small files, one after another: nothing more is made.
    for k in 0..5u8 {
        let (c, _) = cache.store_parts(&[&vec![k; SEGMENT_BYTES / 2]]).expect("small");
        assert!(!c.spilled());
    }
    assert_eq!(settled(&begun, pool::FIRST_SEGMENTS), pool::FIRST_SEGMENTS, "small files grew the cache");
    // A file of 12 segments held while the next comes: room for two of it.
    let (big, _) = cache.store_parts(&[&vec![7u8; 12 * SEGMENT_BYTES]]).expect("big");
    assert!(!big.spilled());
    assert_eq!(settled(&begun, 12 + 24), 12 + 24, "lent plus room for two of the largest");
    assert!(cache.pinned_bytes() == 0 && cache.capacity() == (total * SEGMENT_BYTES) as u64);
    drop(big);
    // A file larger than the whole cache is spilled and asks for nothing.
    let (huge, _) = cache.store_parts(&[&vec![9u8; (total + 1) * SEGMENT_BYTES]]).expect("huge");
    assert!(huge.spilled());
    drop(huge);
    assert_eq!(settled(&begun, 36), 36, "a spilled file grew the cache");
    drop(cache);
    assert_eq!(settled(&begun, 0), 36, "a dropped cache makes nothing more");
}

#[test]
fn a_spill_from_an_allocator_comes_in_pieces_that_read_as_one_file() {
    let mut cache = HostCache::new(SEGMENT_BYTES as u64).expect("cache");
    let made = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&made);
    cache.spill_into(Box::new(move |len| {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(Box::new(HeapSegment::new(len)) as Segment)
    }));
    cache.wait_made();
    let big: Vec<u8> = (0..2 * SPILL_PIECE + 4097).map(|i| (i * 13 % 251) as u8).collect();
    let (spilled, _) = cache.store_parts(&[&big[..3], &big[3..]]).expect("spilled");
    assert!(spilled.spilled());
    assert_eq!(made.load(std::sync::atomic::Ordering::SeqCst), 3, "three pieces, the last short");
    let mut back = Vec::new();
    spilled.write_to(&mut back).expect("write");
    assert!(back == big);
    let mut mid = vec![0u8; 100];
    spilled.read_at(SPILL_PIECE - 50, &mut mid).expect("read_at across pieces");
    assert_eq!(mid, big[SPILL_PIECE - 50..SPILL_PIECE + 50]);
    assert_eq!(spilled.contiguous(SPILL_PIECE - 1..SPILL_PIECE + 1), None, "across pieces");
    assert_eq!(spilled.contiguous(SPILL_PIECE..SPILL_PIECE + 9), Some(&big[SPILL_PIECE..SPILL_PIECE + 9]));
    assert_eq!(spilled.trailer().expect("trailer").as_slice(), &big[big.len() - 32..]);
    assert_eq!(cache.in_use(), 0, "a spilled file lends no segment");
}
