//! The collective step beside the application: a thread with its own
//! communicator runs each version's description, reduction and give-away
//! while the application computes. The call commits the version and queues
//! it before the step runs; the step's outcome goes through the version's
//! [`StepGate`]:
//!
//! - the flush of the version waits at the gate, then writes the file as
//!   the step rewrote it (regions given away) or as it was cached;
//! - the next collective call settles the gate before it de-duplicates: the
//!   record entries of the regions given away move to their owners' copies
//!   ([`crate::tiers::TieredEngine::settle_step`]). A step still running
//!   then is **late**: the call keeps the version's regions
//!   ([`super::LateStep`] says when it waits instead), and the step's
//!   outcome is dropped when it comes.
//!
//! Giving regions away or keeping them is each rank's own choice: an owner
//! never gives its own regions away, so a rank that keeps its copies breaks
//! no other rank's reference, and no agreement is needed. Tasks run one at
//! a time, in the order every rank submits them, so the threads of all
//! ranks meet in the same reductions (a rank with nothing to offer, or
//! whose version is kept already, offers an empty set).

use super::reduce::{Reducer, ThreadComm};
use super::regions::{Conversion, conversions};
use super::step::tuple_set;
use crate::backend::Described;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::regions::Rewrite;
use crate::tiers::{LateRewrite, StepFile};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// Why a version kept every region (its file written as cached).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KeptWhy {
    /// Its step had not decided by the next call (or had not started when
    /// the call kept them).
    Late,
    /// No step: nothing to offer (local-only, or one rank).
    Alone,
    /// The step failed on this rank, or never ran: why.
    Failed(String),
}

impl std::fmt::Display for KeptWhy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeptWhy::Late => f.write_str("the step was late"),
            KeptWhy::Alone => f.write_str("no other rank"),
            KeptWhy::Failed(why) => f.write_str(why),
        }
    }
}

/// A version handed to the background step: committed and queued, its
/// flush waiting at `gate`.
pub(crate) struct Task {
    /// The version as the step reads it (`None`: this rank could not commit
    /// it, and takes part in the reduction with nothing).
    pub file: Option<StepFile>,
    /// Where the outcome goes; kept (the file as cached) if the task is
    /// dropped before it ran.
    pub gate: GateGuard,
    /// The largest region's level (nodes of at most `2^max_level` chunks).
    pub max_level: u32,
}

/// What every task of one handle shares: this rank, the ranks' layouts and
/// the reduction's options.
#[derive(Clone)]
pub(crate) struct StepParams {
    /// This rank.
    pub me: u32,
    /// `layouts[r]` is rank r's layout.
    pub layouts: Arc<Vec<Layout>>,
    /// The reduction's K.
    pub threshold: usize,
    /// Regions smaller than this stay the rank's, outside the reduction.
    pub min_region_bytes: u64,
}

/// What a version's step gave away.
#[derive(Debug)]
pub(crate) struct StepOutcome {
    /// The regions given away (each a reference to its owner's copy).
    pub conv: Vec<Conversion>,
    /// Whether the version's diff was dense (it added no record entries).
    pub dense: bool,
    /// The record moves packed in the backend's form, where it wants them.
    pub packed: Option<crate::backend::cuda::PackedRuns>,
    /// Regions offered to the reduction.
    pub offered: usize,
    /// Entries of the reduction's result.
    pub merged: usize,
    /// The file's length once rewritten (`None`: as cached).
    pub file_bytes: Option<u64>,
    /// Seconds of the step (description, reduction, give-away).
    pub seconds: f64,
}

/// How a version's step ended, as its settle sees it.
#[derive(Debug)]
pub(crate) enum Decision {
    /// The file gives the regions of the outcome away.
    Given(StepOutcome),
    /// The file keeps every region: the step was late, failed here, or
    /// never ran (why).
    Kept(KeptWhy),
}

enum GateState {
    /// The step has not decided.
    Open,
    /// Regions given away: the flush's rewrite and the settle's outcome,
    /// each taken once.
    Given { rewrite: Option<Box<Rewrite>>, outcome: Option<StepOutcome> },
    /// Every region kept, and why.
    Kept(KeptWhy),
}

