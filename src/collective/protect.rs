//! The node-local tier's protection, version by version (issue #31): once
//! this rank's file of a version is durable on the node-local tier, its
//! bundle ([`crate::redundancy::bundle`]) goes to its partner on the next
//! node, or its parity segments to its XOR group, and every node's
//! directory receives every rank's commit part of the version (so the
//! tier commits the version on every node, and a restore there sees it).
//!
//! Runs on a thread of its own with its own communicator where MPI grants
//! `MPI_THREAD_MULTIPLE` (`Protector::start`); otherwise the next
//! collective call (checkpoint, wait, finalize) runs what is queued. Every
//! rank protects every version, in the order taken, so the ranks meet in
//! the same exchanges; a rank whose file is not durable takes part with
//! nothing, and the version is then not protected anywhere.

use super::reduce::ThreadComm;
use super::transfer;
use crate::error::{Error, Result};
use crate::redundancy::{Nodes, Plan, bundle, parity, parity_rel, partner_rel};
use crate::storage::{self, Posix, Storage};
use crate::store::commits::{CommitLog, CommitPart, part_rel};
use crate::tiers::TierWatch;
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// What protecting one version did on this rank.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Protection {
    /// Bytes this rank wrote for others (partner copies, parity, parts).
    pub bytes_written: u64,
    /// Seconds from the file durable on the node-local tier to its copies durable.
    pub seconds: f64,
}

/// How the node-local tier of one job is protected: the same on every rank.
#[derive(Clone, Debug)]
pub(crate) struct Scheme {
    /// This rank.
    pub me: u32,
    /// Every rank's node.
    pub nodes: Nodes,
    /// Who holds whose copy.
    pub plan: Plan,
    /// This rank's node-local tier root.
    pub root: PathBuf,
}

impl Scheme {
    /// Whether versions need a protection pass: copies to make, or nodes
    /// whose directories need each other's commit parts.
    pub fn active(&self) -> bool {
        self.plan != Plan::None || self.nodes.count() > 1
    }
}

/// Outcomes by version, shared with the thread.
#[derive(Default)]
struct Outcomes {
    done: Mutex<BTreeMap<u64, std::result::Result<Protection, String>>>,
    changed: Condvar,
}

/// Runs each version's protection, on a thread or in the next call.
pub(crate) struct Protector {
    scheme: Arc<Scheme>,
    watch: TierWatch,
    outcomes: Arc<Outcomes>,
    /// The thread's queue (`None`: no thread; `queued` runs in the call).
    jobs: Option<Sender<u64>>,
    thread: Option<JoinHandle<()>>,
    /// Versions waiting for the next call (no thread).
    queued: Vec<u64>,
    /// Versions handed to the thread and not waited for yet (it reports
    /// every one).
    handed: std::collections::BTreeSet<u64>,
    /// The communicator the calls use when there is no thread.
    comm: SimpleCommunicator,
    /// Versions the copies may lag behind the calls (0: no bound).
    max_lag: usize,
    /// Calls that waited for the copies to catch up, and their seconds.
    lag_waits: (u64, f64),
}

