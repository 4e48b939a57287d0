//! The collective checkpoint through the asynchronous tiers: the
//! application waits for the local de-duplication and the copy of its diff
//! into the host cache; each rank's flush workers then make **its own**
//! files durable on every tier and write its commit part there
//! (`crate::store::commits`). A version is committed on a tier once every
//! rank's part is there, so a restore never follows a reference to an
//! owner's file that is not durable on the tier it reads.
//!
//! Where MPI grants `MPI_THREAD_MULTIPLE` (and `CollectiveOptions::overlap`
//! wants it on every rank: [`Overlap`](super::Overlap)) the collective step
//! runs beside the call, on a background thread with its own communicator:
//! the call commits and queues the version as local-only does, and the
//! step's outcome reaches the version's flush (the file's rewrite) and the
//! next call (the record's moves) through the version's gate
//! (`background::StepGate`):
//!
//! ```text
//! checkpoint(v): settle(<v) ─► agree(baseline?) ─► dedup ─► cache ─► agree ─► commit + queue ─► hand to the thread ─► return
//!                the step's thread (own communicator): describe (from the cached file) ─► tuple set ─► reduce ─► give away ─► gate
//!                each rank's flush workers, in the background: wait at the gate ─► rewrite ─► file durable on tier t ─► its part on tier t
//! settle(v):     the gate's decision: the record entries of the regions given away move to their owners'
//!                copies; a step not decided yet is late: the version keeps its regions (LateStep)
//! wait(v):       settle (late steps per LateStep) ─► every rank waits for its own flushes ─► allgather ─► durable on tier t iff on every rank
//! ```
//!
//! Every version takes this one road. Where the step has no thread, the
//! same step (`background::run_step`) runs in the call on the call's
//! reduction communicator, and the call settles the version before it
//! returns; with nothing to offer (local-only, one rank) there is no step
//! and the version settles at once. Agreements a version: the baseline's
//! (`MPI_Allgather`), the hand-over's, and the step's reduction.
//!
//! A flush that fails on any rank makes the next version a baseline on
//! every rank (the first agreement of each checkpoint carries it), so no
//! chain on any tier is built over a version some rank could not write. A
//! rank whose background step fails keeps the version's regions (an owner
//! never gives its own away, so no other rank's reference breaks): nothing
//! is abandoned.

use super::CollectiveOptions;
use super::background::{Decision, GateGuard, KeptWhy, StepGate, StepParams, StepWorker, Task, run_step};
use super::merge::HashFreq;
use super::mpi::{CollectiveReport, agree_or_abandon, all_agree, alone, cpu_share, exchange_layouts, open_checks};
use super::protect::{Protection, Protector, scheme_of};
use super::recover::{Recovered, fetch_for_restore, prepare};
use super::reduce::{Reduction, ThreadComm};
use crate::backend::GivenAway;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::memory::{Protected, ProtectedMut};
use crate::store::StoreOptions;
use crate::tiers::{Listing, TierOptions, TieredEngine, TieredReport};
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::*;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// Settled reports a handle keeps for [`TieredCollective::take_settled`]
/// (older ones are dropped when nobody takes them).
pub const KEPT_REPORTS: usize = 4096;

/// A version whose step runs beside the application: the call's report and
/// its step's gate.
struct InFlight {
    report: CollectiveReport<TieredReport>,
    gate: Arc<StepGate>,
}

