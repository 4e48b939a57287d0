//! The bookkeeping of the GPU cache tier's arena: a fixed range of bytes
//! lent out as spans in first-in, first-out order, like a ring buffer.
//! Pure (no device): `backend::cuda::DeviceCache` keeps one of these
//! over its device buffer, and the tests here check the placement rules.
//!
//! A span is *held* from its reservation until its bytes start leaving
//! (copied out to the host cache, [`Ring::leave`], with the marker `E`
//! that says when the copy ends) or it is given up ([`Ring::free`]).
//! Room is taken back from the oldest span only: a leaving span once its
//! copy is known to have ended, or, when room is needed now, after
//! ordering the new span's writes behind that copy; a held oldest span
//! means no room. Files leave in the order they came, so the oldest span
//! is also the first one done.

use crate::error::Result;
use std::collections::VecDeque;

/// Where a span is in its life.
#[derive(Debug)]
enum State<E> {
    /// Reserved; its bytes are still needed.
    Held,
    /// Its bytes are being copied out; `E` says when that ends.
    Leaving(E),
    /// Given up: its room can be taken back.
    Free,
}

#[derive(Debug)]
struct Span<E> {
    id: u64,
    start: u64,
    len: u64,
    state: State<E>,
}

/// Spans of an arena of `cap` bytes, oldest first.
#[derive(Debug)]
pub struct Ring<E> {
    cap: u64,
    spans: VecDeque<Span<E>>,
    next_id: u64,
}

/// A reserved span: its id and where it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reserved {
    /// Names the span in [`Ring::leave`] and [`Ring::free`].
    pub id: u64,
    /// Its first byte in the arena.
    pub start: u64,
}

impl<E> Ring<E> {
    /// An empty ring over `cap` bytes.
    pub fn new(cap: u64) -> Self {
        Ring { cap, spans: VecDeque::new(), next_id: 0 }
    }

    /// The arena's size.
    pub fn capacity(&self) -> u64 {
        self.cap
    }

    /// Bytes of the spans not yet taken back.
    pub fn in_use(&self) -> u64 {
        self.spans.iter().map(|s| s.len).sum()
    }

    /// Reserves `len` bytes (at least 1). First drops the oldest spans
    /// that are free or whose copy `done` says has ended; then, while
    /// `len` does not fit, takes back the oldest span if it is leaving,
    /// after `order_after` has ordered the new span's writes behind its
    /// copy. `None`: no room (the oldest span is held, or `len` exceeds
    /// the arena).
    pub fn reserve(
        &mut self,
        len: u64,
        mut done: impl FnMut(&E) -> Result<bool>,
        mut order_after: impl FnMut(&E) -> Result<()>,
    ) -> Result<Option<Reserved>> {
        let len = len.max(1);
        if len > self.cap {
            return Ok(None);
        }
        while let Some(head) = self.spans.front() {
            let gone = match &head.state {
                State::Free => true,
                State::Leaving(e) => done(e)?,
                State::Held => false,
            };
            if !gone {
                break;
            }
            self.spans.pop_front();
        }
        loop {
            if let Some(start) = self.fit(len) {
                let id = self.next_id;
                self.next_id += 1;
                self.spans.push_back(Span { id, start, len, state: State::Held });
                return Ok(Some(Reserved { id, start }));
            }
            match self.spans.front().map(|s| &s.state) {
                Some(State::Leaving(e)) => order_after(e)?,
                Some(State::Free) => {}
                Some(State::Held) | None => return Ok(None),
            }
            self.spans.pop_front();
        }
    }

    /// Where `len` bytes fit after the newest span, if they do.
    fn fit(&self, len: u64) -> Option<u64> {
        let (Some(head), Some(tail)) = (self.spans.front(), self.spans.back()) else {
            return Some(0);
        };
        let end = tail.start + tail.len;
        if tail.start >= head.start {
            // Not wrapped: room after the newest span, or before the oldest.
            if end + len <= self.cap {
                Some(end)
            } else if len <= head.start {
                Some(0)
            } else {
                None
            }
        } else {
            // Wrapped: room between the newest span and the oldest.
            (end + len <= head.start).then_some(end)
        }
    }