impl Protector {
    /// Starts protecting through `comm` (duplicated; a thread of its own
    /// where every rank's MPI allows it). Collective.
    /// With a thread, a call handing over a version waits while `max_lag`
    /// versions or more are still without their copies (0: never).
    pub fn start(comm: &SimpleCommunicator, scheme: Scheme, watch: TierWatch, max_lag: usize) -> Result<Self> {
        let scheme = Arc::new(scheme);
        // Retention keeps what the copies still read.
        watch.hold_for_copies();
        let outcomes = Arc::new(Outcomes::default());
        let threaded = ThreadComm::new(comm.duplicate());
        let mut everywhere = 0u8;
        comm.all_reduce_into(&u8::from(threaded.is_some()), &mut everywhere, ::mpi::collective::SystemOperation::min());
        let (jobs, thread) = match threaded.filter(|_| everywhere == 1) {
            Some(own) => {
                let (tx, rx) = channel::<u64>();
                let (scheme, watch, outcomes) = (Arc::clone(&scheme), watch.clone(), Arc::clone(&outcomes));
                let spawned = std::thread::Builder::new()
                    .name(format!("dckpt-protect-{}", scheme.me))
                    .spawn(move || {
                        background_priority();
                        for version in rx {
                            let run = || run_one(own.comm(), &scheme, &watch, &outcomes, version);
                            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).is_err() {
                                // A bug: recorded, so that no `wait` waits for it forever.
                                crate::sync::lock(&outcomes.done)
                                    .insert(version, Err("the protection thread panicked (a bug)".into()));
                                watch.copied(version);
                                outcomes.changed.notify_all();
                            }
                        }
                        // `own` is freed here, on the thread that used it.
                    })
                    .map_err(|e| Error::no_thread("the node-local tier's protection thread", e));
                let spawned = super::mpi::all_agree(comm, "starting the protection thread", 0, spawned)?;
                (Some(tx), Some(spawned))
            }
            None => (None, None),
        };
        Ok(Protector {
            scheme,
            watch,
            outcomes,
            jobs,
            thread,
            queued: Vec::new(),
            handed: Default::default(),
            comm: comm.duplicate(),
            max_lag,
            lag_waits: (0, 0.0),
        })
    }

    /// Queues `version` (taken on every rank, in the same order), first
    /// waiting, where the thread runs, until fewer than the bound of
    /// versions are still without their copies (span `protect-lag-wait`):
    /// the thread runs at the least priority and may starve while the
    /// application computes; the bound keeps a node loss from costing more
    /// than that many versions.
    pub fn submit(&mut self, version: u64) {
        if self.jobs.is_some() {
            self.wait_for_lag(version);
        }
        match &self.jobs {
            Some(tx) if tx.send(version).is_ok() => {
                self.handed.insert(version);
            }
            _ => self.queued.push(version),
        }
    }

    /// Blocks until fewer than `max_lag` versions handed to the thread are
    /// without their outcome.
    fn wait_for_lag(&mut self, version: u64) {
        if self.max_lag == 0 {
            return;
        }
        let mut done = crate::sync::lock(&self.outcomes.done);
        let behind: Vec<u64> = self.handed.iter().copied().filter(|v| !done.contains_key(v)).collect();
        if behind.len() < self.max_lag {
            return;
        }
        // Versions finish in order: the one that leaves max_lag - 1 behind.
        let until = behind[behind.len() - self.max_lag];
        let started = std::time::Instant::now();
        let _span = crate::profile::Span::new("protect-lag-wait", version);
        while !done.contains_key(&until) {
            done = crate::sync::wait(&self.outcomes.changed, done);
        }
        self.lag_waits.0 += 1;
        self.lag_waits.1 += started.elapsed().as_secs_f64();
    }

    /// Versions handed over and still without their copies (the lag now).
    pub fn lag(&self) -> usize {
        let done = crate::sync::lock(&self.outcomes.done);
        self.handed.iter().filter(|v| !done.contains_key(v)).count() + self.queued.len()
    }

    /// Calls that waited for the copies to catch up, and their seconds.
    pub fn lag_waits(&self) -> (u64, f64) {
        self.lag_waits
    }

    /// Runs what waits for a call (no thread). Collective.
    pub fn run_queued(&mut self) {
        for version in std::mem::take(&mut self.queued) {
            run_one(&self.comm, &self.scheme, &self.watch, &self.outcomes, version);
        }
    }

    /// Blocks until `version`'s protection is over on this rank: its
    /// outcome, or `None` for a version never submitted. Collective where
    /// no thread runs (it runs what is queued).
    pub fn wait(&mut self, version: u64) -> Option<std::result::Result<Protection, String>> {
        self.run_queued();
        let mut done = crate::sync::lock(&self.outcomes.done);
        if self.handed.remove(&version) {
            while !done.contains_key(&version) {
                done = crate::sync::wait(&self.outcomes.changed, done);
            }
        }
        done.get(&version).cloned()
    }

    /// Blocks until every version handed over is protected on this rank;
    /// the first failure. Collective where no thread runs.
    pub fn wait_all(&mut self) -> Result<()> {
        self.run_queued();
        let handed: Vec<u64> = std::mem::take(&mut self.handed).into_iter().collect();
        let mut done = crate::sync::lock(&self.outcomes.done);
        for v in &handed {
            while !done.contains_key(v) {
                done = crate::sync::wait(&self.outcomes.changed, done);
            }
        }
        let failed = handed.iter().find_map(|v| done.get(v)?.as_ref().err().map(|e| (*v, e.clone())));
        let tier = match self.scheme.plan {
            Plan::None => "local (the commit parts of other nodes)",
            _ => "redundancy",
        };
        match failed {
            Some((version, reason)) => Err(Error::NotDurable { version, tier: tier.into(), reason }),
            None => Ok(()),
        }
    }

    /// The outcome of `version` now, if its protection is over.
    pub fn outcome(&self, version: u64) -> Option<std::result::Result<Protection, String>> {
        crate::sync::lock(&self.outcomes.done).get(&version).cloned()
    }

    /// The scheme.
    pub fn scheme(&self) -> &Scheme {
        &self.scheme
    }
}

