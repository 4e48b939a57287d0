//! The per-node agent (issue #44): a process of its own that finishes the
//! flushes of ranks that died. With `agent = "auto"` each rank's host cache
//! lies in shared memory with a journal beside it ([`crate::tiers::journal`]);
//! the ranks flush as before, and when a rank's process dies (its journal's
//! lock falls free) the agent maps the segments it left, writes every
//! version the journal names to the tiers that do not hold it yet, lists it
//! as the rank would have (commit part or manifest) and removes the journal.
//! A checkpoint whose call returned is then restorable after `kill -9` of
//! every rank (not after the node's loss: that is redundancy's job).
//!
//! One agent runs per user and node, found by the lock it holds
//! (`<root>/agent.lock`) and started by [`ensure_running`] (`Runtime::init`,
//! under `<root>/spawn.lock`) or by a job script (`dckpt agent`); it exits
//! once the directory has held no journal for its idle time. Anyone may do
//! its work: [`sweep`] finishes every journal whose process is dead, and
//! `Runtime::init` runs it too ([`finish_dead`]) before a new job opens its
//! stores, so nothing is finished while a new job writes, and a dead agent
//! only delays the work. Two jobs on one node keep separate journals, each
//! naming its own stores: never mixed.

pub mod finish;

use crate::error::{Error, Result};
use crate::tiers::journal::{prepare_root, read_owner};
use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use crate::tiers::journal::default_root;
pub use finish::Finished;

/// What one journal directory holds, for `dckpt agent --status`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct JournalStatus {
    /// The directory.
    pub dir: PathBuf,
    /// The process that wrote it.
    pub owner: Option<u32>,
    /// Whether that process holds it still (alive).
    pub alive: bool,
    /// Its rank, if its meta reads.
    pub rank: Option<u32>,
    /// The versions not settled on every tier.
    pub pending: Vec<u64>,
}

/// The agents' directory as [`status`] sees it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct AgentStatus {
    /// The directory.
    pub root: PathBuf,
    /// The running agent's pid, if one runs.
    pub agent: Option<u32>,
    /// The journals in it.
    pub journals: Vec<JournalStatus>,
}

/// What one [`sweep`] found.
#[derive(Debug, Default)]
pub struct Sweep {
    /// Journals finished now: the directory and what was done.
    pub finished: Vec<(PathBuf, Result<Finished>)>,
    /// Journals of live processes.
    pub live: usize,
    /// Journals of dead processes that another process is finishing now.
    pub busy: usize,
}

fn open_lock(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// The journal directories of `root` (`<pid>-<n>`; hidden ones are still being made).
fn journal_dirs(root: &Path) -> Vec<PathBuf> {
    let Ok(items) = std::fs::read_dir(root) else { return Vec::new() };
    let mut dirs: Vec<PathBuf> = items
        .filter_map(|i| i.ok())
        .filter(|i| {
            let name = i.file_name();
            let name = name.to_string_lossy();
            !name.starts_with('.') && name.contains('-') && i.file_type().is_ok_and(|t| t.is_dir())
        })
        .map(|i| i.path())
        .collect();
    dirs.sort();
    dirs
}

/// Whether process `pid` exists.
fn alive(pid: u32) -> bool {
    rustix::process::Pid::from_raw(pid as i32)
        .is_some_and(|p| rustix::process::test_kill_process(p).is_ok() || Path::new(&format!("/proc/{pid}")).exists())
}

/// One pass over `root`: every journal whose process is dead and that no
/// one else is finishing is finished here and removed.
pub fn sweep(root: &Path) -> Sweep {
    let mut sweep = Sweep::default();
    for dir in journal_dirs(root) {
        let lock = match open_lock(&dir.join("lock")) {
            Ok(f) => f,
            Err(_) => continue, // removed meanwhile
        };
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                match read_owner(&dir) {
                    Some(pid) if !alive(pid) => sweep.busy += 1,
                    _ => sweep.live += 1,
                }
                continue;
            }
            Err(std::fs::TryLockError::Error(_)) => continue,
        }
        // Held: its process is dead (or it is being removed by its owner,
        // which holds the lock until the directory is gone).
        if !dir.join("meta.json").exists() {
            let _ = std::fs::remove_dir_all(&dir);
            continue;
        }
        let outcome = finish::finish(&dir);
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            tracing::warn!("the agent: removing {}: {e}", dir.display());
        }
        drop(lock);
        sweep.finished.push((dir, outcome));
    }
    sweep
}