    /// The span `id`'s bytes are being copied out; `marker` says when that ends.
    pub fn leave(&mut self, id: u64, marker: E) {
        if let Some(s) = self.spans.iter_mut().find(|s| s.id == id) {
            s.state = State::Leaving(marker);
        }
    }

    /// Gives the span `id` up (its bytes are not needed, and nothing reads them).
    pub fn free(&mut self, id: u64) {
        if let Some(s) = self.spans.iter_mut().find(|s| s.id == id) {
            s.state = State::Free;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A copy that has ended (`true`) or is still running.
    type Copy = bool;

    fn reserve(r: &mut Ring<Copy>, len: u64, waited: &Cell<u32>) -> Option<u64> {
        r.reserve(
            len,
            |done| Ok(*done),
            |_| {
                waited.set(waited.get() + 1);
                Ok(())
            },
        )
        .unwrap()
        .map(|s| s.start)
    }

    #[test]
    fn spans_are_placed_in_order_and_wrap_around_the_end() {
        let waited = Cell::new(0);
        let mut r: Ring<Copy> = Ring::new(100);
        assert_eq!(reserve(&mut r, 40, &waited), Some(0));
        assert_eq!(reserve(&mut r, 40, &waited), Some(40));
        // 30 bytes do not fit after 80, and the oldest span is held.
        assert_eq!(reserve(&mut r, 30, &waited), None);
        assert_eq!(r.in_use(), 80);
        // The oldest leaves and its copy has ended: taken back without waiting.
        r.leave(0, true);
        assert_eq!(reserve(&mut r, 30, &waited), Some(0), "wraps to the start");
        assert_eq!(waited.get(), 0);
        // Wrapped: the room is between the newest span (0..30) and the oldest (40..80).
        assert_eq!(reserve(&mut r, 10, &waited), Some(30));
        assert_eq!(reserve(&mut r, 1, &waited), None, "the oldest is held");
        // A leaving oldest span whose copy still runs is taken back only
        // when room is needed, after ordering behind its copy.
        r.leave(1, false);
        assert_eq!(reserve(&mut r, 50, &waited), Some(40));
        assert_eq!(waited.get(), 1);
        assert_eq!(r.in_use(), 30 + 10 + 50);
    }

    #[test]
    fn a_freed_span_is_taken_back_once_it_is_the_oldest_and_nothing_exceeds_the_arena() {
        let waited = Cell::new(0);
        let mut r: Ring<Copy> = Ring::new(64);
        assert_eq!(reserve(&mut r, 65, &waited), None);
        assert_eq!(reserve(&mut r, 32, &waited), Some(0));
        assert_eq!(reserve(&mut r, 32, &waited), Some(32));
        r.free(1); // the newer one: still behind the held oldest
        assert_eq!(reserve(&mut r, 16, &waited), None);
        r.free(0);
        assert_eq!(reserve(&mut r, 64, &waited), Some(0), "both taken back");
        assert_eq!((r.in_use(), waited.get()), (64, 0));
        // An empty arena takes a zero-length file as one byte.
        let mut e: Ring<Copy> = Ring::new(8);
        assert_eq!(reserve(&mut e, 0, &waited), Some(0));
        assert_eq!(e.in_use(), 1);
    }

    #[test]
    fn random_reservations_never_overlap_a_live_span() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut r: Ring<Copy> = Ring::new(1000);
        let mut held: VecDeque<u64> = VecDeque::new();
        let mut placed = 0;
        for _ in 0..5000 {
            let len = 1 + next() % 400;
            match r.reserve(len, |d| Ok(*d), |_| Ok(())).unwrap() {
                Some(s) => {
                    placed += 1;
                    assert!(s.start + len <= 1000);
                    // Every other span still in the arena (held, leaving, or
                    // given up but not yet taken back) is disjoint from it.
                    for x in r.spans.iter().filter(|x| x.id != s.id) {
                        assert!(s.start + len <= x.start || x.start + x.len <= s.start, "overlaps a live span");
                    }
                    held.push_back(s.id);
                }
                None => {
                    // No room: let the oldest held span go (copied out, or given up).
                    let id = held.pop_front().expect("an empty arena has room");
                    if next() % 2 == 0 { r.leave(id, next() % 2 == 0) } else { r.free(id) }
                }
            }
        }
        assert!(placed > 1000, "{placed}");
    }
}
