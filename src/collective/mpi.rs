//! What the collective driver ([`TieredCollective`](super::TieredCollective))
//! does over MPI (rsmpi), apart from its commit: the agreements, the
//! checks before a store opens, and the exchange of layouts.
//!
//! Every step that can fail on one rank is followed by an agreement (an
//! `MPI_Allgather` of a status word), so that all ranks fail together and
//! none waits forever in a collective.
//!
//! The reduction ([`Reducer`]): each rank's tuple set is merged up a
//! binomial tree to rank 0 with [`merge()`](super::merge::merge) (lower ranks always on the left,
//! and only rank 0 holds the final set, so the bracketing cannot make ranks
//! disagree), then broadcast: `⌈log2 P⌉` merges and messages of at most
//! `40K + 8` bytes on the critical path, plus the broadcast.

use super::CollectiveOptions;
use super::merge;
pub use super::reduce::{Reducer, Reduction, reduce_sets};
use super::regions;
use crate::backend::BackendKind;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::store::StoreOptions;
use crate::tiers::{TieredEngine, TieredReport};
use ::mpi::traits::*;

/// What one collective checkpoint did on this rank; `R` is the local
/// report ([`TieredReport`]).
#[derive(Clone, Debug, serde::Serialize)]
pub struct CollectiveReport<R = TieredReport> {
    /// The rank.
    pub rank: u32,
    /// Ranks taking part.
    pub ranks: u32,
    /// The version as written (after the collective rewrite).
    pub checkpoint: R,
    /// Regions this rank offered to the reduction.
    pub regions_offered: usize,
    /// Entries of the reduction's result.
    pub merged_entries: usize,
    /// Regions this rank now references on other ranks.
    pub regions_referenced: usize,
    /// Bytes those regions would have cost here.
    pub bytes_referenced: u64,
    /// Seconds of local de-duplication.
    pub local_seconds: f64,
    /// Of which finding the regions offered and their digests.
    pub offer_seconds: f64,
    /// Seconds of the reduction (reduce + broadcast).
    pub reduce_seconds: f64,
    /// Seconds from the call to its return (what the application waited).
    pub total_seconds: f64,
    /// Whether the collective step is over for this version. `false` for
    /// the report a checkpoint through the tiers returns when its reduction
    /// runs in the background (`CollectiveOptions::overlap`): the reduction's
    /// fields (and `regions_offered`, whose digests may still be on their
    /// way from the device) are zero and `checkpoint.file_bytes` counts the file as
    /// de-duplicated locally; the settled report follows from
    /// [`TieredCollective::take_settled`](super::TieredCollective::take_settled).
    pub settled: bool,
    /// Whether the version kept every region because its collective step,
    /// running beside the application, had not decided when the next call
    /// settled it ([`LateStep`](super::LateStep)): it stores its own copies
    /// of regions other ranks own.
    pub late: bool,
}

/// Status words exchanged by [`all_agree`].
const OK: u64 = 0;
const FAILED: u64 = 1;

/// Agrees on a step's outcome across ranks (every rank gets the first
/// failure, if any); on a failure anywhere this rank abandons its pending
/// version. Collective.
pub(crate) fn agree_or_abandon<C: Communicator, T>(
    comm: &C,
    engine: &mut TieredEngine,
    step: &str,
    version: u64,
    local: Result<T>,
) -> Result<T> {
    let agreed = all_agree(comm, step, version, local);
    if agreed.is_err() {
        // The step's error is what the caller needs; a failed rollback
        // leaves only GPU state that the next checkpoint resets anyway.
        let _ = engine.abandon();
    }
    agreed
}

/// Whether no reduction runs: local-only, or one rank (no other rank to
/// reference).
pub(crate) fn alone<C: Communicator>(comm: &C, opts: &CollectiveOptions) -> bool {
    opts.local_only || comm.size() == 1
}