/// Where a version's step outcome meets its flush and its settle: decided
/// once, by the step ([`StepGate::give`]) or by whoever keeps the regions
/// first ([`StepGate::keep`]).
pub(crate) struct StepGate {
    state: Mutex<GateState>,
    decided: Condvar,
}

impl StepGate {
    /// An open gate.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(StepGate { state: Mutex::new(GateState::Open), decided: Condvar::new() })
    }

    /// A gate whose regions are kept already, and why.
    pub(crate) fn kept(why: KeptWhy) -> Arc<Self> {
        Arc::new(StepGate { state: Mutex::new(GateState::Kept(why)), decided: Condvar::new() })
    }

    /// The step gives regions away, unless the regions were kept already
    /// (false then: the outcome is dropped).
    fn give(&self, rewrite: Option<Rewrite>, outcome: StepOutcome) -> bool {
        let mut state = crate::sync::lock(&self.state);
        if !matches!(*state, GateState::Open) {
            return false;
        }
        *state = GateState::Given { rewrite: rewrite.map(Box::new), outcome: Some(outcome) };
        self.decided.notify_all();
        true
    }

    /// Keeps every region, unless the step decided already.
    pub(crate) fn keep(&self, why: KeptWhy) {
        let mut state = crate::sync::lock(&self.state);
        if matches!(*state, GateState::Open) {
            *state = GateState::Kept(why);
            self.decided.notify_all();
        }
    }

    /// Whether the regions are kept already (the step need not look).
    fn is_kept(&self) -> bool {
        matches!(*crate::sync::lock(&self.state), GateState::Kept(_))
    }

    /// The settle's side: the decision, waiting for the step if `wait`,
    /// else keeping the regions of a step still running (late).
    pub(crate) fn settle(&self, wait: bool) -> Decision {
        let mut state = crate::sync::lock(&self.state);
        if matches!(*state, GateState::Open) && !wait {
            *state = GateState::Kept(KeptWhy::Late);
            self.decided.notify_all();
        }
        while matches!(*state, GateState::Open) {
            state = self.decided.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        match &mut *state {
            GateState::Given { outcome, .. } => match outcome.take() {
                Some(o) => Decision::Given(o),
                None => Decision::Kept(KeptWhy::Failed("settled twice".into())),
            },
            GateState::Kept(why) => Decision::Kept(why.clone()),
            GateState::Open => Decision::Kept(KeptWhy::Failed("undecided".into())),
        }
    }

    /// Whether the step has decided (or the regions were kept).
    pub(crate) fn is_decided(&self) -> bool {
        !matches!(*crate::sync::lock(&self.state), GateState::Open)
    }
}

impl LateRewrite for StepGate {
    fn wait(&self) -> Option<Rewrite> {
        let mut state = crate::sync::lock(&self.state);
        while matches!(*state, GateState::Open) {
            state = self.decided.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        match &mut *state {
            GateState::Given { rewrite, .. } => rewrite.take().map(|r| *r),
            _ => None,
        }
    }
}

/// A task's hold on its gate: a task dropped before it decided (its thread
/// stopped) keeps the regions, so that no flush waits forever.
pub(crate) struct GateGuard(pub Arc<StepGate>);

impl Drop for GateGuard {
    fn drop(&mut self) {
        self.0.keep(KeptWhy::Failed("the collective step's thread stopped before it ran".into()));
    }
}

/// The background thread of one [`super::TieredCollective`].
pub(crate) struct StepWorker {
    tasks: Option<Sender<Task>>,
    thread: Option<JoinHandle<()>>,
}

impl StepWorker {
    /// Starts the thread over its own communicator.
    pub(crate) fn start(comm: ThreadComm, params: StepParams) -> Result<Self> {
        let (tasks, todo) = channel::<Task>();
        let thread = std::thread::Builder::new()
            .name(format!("dckpt-collective-{}", params.me))
            .spawn(move || {
                let mut reducer = Reducer::default();
                for task in todo {
                    run_step(comm.comm(), &params, &mut reducer, task);
                }
                // `comm` is freed here, on the thread that used it.
            })
            .map_err(|e| Error::no_thread("the collective step's thread", e))?;
        Ok(StepWorker { tasks: Some(tasks), thread: Some(thread) })
    }