/// A rank's collective checkpointing through the asynchronous tiers.
///
/// ```no_run
/// # fn main() -> dckpt::Result<()> {
/// use mpi::traits::*;
/// let universe = mpi::initialize().expect("MPI");
/// let world = universe.world();
/// let data = vec![0u8; 1 << 20];
/// let tiers = dckpt::tiers::TierOptions { shared: Some("ckpt".into()), ..Default::default() };
/// let mut ckpt = dckpt::collective::TieredCollective::open(
///     &world, &tiers, data.len() as u64, &Default::default(), &Default::default())?;
/// ckpt.checkpoint(1, &data)?; // returns once `data` may change again
/// ckpt.wait(1)?; // collective: durable on every tier, on every rank
/// # Ok(()) }
/// ```
pub struct TieredCollective {
    /// The node-local tier's copies on other nodes, version by version
    /// (`CollectiveOptions::redundancy`; also every node's commit parts
    /// when ranks run on several nodes). First, so that its thread is
    /// joined while the flush workers it waits for still run.
    protector: Option<Protector>,
    /// What opening rebuilt on the node-local tier.
    recovered: Recovered,
    /// The thread running the collective step off the application's path
    /// (`opts.overlap`, where MPI allows it and every rank wants it).
    /// First, so that it is joined (its task's cached version dropped)
    /// before the engine goes.
    worker: Option<StepWorker>,
    /// A duplicate of the application's communicator (the handle borrows
    /// nothing; its collectives never mix with the application's).
    comm: SimpleCommunicator,
    engine: TieredEngine,
    opts: CollectiveOptions,
    layouts: Arc<Vec<Layout>>,
    max_level: u32,
    /// The versions handed to `worker` and not settled yet, oldest first:
    /// each call's report and the gate its step decides.
    in_flight: VecDeque<InFlight>,
    /// Settled reports not taken yet ([`TieredCollective::take_settled`]),
    /// the newest [`KEPT_REPORTS`] at most.
    settled: Vec<CollectiveReport<TieredReport>>,
    /// The reduction when the step runs in the call (the step's thread
    /// keeps its own), on its own communicator.
    reduction: Reduction,
    /// What every step of this handle shares (in the call or on the thread).
    params: StepParams,
}

impl TieredCollective {
    /// Opens (or creates) this rank's stores on every tier for a buffer of
    /// `data_len` bytes. Collective; ranks must agree on the chunk size,
    /// hash, method (with a record), K and region size.
    pub fn open<C: Communicator>(
        comm: &C,
        tiers: &TierOptions,
        data_len: u64,
        store: &StoreOptions,
        opts: &CollectiveOptions,
    ) -> Result<Self> {
        let (rank, device, backend) = open_checks(comm, store, opts);
        // The node-local tier ({node} resolved) and, before any writer
        // opens it, a lost node's files rebuilt and every rank's commit parts.
        let scheme =
            all_agree(comm, "the node-local tier's redundancy", 0, scheme_of(comm, tiers.local.as_deref(), opts))?;
        if tiers
            .shared
            .as_deref()
            .and_then(std::path::Path::to_str)
            .is_some_and(|s| s.contains(crate::redundancy::NODE_PLACEHOLDER))
        {
            return Err(Error::InvalidOption(format!(
                "the shared directory {} holds {}: only the node-local one may",
                tiers.shared.as_deref().map(|p| p.display().to_string()).unwrap_or_default(),
                crate::redundancy::NODE_PLACEHOLDER
            )));
        }
        let tiers = &TierOptions { local: scheme.as_ref().map(|s| s.root.clone()), ..tiers.clone() };
        let active = scheme.as_ref().filter(|s| s.active());
        let recovered = match active {
            Some(s) => prepare(comm, s)?,
            None => Recovered::default(),
        };
        let listing = Listing::Part { rank, ranks: comm.size() as u32 };
        let opened = backend.and_then(|b| TieredEngine::open_for(rank, data_len, store, tiers, b, device, listing));
        let engine = all_agree(comm, "open", 0, opened)?;
        let layout = Layout::new(data_len, store.chunk_size)?;
        let (layouts, max_level) = exchange_layouts(comm, layout, store, opts)?;
        let layouts = Arc::new(layouts);
        let comm = comm.duplicate();
        let protector = match scheme.filter(|s| s.active()) {
            Some(s) => Some(Protector::start(&comm, s, engine.tier_watch(0), opts.max_copy_lag as usize)?),
            None => None,
        };
        let cpus = cpu_share(&comm);
        let wanted = opts.overlap.wanted(engine.backend(), cpus);
        let params = StepParams {
            me: rank,
            layouts: Arc::clone(&layouts),
            threshold: opts.threshold,
            min_region_bytes: opts.min_region_bytes,
        };
        let worker = Self::start_worker(&comm, &params, opts, wanted)?;
        let reduction = Reduction::new(&comm);
        Ok(TieredCollective {
            protector,
            recovered,
            comm,
            engine,
            opts: opts.clone(),
            layouts,
            max_level,
            worker,
            in_flight: VecDeque::new(),
            settled: Vec::new(),
            reduction,
            params,
        })
    }