/// The CPUs this rank can count on ([`crate::cpus::share`]): its affinity
/// mask, and its share of the union of its node's ranks' masks (what the
/// job may use there, whatever the node's cgroup files say to a process
/// outside the job's cgroup namespace). Collective (every rank calls it; it
/// splits the communicator); `None` where this rank's mask does not read.
pub fn cpu_share<C: Communicator>(comm: &C) -> Option<usize> {
    use crate::cpus::{self, MASK_WORDS};
    let node = comm.split_shared(0);
    let allowed = cpus::cpus_allowed();
    let mine = allowed.as_deref().map_or([0; MASK_WORDS], cpus::mask);
    let mut union = [0u64; MASK_WORDS];
    node.all_reduce_into(&mine[..], &mut union[..], ::mpi::collective::SystemOperation::bitwise_or());
    let allowed = allowed?.len();
    Some(cpus::share(allowed, cpus::count(&union).max(allowed), node.size().max(1) as usize))
}

/// What opening a collective needs on this rank, checked before anything
/// can fail differently on different ranks: its rank, its GPU (ranks of a
/// node spread over its GPUs) and its backend, or why the options are
/// refused. Collective (every rank calls it; it splits the communicator).
pub(crate) fn open_checks<C: Communicator>(
    comm: &C,
    store: &StoreOptions,
    opts: &CollectiveOptions,
) -> (u32, usize, Result<BackendKind>) {
    let rank = comm.rank().max(0) as u32;
    let local_rank = comm.split_shared(0).rank().max(0) as usize;
    let devices = crate::backend::cuda::device_count().max(1);
    let checked = if !store.method.uses_record() && !opts.local_only {
        Err(Error::InvalidOption(format!(
            "collective checkpoints need a method with a record (tree or list), not {} (or collective = false: \
             local-only)",
            store.method
        )))
    } else if !(1..=merge::MAX_THRESHOLD).contains(&opts.threshold) {
        Err(Error::InvalidOption(format!("threshold {} is outside 1..={}", opts.threshold, merge::MAX_THRESHOLD)))
    } else {
        Ok(match opts.backend {
            BackendKind::Auto if store.hash == crate::hash::HashAlgo::Sha1 => BackendKind::Cpu,
            other => other,
        })
    };
    (rank, local_rank % devices, checked)
}

/// Every rank's layout, after checking that all ranks agree on the
/// parameters a reduction and a reference depend on (chunk size, hash,
/// method, K, region size); and the largest region level offered.
/// Collective.
pub(crate) fn exchange_layouts<C: Communicator>(
    comm: &C,
    layout: Layout,
    store: &StoreOptions,
    opts: &CollectiveOptions,
) -> Result<(Vec<Layout>, u32)> {
    // The wire capacity depends on K and the regions on their size limit:
    // every rank must use the same, or the reduction would mismatch.
    let mine = [
        layout.data_len(),
        u64::from(layout.chunk_size()),
        u64::from(store.hash.code()),
        u64::from(store.method.code()),
        opts.threshold as u64,
        opts.region_bytes,
        u64::from(opts.local_only),
        opts.redundancy.code(),
        u64::from(opts.ranks_per_node),
    ];
    let mut all = vec![0u64; mine.len() * comm.size() as usize];
    comm.all_gather_into(&mine[..], &mut all[..]);
    let params: Vec<&[u64]> = all.chunks(mine.len()).collect();
    if params.iter().any(|p| p[1..] != mine[1..]) {
        return Err(Error::InvalidOption(
            "ranks disagree on the chunk size, hash, method, threshold, region size, local-only setting, redundancy \
             or ranks per node of a collective checkpoint"
                .into(),
        ));
    }
    let layouts = params.iter().map(|p| Layout::new(p[0], p[1] as u32)).collect::<Result<Vec<_>>>()?;
    let min_len = layouts.iter().map(Layout::data_len).min().unwrap_or(0);
    let region_bytes = match opts.region_bytes {
        0 => super::auto_region_bytes(min_len, layouts.len() as u32),
        b => b,
    };
    let max_level = regions::max_region_level(layout.chunk_size(), region_bytes);
    Ok((layouts, max_level))
}

