//! The host cache tier: a budget of host memory, allocated and touched
//! once when the tiers open, lent out in fixed-size segments to hold diff
//! files until the first disk tier has them. A checkpoint copies its file
//! into segments and returns; the flusher writes them out and gives them
//! back. When every segment is lent, a checkpoint waits (backpressure) and
//! says how long.
//!
//! Segments move by ownership (a `Box<[u8]>` travels with its job), so the
//! application thread and the flusher never share a byte.

use crate::{Error, Result};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Bytes per segment.
pub const SEGMENT_BYTES: usize = 4 << 20;

/// The pre-allocated host cache.
#[derive(Debug)]
pub struct HostCache {
    pool: Arc<Pool>,
    segments: usize,
}

/// The segments not lent out.
#[derive(Debug)]
struct Pool {
    free: Mutex<Vec<Box<[u8]>>>,
    returned: Condvar,
}

impl Pool {
    fn put(&self, segments: Vec<Box<[u8]>>) {
        if segments.is_empty() {
            return;
        }
        self.free.lock().unwrap_or_else(PoisonError::into_inner).extend(segments);
        self.returned.notify_all();
    }
}

/// A diff file held in cache segments; its segments go back to the cache
/// when it is dropped.
#[derive(Debug)]
pub struct Cached {
    segments: Vec<Box<[u8]>>,
    len: usize,
    pool: Arc<Pool>,
}

impl Drop for Cached {
    fn drop(&mut self) {
        self.pool.put(std::mem::take(&mut self.segments));
    }
}

impl Cached {
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
        self.segments.iter().map(move |s| {
            let n = left.min(s.len());
            left -= n;
            &s[..n]
        })
    }

    /// Writes the whole file to `out`.
    pub fn write_to(&self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        self.pieces().try_for_each(|p| out.write_all(p))
    }

    /// The last 32 bytes (a diff file's trailer).
    pub fn trailer(&self) -> Option<[u8; 32]> {
        let start = self.len.checked_sub(32)?;
        let mut t = [0u8; 32];
        for (k, b) in t.iter_mut().enumerate() {
            let at = start + k;
            *b = *self.segments.get(at / SEGMENT_BYTES)?.get(at % SEGMENT_BYTES)?;
        }
        Some(t)
    }
}

impl HostCache {
    /// A cache of `bytes` (rounded up to whole segments, at least one),
    /// allocated and touched now.
    pub fn new(bytes: u64) -> Result<Self> {
        let segments = usize::try_from(bytes.div_ceil(SEGMENT_BYTES as u64))
            .map_err(|_| Error::InvalidOption(format!("host cache of {bytes} bytes")))?
            .max(1);
        // Written now, so that no checkpoint pays the page faults (a zeroed
        // allocation would only map its pages on first write).
        let free = (0..segments).map(|_| vec![0xa5u8; SEGMENT_BYTES].into_boxed_slice()).collect();
        Ok(HostCache { pool: Arc::new(Pool { free: Mutex::new(free), returned: Condvar::new() }), segments })
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        (self.segments * SEGMENT_BYTES) as u64
    }

    /// Bytes lent out now.
    pub fn in_use(&self) -> u64 {
        let free = self.pool.free.lock().unwrap_or_else(PoisonError::into_inner).len();
        ((self.segments - free) * SEGMENT_BYTES) as u64
    }

    /// Copies a file given as consecutive `parts` into cache segments, the
    /// segments in parallel; waits while the cache is full. Returns the
    /// cached file and the time spent waiting.
    pub fn store_parts(&self, parts: &[&[u8]]) -> Result<(Cached, Duration)> {
        use rayon::prelude::*;
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let (mut cached, waited) = self.take(len)?;
        cached.segments.par_iter_mut().enumerate().for_each(|(i, seg)| {
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
        cached.len = len;
        Ok((cached, waited))
    }

    /// Lends enough segments for `len` bytes, waiting for room.
    fn take(&self, len: usize) -> Result<(Cached, Duration)> {
        let need = len.div_ceil(SEGMENT_BYTES).max(1);
        if need > self.segments {
            return Err(Error::InvalidOption(format!(
                "a {len}-byte diff does not fit the {}-byte host cache (raise host_cache_size)",
                self.capacity()
            )));
        }
        let t = Instant::now();
        let mut free = self.pool.free.lock().unwrap_or_else(PoisonError::into_inner);
        while free.len() < need {
            free = self.pool.returned.wait(free).unwrap_or_else(PoisonError::into_inner);
        }
        let at = free.len() - need;
        let segments: Vec<Box<[u8]>> = free.drain(at..).collect();
        Ok((Cached { segments, len: 0, pool: Arc::clone(&self.pool) }, t.elapsed()))
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
}
