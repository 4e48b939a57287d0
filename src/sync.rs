//! Locks, with one poisoning policy for the whole library.
//!
//! A mutex a panicking thread held is taken as it is, not refused: every
//! critical section in dckpt leaves its data consistent before anything in
//! it can panic, and a thread's panic is reported where the thread is
//! joined (as an error of the version it served). Refusing every later
//! call instead would turn one failure into a hang or an abort of the
//! simulation that checkpoints.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// Locks `m` (poisoned or not).
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `cv` with `guard` (poisoned or not).
pub fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(PoisonError::into_inner)
}

/// The value of a mutex owned exclusively (poisoned or not).
pub fn get_mut<T: ?Sized>(m: &mut Mutex<T>) -> &mut T {
    m.get_mut().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_taken_as_it_is() {
        let m = std::sync::Arc::new(Mutex::new(5));
        let held = std::sync::Arc::clone(&m);
        let _ = std::thread::spawn(move || {
            let _g = lock(&held);
            panic!("a worker fails while holding the lock");
        })
        .join();
        assert!(m.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 6);
        let pair = std::sync::Arc::new((Mutex::new(false), Condvar::new()));
        let other = std::sync::Arc::clone(&pair);
        let t = std::thread::spawn(move || {
            *lock(&other.0) = true;
            other.1.notify_all();
        });
        let mut g = lock(&pair.0);
        while !*g {
            g = wait(&pair.1, g);
        }
        drop(g);
        t.join().expect("the notifier");
    }
}