/// Makes every rank see the same outcome of a step: if any rank failed,
/// every rank returns the same [`Error::OnRanks`] (the lowest failing
/// rank's error, its kind and text, naming every failed rank), so that every
/// rank reports one code. Also checks that all ranks are at the same
/// `version`. Collective; on success, one allgather.
pub fn all_agree<C: Communicator, T>(comm: &C, step: &str, version: u64, local: Result<T>) -> Result<T> {
    agree(comm, step, version, None, local)
}

/// [`all_agree`], also refusing, on every rank alike, ranks that name
/// different checkpoints (`name`): they would never commit a version.
pub fn all_agree_on_name<C: Communicator, T>(
    comm: &C,
    step: &str,
    version: u64,
    name: &str,
    local: Result<T>,
) -> Result<T> {
    agree(comm, step, version, Some(name), local)
}

fn agree<C: Communicator, T>(comm: &C, step: &str, version: u64, name: Option<&str>, local: Result<T>) -> Result<T> {
    let named = name.map_or(0, |n| xxhash_rust::xxh3::xxh3_64(n.as_bytes()));
    let mine = [if local.is_ok() { OK } else { FAILED }, version, named];
    let mut all = vec![0u64; 3 * comm.size() as usize];
    comm.all_gather_into(&mine[..], &mut all[..]);
    let failed: Vec<u32> = all.chunks(3).enumerate().filter(|(_, s)| s[0] != OK).map(|(r, _)| r as u32).collect();
    if let Some(&first) = failed.first() {
        let (kind, reason) = first_failure(comm, first, local.as_ref().err());
        if let Err(e) = &local
            && comm.rank() as u32 != first
        {
            tracing::warn!("rank {}: {step}: {e}", comm.rank());
        }
        return Err(Error::OnRanks { step: step.to_string(), ranks: failed, kind, reason });
    }
    if all.chunks(3).any(|s| s[1] != version) {
        let versions: Vec<u64> = all.chunks(3).map(|s| s[1]).collect();
        return Err(Error::Collective(format!("ranks asked for different versions {versions:?}")));
    }
    if let Some(name) = name {
        let odd: Vec<usize> = all.chunks(3).enumerate().filter(|(_, s)| s[2] != all[2]).map(|(r, _)| r).collect();
        if !odd.is_empty() {
            return Err(Error::InvalidOption(format!(
                "{step}: the ranks name different checkpoints (this rank: '{name}'; ranks {odd:?} differ from \
                 rank 0): every rank must take, restart and list the same name"
            )));
        }
    }
    local
}

/// The kind and text of rank `first`'s error, sent to every rank.
/// Collective (every rank calls it after seeing `first` fail).
fn first_failure<C: Communicator>(comm: &C, first: u32, mine: Option<&Error>) -> (crate::error::ErrorKind, String) {
    let root = comm.process_at_rank(first as i32);
    let (mut head, text) = match mine.filter(|_| comm.rank() as u32 == first) {
        Some(e) => {
            let text = e.to_string().into_bytes();
            ([e.code() as u64, text.len() as u64], text)
        }
        None => ([0u64; 2], Vec::new()),
    };
    root.broadcast_into(&mut head[..]);
    let mut bytes = if comm.rank() as u32 == first { text } else { vec![0u8; head[1] as usize] };
    if !bytes.is_empty() {
        root.broadcast_into(&mut bytes[..]);
    }
    let kind = crate::error::ErrorKind::from_code(head[0] as i32).unwrap_or(crate::error::ErrorKind::Collective);
    (kind, format!("rank {first}: {}", String::from_utf8_lossy(&bytes)))
}