    /// Readies the node-local tier of `tiers` for a job's first look at it
    /// (what [`TieredCollective::open`] also does first): a lost node's
    /// files rebuilt from their copies, every rank's commit parts on every
    /// node. Nothing to do on one node without redundancy. Collective; an
    /// error on every rank names what cannot be rebuilt.
    pub fn prepare<C: Communicator>(comm: &C, tiers: &TierOptions, opts: &CollectiveOptions) -> Result<Recovered> {
        let scheme =
            all_agree(comm, "the node-local tier's redundancy", 0, scheme_of(comm, tiers.local.as_deref(), opts))?;
        match scheme.filter(|s| s.active()) {
            Some(s) => prepare(comm, &s),
            None => Ok(Recovered::default()),
        }
    }

    /// Gives every node's node-local directory every rank's commit parts
    /// and region tables (after a program wrote its tables; nothing to do
    /// on one node). Collective.
    pub fn share_across_nodes<C: Communicator>(comm: &C, tiers: &TierOptions, opts: &CollectiveOptions) -> Result<()> {
        let scheme =
            all_agree(comm, "the node-local tier's redundancy", 0, scheme_of(comm, tiers.local.as_deref(), opts))?;
        let Some(s) = scheme.filter(|s| s.nodes.count() > 1) else { return Ok(()) };
        let shared = super::recover::share(comm, &s, &crate::storage::Posix::at(&s.root));
        all_agree(comm, "sharing the commit parts and region tables", 0, shared).map(drop)
    }

    /// What opening rebuilt on the node-local tier (a lost node's files).
    pub fn recovered(&self) -> &Recovered {
        &self.recovered
    }

    /// Hands a version taken on every rank to the protection of the
    /// node-local tier, if any.
    fn protect(&mut self, version: u64) {
        if let Some(p) = &mut self.protector {
            p.submit(version);
        }
    }

    /// Whether `version`'s copies on other nodes are made on this rank
    /// (`None`: no redundancy, or not known in this run). Not collective.
    pub fn is_protected(&self, version: u64) -> Option<bool> {
        let p = self.protector.as_ref().filter(|p| p.scheme().plan != crate::redundancy::Plan::None)?;
        p.outcome(version).map(|o| o.is_ok())
    }

    /// Calls that waited for the node-local tier's copies to catch up
    /// ([`CollectiveOptions::max_copy_lag`](super::CollectiveOptions)),
    /// and their seconds; the versions without their copies now.
    pub fn copy_lag(&self) -> (u64, f64, usize) {
        self.protector.as_ref().map_or((0, 0.0, 0), |p| {
            let (waits, seconds) = p.lag_waits();
            (waits, seconds, p.lag())
        })
    }

    /// What protecting `version` did on this rank, once it is over.
    pub fn protection(&self, version: u64) -> Option<std::result::Result<Protection, String>> {
        self.protector.as_ref()?.outcome(version)
    }

    /// The background step's thread, when every rank `wanted` it
    /// ([`Overlap::wanted`](super::Overlap::wanted)) and its MPI grants
    /// `MPI_THREAD_MULTIPLE`. Collective.
    fn start_worker(
        comm: &SimpleCommunicator,
        params: &StepParams,
        opts: &CollectiveOptions,
        wanted: bool,
    ) -> Result<Option<StepWorker>> {
        let able =
            wanted && !alone(comm, opts) && ::mpi::environment::threading_support() == ::mpi::Threading::Multiple;
        let mut everywhere = 0u8;
        comm.all_reduce_into(&u8::from(able), &mut everywhere, ::mpi::collective::SystemOperation::min());
        if everywhere == 0 {
            return Ok(None);
        }
        let worker = match ThreadComm::new(comm.duplicate()) {
            Some(own) => StepWorker::start(own, params.clone()),
            None => Err(Error::Internal("MPI_THREAD_MULTIPLE was granted, then not".into())),
        };
        all_agree(comm, "starting the collective step's thread", 0, worker).map(Some)
    }

