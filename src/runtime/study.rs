//! What a run's checkpoints cost, for the scaling studies
//! (`scripts/scaling-study.sh`): each rank's [`RunStats`] (kept by the
//! runtime's checkpoint calls), and one CSV line per job
//! ([`append_study_line`]) with the slowest rank's seconds and the bytes of
//! all ranks.

use crate::config::Config;
use crate::error::{Error, Result};
use ::mpi::collective::SystemOperation;
use ::mpi::traits::*;
use std::io::Write;
use std::path::Path;

/// One rank's checkpoints so far (every name).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RunStats {
    /// Checkpoint calls that returned a version.
    pub checkpoints: u64,
    /// Seconds the application spent in those calls.
    pub checkpoint_seconds: f64,
    /// Bytes of the files they stored (this rank's diffs).
    pub stored_bytes: u64,
    /// Bytes of the regions they protected (what Full would store).
    pub protected_bytes: u64,
    /// Bytes this rank referenced in other ranks' files instead of storing.
    pub referenced_bytes: u64,
    /// The first checkpoint call of each name in this process (opening its
    /// stores unless `latest` did; the first use of the caches' page-locked
    /// memory and the GPU's buffers) …
    pub opening_calls: u64,
    /// … and their seconds (within `checkpoint_seconds`).
    pub opening_seconds: f64,
    /// Seconds of local de-duplication (within `checkpoint_seconds`).
    pub dedup_seconds: f64,
    /// Seconds of the collective reduction (within `checkpoint_seconds`).
    pub reduce_seconds: f64,
    /// Calls that returned with their diff held in the GPU cache tier (the
    /// host cache was full).
    pub held_on_gpu: u64,
    /// Calls that returned while their collective step went on on the
    /// background thread (`overlap`; their versions settled later).
    pub overlapped_calls: u64,
    /// Calls that waited for the node-local tier's copies on other nodes
    /// to catch up (`max_copy_lag`) …
    pub copy_waits: u64,
    /// … and their seconds (within `checkpoint_seconds`).
    pub copy_wait_seconds: f64,
    /// The most versions the copies lagged behind a call, seen after it.
    pub max_copy_lag_seen: u64,
}

/// A run's shape and the seconds the runtime does not see.
#[derive(Clone, Debug)]
pub struct StudyRun<'a> {
    /// The example (`heat`, `labels`, …).
    pub example: &'a str,
    /// Steps the run took (a restarted run counts all of them).
    pub steps: u64,
    /// Steps between two checkpoints.
    pub every: u64,
    /// This rank's seconds computing (communication included).
    pub compute_seconds: f64,
    /// This rank's seconds in `finalize` (the tiers draining).
    pub drain_seconds: f64,
}

/// The header of the CSV [`append_study_line`] writes.
pub const STUDY_HEADER: &str = "example,ranks,state_bytes_per_rank,steps,every,mode,chunk_size,checkpoints,\
compute_s,checkpoint_s,first_call_s,steady_call_ms,dedup_s,reduce_s,drain_s,stored_bytes,protected_bytes,referenced_bytes,\
overhead_per_step_ms,ratio_to_full,overlapped";

/// `collective`, `local` or `full`: what the configuration compares.
pub fn mode_of(config: &Config) -> &'static str {
    match (config.collective, config.method.uses_record()) {
        (true, _) => "collective",
        (false, true) => "local",
        (false, false) => "full",
    }
}

/// Appends one line to `file` (with the header if the file is new): the
/// slowest rank's seconds (computing; in checkpoint calls, of which the
/// opening calls, de-duplication and the reduction; draining at the end),
/// the mean call after the opening ones, the bytes of all ranks, and
/// whether calls returned while their collective step went on on its
/// background thread (1) or not (0: in the calls, or mode `sync`).
/// Collective; rank 0 writes.
pub fn append_study_line<C: Communicator>(
    comm: &C,
    file: &Path,
    run: &StudyRun<'_>,
    stats: &RunStats,
    config: &Config,
) -> Result<()> {
    let steady_calls = stats.checkpoints.saturating_sub(stats.opening_calls).max(1) as f64;
    let seconds = [
        run.compute_seconds,
        stats.checkpoint_seconds,
        stats.opening_seconds,
        (stats.checkpoint_seconds - stats.opening_seconds) / steady_calls,
        stats.dedup_seconds,
        stats.reduce_seconds,
        run.drain_seconds,
    ];
    let mut slowest = [0f64; 7];
    comm.all_reduce_into(&seconds[..], &mut slowest[..], SystemOperation::max());
    let bytes =
        [stats.stored_bytes, stats.protected_bytes, stats.referenced_bytes, stats.checkpoints, stats.overlapped_calls];
    let mut sums = [0u64; 5];
    comm.all_reduce_into(&bytes[..], &mut sums[..], SystemOperation::sum());
    if comm.rank() != 0 {
        return Ok(());
    }
    let ranks = comm.size().max(1) as u64;
    let [stored, protected, referenced, checkpoints, overlapped] = sums;
    let per_rank_state = protected / checkpoints.max(1);
    let mut line = String::new();
    if !file.exists() {
        line.push_str(STUDY_HEADER);
        line.push('\n');
    }
    line.push_str(&format!(
        "{},{ranks},{per_rank_state},{},{},{},{},{},{:.4},{:.4},{:.4},{:.3},{:.4},{:.4},{:.4},{stored},{protected},\
         {referenced},{:.3},{:.2},{}\n",
        run.example,
        run.steps,
        run.every,
        mode_of(config),
        config.chunk_size,
        checkpoints / ranks,
        slowest[0],
        slowest[1],
        slowest[2],
        slowest[3] * 1e3,
        slowest[4],
        slowest[5],
        slowest[6],
        slowest[1] * 1e3 / run.steps.max(1) as f64,
        protected as f64 / stored.max(1) as f64,
        u8::from(overlapped > 0)
    ));
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(file).map_err(|e| Error::io(file, e))?;
    f.write_all(line.as_bytes()).map_err(|e| Error::io(file, e))
}