/// Finishes every journal in `root` whose process is dead, here or by the
/// process already at it, within `timeout` (`Runtime::init`, before a new
/// job opens its stores); what this process finished.
pub fn finish_dead(root: &Path, timeout: Duration) -> Result<Vec<(PathBuf, Result<Finished>)>> {
    let t = Instant::now();
    let mut finished = Vec::new();
    loop {
        let mut s = sweep(root);
        finished.append(&mut s.finished);
        if s.busy == 0 {
            return Ok(finished);
        }
        if t.elapsed() > timeout {
            return Err(Error::Internal(format!(
                "{} journal(s) of dead processes in {} are still being finished after {:.0} s (by the dckpt agent?)",
                s.busy,
                root.display(),
                timeout.as_secs_f64()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pid of the agent running for `root`, if any.
pub fn running(root: &Path) -> Option<u32> {
    let f = open_lock(&root.join("agent.lock")).ok()?;
    match f.try_lock() {
        Ok(()) => None, // no agent holds it (dropped: released)
        Err(_) => std::fs::read_to_string(root.join("agent.lock")).ok()?.trim().parse().ok(),
    }
}

/// What [`status`] reports of `root`.
pub fn status(root: &Path) -> AgentStatus {
    let journals = journal_dirs(root)
        .into_iter()
        .map(|dir| {
            let owner = read_owner(&dir);
            let held = open_lock(&dir.join("lock")).is_ok_and(|f| f.try_lock().is_err());
            let read = finish::read_journal(&dir).ok();
            JournalStatus {
                owner,
                alive: held && owner.is_some_and(alive),
                rank: read.as_ref().map(|(m, _)| m.rank),
                pending: read.map(|(_, e)| e.iter().map(|e| e.version).collect()).unwrap_or_default(),
                dir,
            }
        })
        .collect();
    AgentStatus { root: root.to_path_buf(), agent: running(root), journals }
}

/// How the agent's loop went.
#[derive(Debug, PartialEq, Eq)]
pub enum Ran {
    /// Another agent runs for this directory (its pid).
    AlreadyRunning(Option<u32>),
    /// It ran until the directory had been idle for the idle time.
    Idle,
}

/// The agent's loop for `root`: takes the agent's lock (or reports the one
/// that holds it), then sweeps every `poll` until no journal has been there
/// for `idle` and no process has wanted it for as long ([`ensure_running`]);
/// `report` hears of every journal finished.
pub fn run(
    root: &Path,
    idle: Duration,
    poll: Duration,
    report: &mut dyn FnMut(&Path, &Result<Finished>),
) -> Result<Ran> {
    prepare_root(root)?;
    let path = root.join("agent.lock");
    let mut lock = open_lock(&path).map_err(|e| Error::io(&path, e))?;
    // A rank's liveness probe holds the lock for a moment: try for a while.
    let mut tries = 0;
    loop {
        match lock.try_lock() {
            Ok(()) => break,
            Err(std::fs::TryLockError::WouldBlock) if tries < 20 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(25));
            }
            Err(std::fs::TryLockError::WouldBlock) => return Ok(Ran::AlreadyRunning(running(root))),
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(&path, e)),
        }
    }
    {
        use std::io::{Seek, Write};
        let _ = lock.set_len(0).and_then(|()| lock.rewind()).and_then(|()| write!(lock, "{}", std::process::id()));
    }
    let mut quiet_since = Instant::now();
    loop {
        let s = sweep(root);
        for (dir, outcome) in &s.finished {
            report(dir, outcome);
        }
        if s.live + s.busy > 0 || !s.finished.is_empty() {
            quiet_since = Instant::now();
        } else if quiet_since.elapsed() >= idle && !wanted_within(root, idle) {
            return Ok(Ran::Idle);
        }
        std::thread::sleep(poll);
    }
}

/// Where the `dckpt` program is, to start an agent: beside this process's
/// program (or one folder up: cargo's `examples/`), else on `PATH`.
pub fn find_program() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok();
    let beside = exe.as_ref().and_then(|e| e.parent()).into_iter().flat_map(|d| [d.to_path_buf(), d.join("..")]);
    let path = std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default();
    beside.chain(path).map(|d| d.join("dckpt")).find(|p| p.is_file())
}

/// Tells the agent of `root` a process wants it (`<root>/wanted`, whose
/// time the agent counts as activity): one found at a job's start stays for
/// its idle time at least, though no journal is open yet.
fn want(root: &Path) {
    let path = root.join("wanted");
    let touched = open_lock(&path).and_then(|f| f.set_modified(std::time::SystemTime::now()));
    if let Err(e) = touched {
        tracing::debug!("the agent: touching {}: {e}", path.display());
    }
}

/// Whether a process wanted the agent of `root` within `idle`.
fn wanted_within(root: &Path, idle: Duration) -> bool {
    std::fs::metadata(root.join("wanted"))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age < idle)
}

/// Makes sure an agent runs for `root`: the pid of the one running or
/// started now; `None` where no `dckpt` program was found (the journals then
/// wait for the next job on this node, or `dckpt agent`).
pub fn ensure_running(root: &Path) -> Result<Option<u32>> {
    prepare_root(root)?;
    want(root);
    if let Some(pid) = running(root) {
        return Ok(Some(pid));
    }
    let spawn_path = root.join("spawn.lock");
    let spawn = open_lock(&spawn_path).map_err(|e| Error::io(&spawn_path, e))?;
    // One rank of the node starts it; the others wait for that (bounded).
    spawn.lock().map_err(|e| Error::io(&spawn_path, e))?;
    if let Some(pid) = running(root) {
        return Ok(Some(pid));
    }
    let Some(program) = find_program() else { return Ok(None) };
    let log_path = root.join("agent.log");
    let log = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&log_path)
        .map_err(|e| Error::io(&log_path, e))?;
    use std::os::unix::process::CommandExt;
    let child = std::process::Command::new(&program)
        .arg("agent")
        .arg("--dir")
        .arg(root)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        // Its own process group: what kills the job's ranks (mpirun
        // signals their groups) does not kill it.
        .process_group(0)
        .env_remove("DCKPT_CRASH_AT")
        .spawn()
        .map_err(|e| Error::io(&program, e))?;
    let pid = child.id();
    // It outlives this process (then init reaps it); while this one lives,
    // a thread reaps it when it exits.
    let mut child = child;
    let _ = std::thread::Builder::new().name("dckpt-agent-reaper".into()).spawn(move || child.wait());
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if running(root).is_some() {
            return Ok(Some(pid));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(Error::Internal(format!(
        "the dckpt agent ({}) did not start within 5 s; see {}",
        program.display(),
        log_path.display()
    )))
}