impl Drop for Protector {
    fn drop(&mut self) {
        // The thread finishes the versions it has (every rank handed it the
        // same, so its exchanges complete) and frees its communicator.
        drop(self.jobs.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One version: wait for this rank's file on the node-local tier, then
/// exchange and write; the outcome is recorded.
fn run_one(comm: &SimpleCommunicator, scheme: &Scheme, watch: &TierWatch, outcomes: &Outcomes, version: u64) {
    let durable = watch.wait_durable(version);
    // A starved thread, for the lag bound's tests (`failpoint::delay`).
    crate::failpoint::hit("protect.version");
    let t = std::time::Instant::now();
    meet_sleeping(comm);
    let _span = crate::profile::Span::new("protect", version);
    let outcome = protect(comm, scheme, version, durable)
        .map(|bytes_written| Protection { bytes_written, seconds: t.elapsed().as_secs_f64() })
        .map_err(|e| e.to_string());
    match &outcome {
        Ok(p) => tracing::debug!(
            "version {version}: the node-local tier's copies made on other nodes ({} bytes, {:.3} s)",
            p.bytes_written,
            p.seconds
        ),
        Err(e) => tracing::warn!("version {version}: the node-local tier's copies were not made: {e}"),
    }
    crate::sync::lock(&outcomes.done).insert(version, outcome);
    watch.copied(version);
    outcomes.changed.notify_all();
}

/// Lowers this thread's scheduling priority to the least (nice 19): its
/// work is never the application's, and MPI's calls spin while they wait
/// for another rank under `MPI_THREAD_MULTIPLE`; at the least priority the
/// spinning yields the CPU to the application's threads (on a node with
/// fewer cores than threads, it took 40 ms a version from the calls).
/// Best effort: where it is refused, the thread runs as it is.
fn background_priority() {
    let me = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(me), 19) {
        tracing::debug!("the protection thread keeps its priority: {e}");
    }
}

/// Waits until every rank's thread has reached the same version, asleep
/// between polls: MPI's blocking calls spin under `MPI_THREAD_MULTIPLE`,
/// and a thread spinning while a slower rank's flush finishes takes a CPU
/// from the application. The exchanges after it find every rank there.
fn meet_sleeping(comm: &SimpleCommunicator) {
    let mut pending = comm.immediate_barrier();
    loop {
        match pending.test() {
            Ok(_) => return,
            Err(still) => pending = still,
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The exchanges of one version: the copies, then every rank's commit
/// part to every node. The bytes written here. Collective over `comm`.
pub(crate) fn protect(comm: &SimpleCommunicator, scheme: &Scheme, version: u64, durable: bool) -> Result<u64> {
    let storage = Posix::at(&scheme.root);
    let mine = match durable {
        // Without copies (several nodes, redundancy none) only the parts move.
        true if scheme.plan == Plan::None => Ok(Vec::new()),
        true => bundle::make(&storage, scheme.me, version),
        false => Err(Error::NotDurable {
            version,
            tier: "local".into(),
            reason: format!("rank {}'s file is not durable there", scheme.me),
        }),
    };
    let (mine, status) = match mine {
        Ok(b) => (Some(b), Ok(())),
        Err(e) => (None, Err(e)),
    };
    let p = comm.size() as usize;
    let mut written = 0u64;
    let copies = match &scheme.plan {
        Plan::None => Ok(0),
        Plan::Partner { holder } => {
            let mut out = vec![Vec::new(); p];
            if let Some(b) = mine {
                out[holder[scheme.me as usize] as usize] = b;
            }
            let got = transfer::exchange(comm, &out)?;
            write_partner_copies(&storage, scheme, version, &got)
        }
        Plan::Xor { .. } => write_parity(comm, &storage, scheme, version, mine.as_deref()),
    };
    written += *copies.as_ref().unwrap_or(&0);
    let parts = sync_parts(comm, &storage, scheme, version, durable);
    written += *parts.as_ref().unwrap_or(&0);
    // Every rank learns whether every rank's file and copies made it.
    let ok = status.and(copies.map(drop)).and(parts.map(drop));
    super::mpi::all_agree(comm, "protecting the node-local tier", version, ok)?;
    retire_copies(&storage, scheme);
    Ok(written)
}

/// Writes the partner copies received (`got[r]`: rank r's bundle, empty
/// when it had none); the bytes written.
fn write_partner_copies(storage: &Posix, scheme: &Scheme, version: u64, got: &[Vec<u8>]) -> Result<u64> {
    let mut written = 0;
    for r in scheme.plan.held_by(scheme.me) {
        let bytes = &got[r as usize];
        if bytes.is_empty() {
            return Err(Error::Collective(format!("rank {r} sent no copy of version {version}")));
        }
        let rel = partner_rel(r, version);
        let (rank, v) = bundle::check(bytes, &storage.locate(&rel))?;
        if (rank, v) != (r, version) {
            return Err(Error::Collective(format!("rank {r} sent a copy of rank {rank} version {v}")));
        }
        write_durably(storage, &rel, bytes)?;
        written += bytes.len() as u64;
    }
    Ok(written)
}

/// This rank's parity segment of its group's `version` (`mine`: its
/// bundle, `None` when it has none); the bytes written.
fn write_parity(
    comm: &SimpleCommunicator,
    storage: &Posix,
    scheme: &Scheme,
    version: u64,
    mine: Option<&[u8]>,
) -> Result<u64> {
    let p = comm.size() as usize;
    // Every rank's bundle length (0: none) and digest.
    let mut word = [0u64; 5];
    if let Some(b) = mine {
        word[0] = b.len() as u64;
        for (w, c) in word[1..].iter_mut().zip(blake3::hash(b).as_bytes().chunks_exact(8)) {
            *w = u64::from_le_bytes(c.try_into().unwrap_or_default());
        }
    }
    let mut all = vec![0u64; 5 * p];
    comm.all_gather_into(&word[..], &mut all[..]);
    let group = scheme.plan.group_of(scheme.me).map(<[u32]>::to_vec).unwrap_or_default();
    let lens: Vec<u64> = group.iter().map(|&r| all[5 * r as usize]).collect();
    let complete = lens.iter().all(|&l| l > 0);
    let seg_len = parity::segment_len(lens.iter().copied().max().unwrap_or(0), group.len());
    let pos = group.iter().position(|&r| r == scheme.me).unwrap_or(0);
    let mut out = vec![Vec::new(); p];
    if let (true, Some(b)) = (complete, mine) {
        for (j, &r) in group.iter().enumerate().filter(|&(j, _)| j != pos) {
            out[r as usize] = parity::segment(b, parity::slot(pos, j), seg_len);
        }
    }
    let got = transfer::exchange(comm, &out)?;
    if !complete {
        let missing: Vec<u32> = group.iter().zip(&lens).filter(|(_, l)| **l == 0).map(|(r, _)| *r).collect();
        return Err(Error::Collective(format!(
            "rank(s) {missing:?} of the parity group have no file of version {version}"
        )));
    }
    let mut seg = vec![0u8; seg_len as usize];
    for &r in group.iter().filter(|&&r| r != scheme.me) {
        parity::xor_into(&mut seg, &got[r as usize]);
    }
    let digests = group
        .iter()
        .map(|&r| {
            let bytes: Vec<u8> =
                all[5 * r as usize + 1..5 * r as usize + 5].iter().flat_map(|w| w.to_le_bytes()).collect();
            hex::encode(&bytes)
        })
        .collect();
    let header = parity::ParityHeader {
        version,
        holder: scheme.me,
        members: group.clone(),
        lens,
        digests,
        segment_len: seg_len,
    };
    let file = parity::encode(&header, &seg);
    write_durably(storage, &parity_rel(scheme.me, version), &file)?;
    Ok(file.len() as u64)
}

/// Every rank's commit part of `version` into every node's directory (the
/// node's lowest rank writes those of other nodes' ranks); the bytes
/// written. Collective.
fn sync_parts(comm: &SimpleCommunicator, storage: &Posix, scheme: &Scheme, version: u64, durable: bool) -> Result<u64> {
    if scheme.nodes.count() < 2 {
        return Ok(0);
    }
    // A read that fails here still takes part in the gather (with nothing),
    // and fails after it: every rank meets in the same collectives.
    let read = match durable {
        true => storage.read(&part_rel(version, scheme.me)).map(Option::unwrap_or_default),
        false => Ok(Vec::new()),
    };
    let all = transfer::gather(comm, read.as_deref().unwrap_or_default())?;
    read?;
    if scheme.nodes.leader_of(scheme.me) != scheme.me {
        return Ok(0);
    }
    let mut written = 0;
    for (r, bytes) in all.iter().enumerate() {
        let r = r as u32;
        if bytes.is_empty() || scheme.nodes.node(r) == scheme.nodes.node(scheme.me) {
            continue;
        }
        written += write_part(storage, version, r, bytes, true)?;
    }
    Ok(written)
}

/// Writes rank `rank`'s commit part of `version` (checked first) where it
/// is not already (or, unless `replace`, where there is none); the bytes
/// written.
pub(crate) fn write_part(storage: &Posix, version: u64, rank: u32, bytes: &[u8], replace: bool) -> Result<u64> {
    let rel = part_rel(version, rank);
    let part = CommitPart::decode(bytes, &storage.locate(&rel))?;
    if (part.version, part.entry.rank) != (version, rank) {
        return Err(Error::Collective(format!(
            "rank {rank} sent the part of rank {} version {}",
            part.entry.rank, part.version
        )));
    }
    match storage.read(&rel)? {
        Some(there) if there == bytes || !replace => return Ok(0),
        _ => {}
    }
    storage.create_dir(Path::new(crate::store::commits::COMMITS_DIR))?;
    write_durably(storage, &rel, bytes)?;
    Ok(bytes.len() as u64)
}

/// Writes `bytes` at `rel` durably (file, rename, directory).
fn write_durably(storage: &Posix, rel: &Path, bytes: &[u8]) -> Result<()> {
    let dir = rel.parent().unwrap_or(Path::new(""));
    storage.create_dir(dir)?;
    storage::write_bytes(storage, rel, bytes)?;
    storage.barrier(dir)
}

/// Removes the copies this rank holds of versions older than the oldest
/// one the node-local tier still commits (retention deleted them).
fn retire_copies(storage: &Posix, scheme: &Scheme) {
    let Ok(log) = CommitLog::load_from(storage) else { return };
    let Some(oldest) = log.records().map(|r| r.version).min() else { return };
    let mut dirs: Vec<PathBuf> = scheme
        .plan
        .held_by(scheme.me)
        .into_iter()
        .filter_map(|r| partner_rel(r, 0).parent().map(Path::to_path_buf))
        .collect();
    if let Some(d) = parity_rel(scheme.me, 0).parent() {
        dirs.push(d.to_path_buf());
    }
    // Other nodes' ranks' parts older than that: their writers retire their
    // own; here the node's lowest rank does.
    if scheme.nodes.leader_of(scheme.me) == scheme.me {
        let commits = Path::new(crate::store::commits::COMMITS_DIR);
        for e in storage.list(commits).unwrap_or_default() {
            let old_foreign = crate::store::commits::parse_part_name(&e.name).is_some_and(|(v, r)| {
                v < oldest && r < scheme.nodes.ranks() && scheme.nodes.node(r) != scheme.nodes.node(scheme.me)
            });
            if old_foreign {
                let _ = storage.remove(&commits.join(&e.name));
            }
        }
    }
    for dir in dirs {
        for e in storage.list(&dir).unwrap_or_default() {
            let v = e.name.strip_prefix('v').and_then(|n| n.split('.').next()).and_then(|n| n.parse::<u64>().ok());
            if v.is_some_and(|v| v < oldest) {
                let _ = storage.remove(&dir.join(&e.name));
            }
        }
    }
}

/// Every rank's node: blocks of `ranks_per_node` ranks when it is set,
/// else the ranks MPI says share memory. Collective.
pub fn node_map<C: Communicator>(comm: &C, ranks_per_node: u32) -> Nodes {
    // The same collectives whatever a rank's setting (ranks that disagree
    // are refused at a name's first use, not left waiting here).
    let node = comm.split_shared(0);
    let mut leader = comm.rank() as u64;
    node.process_at_rank(0).broadcast_into(&mut leader);
    let mut all = vec![0u64; comm.size() as usize];
    comm.all_gather_into(&leader, &mut all[..]);
    match ranks_per_node {
        0 => Nodes::from_ids(&all),
        k => Nodes::blocks(comm.size() as u32, k),
    }
}

/// The scheme of `tiers` (the node-local root with `{node}` resolved) for
/// this rank, if it has a node-local tier. Collective.
pub(crate) fn scheme_of<C: Communicator>(
    comm: &C,
    local: Option<&Path>,
    opts: &super::CollectiveOptions,
) -> Result<Option<Scheme>> {
    let nodes = node_map(comm, opts.ranks_per_node);
    let me = comm.rank().max(0) as u32;
    // Before anything depends on them: every rank the same scheme and nodes.
    let mine = [opts.redundancy.code(), u64::from(opts.ranks_per_node), u64::from(local.is_some())];
    let mut all = vec![0u64; 3 * comm.size() as usize];
    comm.all_gather_into(&mine[..], &mut all[..]);
    if all.chunks(3).any(|w| w != mine) {
        return Err(Error::InvalidOption(
            "ranks disagree on redundancy, ranks_per_node or whether there is a node-local tier".into(),
        ));
    }
    let Some(local) = local else {
        return match opts.redundancy.is_some() {
            true => Err(Error::InvalidOption(format!(
                "redundancy = \"{}\" protects the node-local tier, and none is configured (set scratch)",
                opts.redundancy
            ))),
            false => Ok(None),
        };
    };
    let plan = Plan::new(&nodes, opts.redundancy)?;
    let root = crate::redundancy::on_node(local, nodes.node(me));
    Ok(Some(Scheme { me, nodes, plan, root }))
}
