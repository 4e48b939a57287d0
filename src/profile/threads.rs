//! What the threads of this process are doing while one of them works: a
//! sampler reading Linux's `/proc/self/task/*/{stat,syscall,wchan}` every
//! few tens of microseconds (`DCKPT_GPU_PROFILE=threads`). Where a thread
//! blocks, it tells in which system call and kernel wait, and which other
//! threads were running or blocked at that moment. Diagnostic only; where
//! `/proc` does not read, it records nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One sample taken while the watched thread was not running.
#[derive(Clone, Debug)]
pub struct Blocked {
    /// When.
    pub at: Instant,
    /// The watched thread: `state syscall wchan`.
    pub watched: String,
    /// The other threads then running (`R`) or in uninterruptible sleep
    /// (`D`): `name:state:syscall:wchan`.
    pub others: Vec<String>,
}

/// A sampler of one thread (see the module's documentation).
pub struct ThreadSampler {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Vec<Blocked>>>,
}

/// This thread's id (from Linux's `/proc/thread-self`; 0 where it does not read).
pub fn current_tid() -> i64 {
    std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name().and_then(|n| n.to_str()).and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

impl ThreadSampler {
    /// Starts sampling thread `tid` of this process.
    pub fn start(tid: i64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = std::thread::Builder::new().name("dckpt-sampler".into()).spawn(move || sample(tid, &flag)).ok();
        ThreadSampler { stop, handle }
    }

    /// Stops sampling: what it saw.
    pub fn finish(mut self) -> Vec<Blocked> {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.take().and_then(|h| h.join().ok()).unwrap_or_default()
    }
}

impl Drop for ThreadSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Counts of the watched thread's waits and of what the others did then,
/// for the samples in `[from, to)`, as one line.
pub fn summary(samples: &[Blocked], from: Instant, to: Instant) -> String {
    let mut waits: BTreeMap<&str, usize> = BTreeMap::new();
    let mut others: BTreeMap<&str, usize> = BTreeMap::new();
    for s in samples.iter().filter(|s| s.at >= from && s.at < to) {
        *waits.entry(&s.watched).or_default() += 1;
        for o in &s.others {
            *others.entry(o).or_default() += 1;
        }
    }
    let list = |m: &BTreeMap<&str, usize>| m.iter().map(|(k, n)| format!("{k} x{n}")).collect::<Vec<_>>().join(", ");
    format!("[{}] while [{}]", list(&waits), list(&others))
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// `(name, state)` from a `/proc/.../stat` line.
fn name_and_state(stat: &str) -> Option<(String, char)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_string();
    let state = stat.get(close + 1..)?.trim_start().chars().next()?;
    Some((name, state))
}

fn syscall_and_wchan(task: &str) -> String {
    let nr = read(&format!("{task}/syscall"))
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into());
    let wchan = read(&format!("{task}/wchan")).unwrap_or_else(|| "?".into());
    format!("sys{nr}:{}", if wchan.is_empty() { "-" } else { wchan.trim() })
}

fn sample(tid: i64, stop: &AtomicBool) -> Vec<Blocked> {
    let me = current_tid();
    let watched = format!("/proc/self/task/{tid}");
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
        let Some((_, state)) = read(&format!("{watched}/stat")).as_deref().and_then(name_and_state) else {
            break;
        };
        if state == 'R' {
            std::thread::yield_now();
            continue;
        }
        let at = Instant::now();
        let what = format!("{state}:{}", syscall_and_wchan(&watched));
        let mut others = Vec::new();
        if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
            for e in dir.flatten() {
                let id = e.file_name().to_string_lossy().parse::<i64>().unwrap_or(0);
                if id == tid || id == me {
                    continue;
                }
                let task = format!("/proc/self/task/{id}");
                if let Some((name, st)) = read(&format!("{task}/stat")).as_deref().and_then(name_and_state)
                    && (st == 'R' || st == 'D')
                {
                    others.push(format!("{name}:{st}:{}", syscall_and_wchan(&task)));
                }
            }
        }
        others.sort();
        out.push(Blocked { at, watched: what, others });
    }
    out
}