    /// Hands `task` to the thread (on error its gate keeps the regions).
    pub(crate) fn submit(&self, task: Task) -> Result<()> {
        self.tasks
            .as_ref()
            .and_then(|t| t.send(task).ok())
            .ok_or_else(|| Error::Internal("the collective step's thread has stopped".into()))
    }
}

impl Drop for StepWorker {
    fn drop(&mut self) {
        // The thread finishes the tasks it has (every rank submitted them,
        // so their reductions complete) and frees its communicator.
        drop(self.tasks.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One version's collective step, on the step's thread or in the call
/// (the same step either way): the regions (unless the version is kept
/// already), the tuple set, the reduction over `comm` (always: every
/// rank's step meets there), then the give-away of the regions other ranks
/// own, offered at the gate.
pub(crate) fn run_step(
    comm: &::mpi::topology::SimpleCommunicator,
    params: &StepParams,
    reducer: &mut Reducer,
    task: Task,
) {
    let t = Instant::now();
    let StepParams { me, ref layouts, threshold, min_region_bytes } = *params;
    let Task { file, gate, max_level } = task;
    let version = file.as_ref().map(StepFile::version).unwrap_or(0);
    let described = match file {
        Some(_) if gate.0.is_kept() => Err(KeptWhy::Late),
        Some(file) => {
            let _span = crate::profile::Span::new("step-describe", version);
            file.describe(max_level).map_err(|e| KeptWhy::Failed(e.to_string()))
        }
        None => Err(KeptWhy::Failed("this rank did not take the version".into())),
    };
    let (mut described, mut regions) = match described {
        Ok((described, regions)) => (Some(described), regions),
        Err(why) => {
            gate.0.keep(why);
            (None, Vec::new())
        }
    };
    let set = tuple_set(me, &mut regions, min_region_bytes, threshold);
    crate::profile::count("offered-entries", version, set.len() as u64);
    let merged = {
        let _span = crate::profile::Span::new("reduce", version);
        reducer.reduce(comm, &set, threshold)
    };
    crate::failpoint::hit("collective.reduced");
    let merged = match merged {
        Ok(_) if crate::failpoint::failed("collective.reduced") => {
            return gate.0.keep(KeptWhy::Failed("an injected failure of the collective step (test)".into()));
        }
        Ok(m) => m,
        Err(e) => return gate.0.keep(KeptWhy::Failed(format!("the reduction failed: {e}"))),
    };
    let Some(Described { mut diff, data_start, unfolded, pack_moves }) = described.take() else { return };
    let conv = conversions(me, &regions, merged, layouts);
    // Before the give-away, which makes a dense diff with references no
    // longer dense: whether the version added record entries.
    let dense = diff.dense;
    let rewrite = {
        let _span = crate::profile::Span::new("step-give-away", version);
        match crate::regions::apply(&mut diff, &conv) {
            Some(before) => Some(Rewrite::new(before, diff.clone(), data_start)),
            // Nothing given away: a device's file still brought to the
            // encoder's form (the flush would fold it otherwise; here the
            // report learns the length).
            None => unfolded.then(|| Rewrite::new(diff.clone(), diff.clone(), data_start)),
        }
    };
    let file_bytes = rewrite.as_ref().map(Rewrite::file_len);
    // The record moves in the backend's form, here rather than in the next call.
    let packed = match pack_moves.filter(|_| !conv.is_empty() && !dense) {
        Some(pack) => match pack(version, me, &diff.layout, &conv, layouts) {
            Ok(runs) => Some(runs),
            Err(e) => return gate.0.keep(KeptWhy::Failed(format!("packing the record moves failed: {e}"))),
        },
        None => None,
    };
    let outcome = StepOutcome {
        conv,
        dense,
        packed,
        offered: regions.len(),
        merged: merged.len(),
        file_bytes,
        seconds: t.elapsed().as_secs_f64(),
    };
    if !gate.0.give(rewrite, outcome) {
        crate::profile::count("step-late", version, 1);
    }
    crate::memory::drop_later(diff);
}