    /// Whether the collective step runs on a background thread (see the
    /// module documentation): `CollectiveOptions::overlap` wanting it on
    /// every rank, several ranks, and `MPI_THREAD_MULTIPLE` granted on
    /// every rank.
    pub fn overlapped(&self) -> bool {
        self.worker.is_some()
    }

    /// Keeps a settled report for [`TieredCollective::take_settled`].
    fn keep(&mut self, report: CollectiveReport<TieredReport>) {
        if self.settled.len() >= KEPT_REPORTS {
            self.settled.remove(0);
        }
        self.settled.push(report);
    }

    /// The final reports of the versions settled since the last call, oldest
    /// first: every version's report arrives here once (also when the
    /// collective step ran in the call; the newest [`KEPT_REPORTS`] when
    /// they are not taken).
    pub fn take_settled(&mut self) -> Vec<CollectiveReport<TieredReport>> {
        std::mem::take(&mut self.settled)
    }

    /// The rank's tiered engine (its tiers, states, backend).
    pub fn engine(&self) -> &TieredEngine {
        &self.engine
    }

    /// Takes collective checkpoint `version` and returns once the protected
    /// memory may change again: every rank's diff is in its host cache,
    /// queued for its tiers. Collective: every rank calls it with the same
    /// version. On error no rank queued anything and every history is
    /// unchanged.
    pub fn checkpoint<'a>(
        &mut self,
        version: u64,
        data: impl Into<Protected<'a>>,
    ) -> Result<CollectiveReport<TieredReport>> {
        let input = data.into();
        let t0 = Instant::now();
        {
            let _span = crate::profile::Span::new("settle-before", version);
            self.settle_steps(false);
        }
        if let Some(p) = &mut self.protector {
            // Without a thread of its own, the protection runs here.
            let _span = crate::profile::Span::new("protect-queued", version);
            p.run_queued();
        }
        {
            let _span = crate::profile::Span::new("agree-baseline", version);
            self.agree_on_baseline(version)?;
        }
        // One road for every version: de-duplicated and handed to the host
        // cache as local-only's is (agreed), committed and queued at once;
        // then the collective step, if any, decides at the version's gate.
        let handed = self.hand_over_agreed(version, input)?;
        let alone = alone(&self.comm, &self.opts);
        let gate = (!alone).then(StepGate::new);
        let submitted = {
            let _span = crate::profile::Span::new("submit", version);
            let late = gate.as_ref().map(|g| Arc::clone(g) as Arc<dyn crate::tiers::LateRewrite>);
            self.engine.submit_before_step(handed, late)
        };
        // Every rank that agreed hands the version on, taken here or not,
        // so that the protection's and the step's threads meet.
        {
            let _span = crate::profile::Span::new("protect-submit", version);
            self.protect(version);
        }
        let (checkpoint, file) = match submitted {
            Ok((checkpoint, file)) => (Ok(checkpoint), Some(file)),
            Err(e) => (Err(e), None),
        };
        let Some(gate) = gate else {
            // Nothing to offer (local-only, or one rank): settled now.
            let checkpoint = checkpoint?;
            let report = self.report_of(checkpoint, t0);
            self.in_flight.push_back(InFlight { report, gate: StepGate::kept(KeptWhy::Alone) });
            return self.settled_now(t0);
        };
        let task = Task { file, gate: GateGuard(Arc::clone(&gate)), max_level: self.max_level };
        match &self.worker {
            // Beside the call: the thread decides; the next call settles.
            Some(worker) => {
                let _span = crate::profile::Span::new("step-submit", version);
                if let Err(e) = worker.submit(task) {
                    // The dropped task kept the version's regions: its flush goes on.
                    tracing::warn!("version {version}: {e}; its regions are kept");
                }
                let report = self.report_of(checkpoint?, t0);
                self.in_flight.push_back(InFlight { report: report.clone(), gate });
                Ok(report)
            }
            // In the call: the same step, on the call's communicator, then settled.
            None => {
                let _span = crate::profile::Span::new("step-in-call", version);
                let (comm, reducer) = self.reduction.parts();
                run_step(comm, &self.params, reducer, task);
                let report = self.report_of(checkpoint?, t0);
                self.in_flight.push_back(InFlight { report, gate });
                self.settled_now(t0)
            }
        }
    }

    /// The report of a version the call committed, not settled yet.
    fn report_of(&self, checkpoint: TieredReport, t0: Instant) -> CollectiveReport<TieredReport> {
        CollectiveReport {
            rank: self.comm.rank().max(0) as u32,
            ranks: self.layouts.len() as u32,
            checkpoint,
            regions_offered: 0,
            merged_entries: 0,
            regions_referenced: 0,
            bytes_referenced: 0,
            local_seconds: t0.elapsed().as_secs_f64(),
            offer_seconds: 0.0,
            reduce_seconds: 0.0,
            total_seconds: t0.elapsed().as_secs_f64(),
            settled: false,
            late: false,
        }
    }

    /// Settles what is in flight (the call's own version last) and returns
    /// the call's settled report, timed to now.
    fn settled_now(&mut self, t0: Instant) -> Result<CollectiveReport<TieredReport>> {
        self.settle_steps(true);
        let report = self.settled.last_mut().ok_or_else(|| Error::Internal("no settled report".into()))?;
        report.total_seconds = t0.elapsed().as_secs_f64();
        Ok(report.clone())
    }

    /// The call's first part: the local de-duplication and the hand-over
    /// of the file to the host cache ([`TieredEngine::hand_over`]), agreed
    /// by every rank (on a failure anywhere, every rank abandons the
    /// version).
    fn hand_over_agreed(&mut self, version: u64, input: Protected<'_>) -> Result<crate::tiers::HandedVersion> {
        let handed = {
            let _span = crate::profile::Span::new("dedup-cache", version);
            self.engine.hand_over(version, input)
        };
        let _span = crate::profile::Span::new("agree-cache", version);
        self.agree_or_abandon("the de-duplication or the copy into the host cache", version, handed)
    }

    /// Settles every version whose step runs beside the application,
    /// oldest first, waiting for each step to decide. Not collective (each
    /// rank settles its own versions; the steps' threads meet on their
    /// own); call it before [`TieredCollective::take_settled`] to have
    /// every version's report. The collective calls settle what is in
    /// flight themselves: `checkpoint`, `wait` and `finalize` wait for a
    /// late step only where [`LateStep`](super::LateStep) says so (a
    /// version that keeps its regions is as durable), a restart always.
    pub fn settle(&mut self) {
        self.settle_steps(true);
    }

    /// Settles the versions in flight, oldest first ([`TieredCollective::settle`]):
    /// a step that decided gives its regions away (its record entries
    /// move to their owners' copies); one still running is waited for if
    /// `wait` or the [`LateStep`](super::LateStep) policy says so, and
    /// otherwise keeps the version's regions (its outcome is dropped when
    /// it comes; the flush writes the file as cached).
    fn settle_steps(&mut self, wait: bool) {
        while let Some(InFlight { mut report, gate }) = self.in_flight.pop_front() {
            let version = report.checkpoint.version;
            let _span = crate::profile::Span::new("settle", version);
            let waits = wait || self.opts.late_step.waits_for(report.checkpoint.baseline);
            let mut decision = if waits && !gate.is_decided() {
                let _span = crate::profile::Span::new("settle-wait", version);
                gate.settle(true)
            } else {
                gate.settle(waits)
            };
            let (conv, dense, packed) = match &mut decision {
                Decision::Given(o) => (&o.conv[..], o.dense, o.packed.take()),
                Decision::Kept(_) => (&[][..], false, None),
            };
            let moved = {
                let _span = crate::profile::Span::new("settle-record", version);
                let given = GivenAway { conv, layouts: &self.layouts, dense, packed };
                self.engine.settle_step(version, given)
            };
            if let Err(e) = moved {
                // The record may name bytes given away: start over.
                tracing::warn!("version {version}: the record entries of its regions did not move: {e}");
                self.engine.force_baseline();
            }
            match decision {
                Decision::Given(o) => {
                    report.regions_offered = o.offered;
                    report.merged_entries = o.merged;
                    report.regions_referenced = o.conv.len();
                    report.bytes_referenced = o.conv.iter().map(|c| c.region.bytes).sum();
                    report.reduce_seconds = o.seconds;
                    if let Some(bytes) = o.file_bytes {
                        report.checkpoint.file_bytes = bytes;
                    }
                    crate::memory::drop_later(o.conv);
                }
                Decision::Kept(KeptWhy::Late) => {
                    report.late = true;
                    crate::profile::count("settle-kept-late", version, 1);
                    tracing::debug!("version {version}: its collective step was late; every region kept");
                }
                Decision::Kept(KeptWhy::Alone) => {}
                Decision::Kept(why) => {
                    tracing::warn!("version {version}: every region kept: {why}");
                }
            }
            report.settled = true;
            self.keep(report);
        }
    }

    /// The first agreement of a checkpoint: the same version everywhere,
    /// and a baseline on every rank when any rank needs one (a failed
    /// flush, a chain at its limit, a history rebuilt from another version).
    fn agree_on_baseline(&mut self, version: u64) -> Result<()> {
        let mine = [version, u64::from(self.engine.next_baseline()), self.engine.latest().map_or(u64::MAX, |v| v)];
        let mut all = vec![0u64; mine.len() * self.comm.size() as usize];
        self.comm.all_gather_into(&mine[..], &mut all[..]);
        let words: Vec<&[u64]> = all.chunks(mine.len()).collect();
        if words.iter().any(|w| w[0] != version) {
            let versions: Vec<u64> = words.iter().map(|w| w[0]).collect();
            return Err(Error::Collective(format!("ranks asked for different versions {versions:?}")));
        }
        // The same version everywhere: every rank refuses 0 here, together.
        crate::error::check_version_number(version)?;
        if words.iter().any(|w| w[1] != 0 || w[2] != mine[2]) {
            self.engine.force_baseline();
        }
        Ok(())
    }

    /// [`all_agree`], rolling this rank's pending version back when the step
    /// failed anywhere.
    fn agree_or_abandon<T>(&mut self, step: &str, version: u64, local: Result<T>) -> Result<T> {
        agree_or_abandon(&self.comm, &mut self.engine, step, version, local)
    }

    /// Blocks until `version` is durable on every tier on every rank.
    /// Collective. An error names the first tier where some rank's files
    /// are not durable, and those ranks.
    pub fn wait(&mut self, version: u64) -> Result<()> {
        // A late step is not waited for unless the policy says so: the
        // version is durable either way (kept, it stores its own copies).
        self.settle_steps(false);
        // A version no rank ever took (nor lists) is missing, not undurable.
        let mut known = 0u64;
        let mine = u64::from(self.engine.knows(version));
        self.comm.all_reduce_into(&mine, &mut known, ::mpi::collective::SystemOperation::max());
        if known == 0 {
            return Err(Error::MissingVersion {
                dir: self.engine.roots()[0].clone(),
                rank: self.engine.rank(),
                version,
            });
        }
        let mine: Vec<u64> = self.engine.own_durable(version).into_iter().map(u64::from).collect();
        let tiers = mine.len();
        let mut all = vec![0u64; tiers * self.comm.size() as usize];
        self.comm.all_gather_into(&mine[..], &mut all[..]);
        for (t, name) in self.engine.tiers().iter().enumerate() {
            let missing: Vec<usize> =
                all.chunks(tiers).enumerate().filter(|(_, w)| w[t] == 0).map(|(r, _)| r).collect();
            if !missing.is_empty() {
                // This rank's own reason where it has one (every rank has
                // it for a version the collective step abandoned).
                if let Err(e @ Error::NotDurable { .. }) = self.engine.wait(version) {
                    return Err(e);
                }
                return Err(Error::NotDurable {
                    version,
                    tier: name.clone(),
                    reason: format!("rank(s) {missing:?} could not make their files durable there"),
                });
            }
        }
        self.wait_protected(version)
    }

    /// Blocks until `version`'s copies on other nodes are made on every
    /// rank (nothing to wait for without redundancy). Collective.
    fn wait_protected(&mut self, version: u64) -> Result<()> {
        let Some(p) = &mut self.protector else { return Ok(()) };
        let scheme = p.scheme().plan.clone();
        let mine = p.wait(version);
        let failed = u64::from(matches!(mine, Some(Err(_))));
        let mut any = 0u64;
        self.comm.all_reduce_into(&failed, &mut any, ::mpi::collective::SystemOperation::max());
        if any == 0 || scheme == crate::redundancy::Plan::None {
            return Ok(());
        }
        Err(Error::NotDurable {
            version,
            tier: format!("redundancy ({})", self.opts.redundancy),
            reason: match mine {
                Some(Err(e)) => e,
                _ => "another rank's copies were not made".into(),
            },
        })
    }

    /// Whether `version` is committed on tier `tier` now: every rank's
    /// files durable there (not collective; it reads the tier's parts).
    pub fn is_durable(&self, version: u64, tier: &str) -> bool {
        self.engine.is_durable(version, tier)
    }

    /// Restores this rank's `version` into `dst` from the fastest tier where
    /// it is committed (the next tier if that copy is damaged). Not
    /// collective; a version still in flight may reference another rank's
    /// file that is not durable yet: call [`Self::settle_for_restore`] on
    /// every rank first (what a restart does).
    pub fn restore_into(&self, version: u64, dst: ProtectedMut<'_>) -> Result<()> {
        self.engine.restore_into(version, dst)
    }

    /// A restart's restore on this rank: `version` into `dst`, and the
    /// de-duplication state rebuilt from those bytes
    /// ([`TieredEngine::restart_into`]). Call [`Self::settle_for_restore`]
    /// on every rank first.
    pub fn restart_into(&mut self, version: u64, dst: ProtectedMut<'_>) -> Result<()> {
        let restored = self.engine.restart_into(version, dst);
        // Other nodes' files were fetched for this restore only.
        self.engine.set_remote_files(None);
        restored
    }

    /// Readies a restore of `version` on every rank (a restart): a version
    /// not yet committed on any tier may reference files other ranks have
    /// not made durable yet, so every rank first settles its own flushes of
    /// it and all meet; a restore after this reads only what every rank
    /// published (or fails with the reason). Collective; returns at once
    /// (after one reduction) for a committed version.
    pub fn settle_for_restore(&mut self, version: u64) {
        self.settle();
        let committed = self.engine.tiers().iter().any(|t| self.engine.is_durable(version, t));
        let mut everywhere = 0u64;
        self.comm.all_reduce_into(&u64::from(committed), &mut everywhere, ::mpi::collective::SystemOperation::min());
        if everywhere == 0 {
            let _ = self.engine.own_durable(version);
            self.comm.barrier();
        }
        // The owners' files on other nodes' node-local tiers, in memory.
        if let Some(p) = self.protector.as_ref().filter(|p| p.scheme().nodes.count() > 1) {
            match fetch_for_restore(&self.comm, p.scheme(), version) {
                Ok(files) => self.engine.set_remote_files(Some(files)),
                Err(e) => {
                    tracing::warn!("version {version}: the owners' files on other nodes were not fetched: {e}");
                    self.engine.set_remote_files(None);
                }
            }
        }
    }

    /// The reduction alone (the same result on every rank). Collective.
    pub fn reduce(&mut self, set: &[HashFreq]) -> Result<Vec<HashFreq>> {
        self.reduction.reduce(set, self.opts.threshold).map(<[HashFreq]>::to_vec)
    }

    /// Waits until every version taken is settled on every tier on every
    /// rank, and stops the flush workers. Collective; the first failure
    /// anywhere, if any.
    pub fn finalize(mut self) -> Result<()> {
        // As a checkpoint call: late steps per the policy, so that the
        // drain follows the bytes left to flush, not a queue of steps.
        self.settle_steps(false);
        let protected = self.protector.as_mut().map_or(Ok(()), Protector::wait_all);
        let settled = all_agree(&self.comm, "finalize", 0, self.engine.wait_all().and(protected));
        if settled.is_ok() {
            // Every rank's parts are on every tier: a last retention pass
            // sees every committed version.
            self.engine.retire_now();
        }
        let stopped = self.engine.finalize();
        settled.and(all_agree(&self.comm, "finalize", 0, stopped))
    }
}
