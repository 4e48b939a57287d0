//! The collective step off the application's path: a thread with its own
//! communicator runs each version's reduction and give-away while the
//! application computes. The call that checkpoints hands it the version
//! (already cached) and its regions; the thread builds the tuple set, so
//! its sort never delays the application. The next collective call
//! collects the outcome and commits or abandons it. Tasks run one at a time,
//! in the order every rank submits them, so the threads of all ranks meet
//! in the same reductions.

use super::reduce::{Reducer, ThreadComm};
use super::regions::{Conversion, conversions};
use super::step::tuple_set;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::tiers::{CachedVersion, HandedVersion};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::Instant;

/// A version handed to the background step: cached, not yet committed,
/// with nothing found in the call but the file (the thread decodes a
/// device-made diff from the cached file and hashes its FIRST regions).
pub(crate) struct Task {
    /// The version, cached and not yet committed.
    pub handed: HandedVersion,
    /// The largest region's level (nodes of at most `2^max_level` chunks).
    pub max_level: u32,
}

/// What every task of one handle shares: this rank, the ranks' layouts and
/// the reduction's options.
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

/// What the background step made of a [`Task`].
pub(crate) struct Settled {
    /// The version, its regions given away (not yet committed).
    pub cached: CachedVersion,
    /// Regions offered to the reduction.
    pub offered: usize,
    /// Entries of the reduction's result.
    pub merged: usize,
    /// The regions given away.
    pub conv: Vec<Conversion>,
    /// Seconds of the reduction and the give-away.
    pub seconds: f64,
}

/// The background thread of one [`super::TieredCollective`].
pub(crate) struct StepWorker {
    tasks: Option<Sender<Task>>,
    done: Receiver<Result<Settled>>,
    thread: Option<JoinHandle<()>>,
}

impl StepWorker {
    /// Starts the thread over its own communicator.
    pub(crate) fn start(comm: ThreadComm, params: StepParams) -> Result<Self> {
        let (tasks, todo) = channel::<Task>();
        let (report, done) = channel();
        let thread = std::thread::Builder::new()
            .name(format!("dckpt-collective-{}", params.me))
            .spawn(move || {
                let mut reducer = Reducer::default();
                for task in todo {
                    let outcome = run(comm.comm(), &params, &mut reducer, task);
                    if report.send(outcome).is_err() {
                        break;
                    }
                }
                // `comm` is freed here, on the thread that used it.
            })
            .map_err(|e| Error::no_thread("the collective step's thread", e))?;
        Ok(StepWorker { tasks: Some(tasks), done, thread: Some(thread) })
    }

    /// Hands `task` to the thread.
    pub(crate) fn submit(&self, task: Task) -> Result<()> {
        self.tasks
            .as_ref()
            .and_then(|t| t.send(task).ok())
            .ok_or_else(|| Error::Internal("the collective step's thread has stopped".into()))
    }

    /// Waits for the outcome of the oldest task not collected yet.
    pub(crate) fn collect(&self) -> Result<Settled> {
        self.done.recv().map_err(|_| Error::Internal("the collective step's thread has stopped".into()))?
    }
}

impl Drop for StepWorker {
    fn drop(&mut self) {
        // The thread finishes the task it has (every rank submitted it, so
        // its reduction completes) and frees its communicator.
        drop(self.tasks.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One task: the tuple set, the reduction over `comm`, then the give-away
/// of the regions other ranks own.
fn run(
    comm: &::mpi::topology::SimpleCommunicator,
    params: &StepParams,
    reducer: &mut Reducer,
    task: Task,
) -> Result<Settled> {
    let t = Instant::now();
    let StepParams { me, ref layouts, threshold, min_region_bytes } = *params;
    let Task { handed, max_level } = task;
    let version = handed.version();
    let (mut cached, mut regions) = {
        let _span = crate::profile::Span::new("step-describe", version);
        handed.describe(max_level)?
    };
    let set = tuple_set(me, &mut regions, min_region_bytes, threshold);
    crate::profile::count("offered-entries", version, set.len() as u64);
    let merged = {
        let _span = crate::profile::Span::new("reduce", version);
        reducer.reduce(comm, &set, threshold)?
    };
    crate::failpoint::hit("collective.reduced");
    if crate::failpoint::failed("collective.reduced") {
        return Err(Error::Internal("an injected failure of the collective step (test)".into()));
    }
    let conv = conversions(me, &regions, merged, layouts);
    {
        let _span = crate::profile::Span::new("step-give-away", version);
        cached.give_away(&conv, layouts)?;
    }
    Ok(Settled { cached, offered: regions.len(), merged: merged.len(), conv, seconds: t.elapsed().as_secs_f64() })
}
