//! The collective checkpoint over MPI (rsmpi).
//!
//! Every step that can fail on one rank is followed by an agreement (an
//! `MPI_Allgather` of a status word), so that all ranks fail together and
//! none waits forever in a collective. A version becomes visible on every
//! rank at once when rank 0 writes its commit record
//! (`store::commits`), which happens only after every rank has durably
//! written its files: owners' data exists before any reference to it is
//! committed, and a crash leaves the version everywhere or nowhere.
//!
//! The reduction ([`Reducer`]): each rank's tuple set is merged up a
//! binomial tree to rank 0 with [`merge`] (lower ranks always on the left,
//! and only rank 0 holds the final set, so the bracketing cannot make ranks
//! disagree), then broadcast: `⌈log2 P⌉` merges and messages of at most
//! `40K + 8` bytes on the critical path, plus the broadcast.

use super::CollectiveOptions;
use super::merge::{self, HashFreq};
pub use super::reduce::{Reducer, Reduction, reduce_sets};
use super::regions::{self, Conversion};
use super::step::{self, LocalSide};
use crate::backend::BackendKind;
use crate::engine::{CheckpointReport, Engine, StagedCheckpoint};
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::memory::Protected;
use crate::store::StoreOptions;
use crate::store::commits::{CommitRecord, RankEntry};
use ::mpi::traits::*;
use std::path::Path;
use std::time::Instant;

/// What one collective checkpoint did on this rank; `R` is the local
/// report ([`CheckpointReport`] when written synchronously,
/// [`TieredReport`](crate::tiers::TieredReport) through the tiers).
#[derive(Clone, Debug, serde::Serialize)]
pub struct CollectiveReport<R = CheckpointReport> {
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
}

/// When the steps of one collective checkpoint started and ended on this rank.
pub(crate) struct StepClock {
    /// The call.
    pub start: Instant,
    /// Seconds finding the regions offered and their digests.
    pub offer_seconds: f64,
    /// The reduction's start (local de-duplication ends here).
    pub reduced_from: Instant,
    /// The reduction's end.
    pub reduced_at: Instant,
}

impl<R> CollectiveReport<R> {
    /// The report of a checkpoint that offered `offered` regions, merged
    /// into `merged` entries, gave `conv` away, timed by `clock` (until now).
    pub(crate) fn new(
        rank: u32,
        ranks: u32,
        checkpoint: R,
        offered: usize,
        merged: usize,
        conv: &[Conversion],
        clock: &StepClock,
    ) -> Self {
        CollectiveReport {
            rank,
            ranks,
            checkpoint,
            regions_offered: offered,
            merged_entries: merged,
            regions_referenced: conv.len(),
            bytes_referenced: conv.iter().map(|c| c.region.bytes).sum(),
            local_seconds: (clock.reduced_from - clock.start).as_secs_f64(),
            offer_seconds: clock.offer_seconds,
            reduce_seconds: (clock.reduced_at - clock.reduced_from).as_secs_f64(),
            total_seconds: clock.start.elapsed().as_secs_f64(),
            settled: true,
        }
    }
}

/// A rank's collective checkpointing over a communicator.
///
/// ```no_run
/// # fn main() -> dckpt::Result<()> {
/// use mpi::traits::*;
/// let universe = mpi::initialize().expect("MPI");
/// let world = universe.world();
/// let data = vec![0u8; 1 << 20];
/// let mut ckpt = dckpt::collective::Collective::open(
///     &world, "ckpt".as_ref(), data.len() as u64, &Default::default(), &Default::default())?;
/// let report = ckpt.checkpoint(1, &data)?;
/// println!("rank {} stored {} bytes", report.rank, report.checkpoint.file_bytes);
/// # Ok(()) }
/// ```
pub struct Collective<'c, C: Communicator> {
    comm: &'c C,
    engine: Engine,
    opts: CollectiveOptions,
    layouts: Vec<Layout>,
    max_level: u32,
    /// The reduction on its own communicator, its buffers reused by every checkpoint.
    reduction: Reduction,
}

/// Status words exchanged by [`agree`].
const OK: u64 = 0;
const FAILED: u64 = 1;

impl<'c, C: Communicator> Collective<'c, C> {
    /// Opens (or creates) this rank's store under `root` (the shared
    /// directory all ranks write to) for a buffer of `data_len` bytes.
    /// Collective: every rank calls it; ranks must agree on the chunk size,
    /// hash and method, and the method must keep a record (tree or list).
    pub fn open(
        comm: &'c C,
        root: &Path,
        data_len: u64,
        store: &StoreOptions,
        opts: &CollectiveOptions,
    ) -> Result<Self> {
        let (rank, device, backend) = open_checks(comm, store, opts);
        let opened = backend.and_then(|b| Engine::open_on_device(root, rank, data_len, store, b, device));
        let engine = all_agree(comm, "open", 0, opened)?;
        let (layouts, max_level) = exchange_layouts(comm, engine.store().layout()?, store, opts)?;
        Ok(Collective { comm, engine, opts: opts.clone(), layouts, max_level, reduction: Reduction::new(comm) })
    }

    /// The rank's engine (its store, options, backend).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Takes collective checkpoint `version` of the protected memory (host
    /// bytes, or a [`DeviceRegion`](crate::memory::DeviceRegion) on the CUDA
    /// backend). Collective: every rank calls it with the same version. The
    /// version is committed on every rank at once (rank 0's commit record)
    /// or on none; on error nothing is visible anywhere.
    pub fn checkpoint<'a>(&mut self, version: u64, data: impl Into<Protected<'a>>) -> Result<CollectiveReport> {
        let input = data.into();
        let t0 = Instant::now();
        let me = self.engine.store().manifest().rank;
        let (offer, merged, reduced_from, reduced_at) = offer_and_reduce(
            self.comm,
            &mut self.engine,
            &mut self.reduction,
            version,
            input,
            self.max_level,
            &self.opts,
        )?;
        let (offer_seconds, offered, merged_entries) = (offer.regions_seconds, offer.regions.len(), merged.len());
        let host = input.host_bytes();
        let settled = {
            let _span = crate::profile::Span::new("settle", version);
            step::settle(&mut self.engine, offer, merged, &self.layouts, host)
        };
        let (staged, conv) = {
            let _span = crate::profile::Span::new("commit-record", version);
            self.commit_record(version, settled)?
        };
        // Committed everywhere: this rank's manifest only caches the record.
        let (checkpoint, unlisted) = {
            let _span = crate::profile::Span::new("adopt", version);
            self.engine.adopt(staged)?
        };
        if let Some(e) = unlisted {
            tracing::warn!(
                "rank {me}: version {version} is committed, but its manifest entry was not written ({e}); the next open lists it"
            );
        }
        let clock = StepClock { start: t0, offer_seconds, reduced_from, reduced_at };
        Ok(CollectiveReport::new(me, self.layouts.len() as u32, checkpoint, offered, merged_entries, &conv, &clock))
    }

    /// The commit: every rank reports its written file (an `MPI_Allgather`
    /// of its status, length and trailer); if all succeeded, rank 0 writes
    /// the version's commit record, the one durable act that makes it
    /// visible on every rank, and every rank learns the outcome. On any
    /// failure every rank abandons the version and nothing is visible.
    fn commit_record(
        &mut self,
        version: u64,
        settled: Result<(StagedCheckpoint, Vec<Conversion>)>,
    ) -> Result<(StagedCheckpoint, Vec<Conversion>)> {
        const WORDS: usize = 8;
        let mut mine = [FAILED, version, 0, 0, 0, 0, 0, 0];
        if let Ok((staged, _)) = &settled {
            let e = staged.entry();
            let trailer: Vec<u8> = (0..e.trailer.len() / 2)
                .filter_map(|i| u8::from_str_radix(e.trailer.get(2 * i..2 * i + 2)?, 16).ok())
                .collect();
            if trailer.len() == 32 {
                mine[0] = OK;
                mine[2] = u64::from(e.baseline);
                mine[3] = e.file_len;
                for (w, c) in mine[4..].iter_mut().zip(trailer.chunks_exact(8)) {
                    *w = u64::from_le_bytes(c.try_into().unwrap_or_default());
                }
            }
        }
        let mut all = vec![0u64; WORDS * self.comm.size() as usize];
        self.comm.all_gather_into(&mine[..], &mut all[..]);
        let failed: Vec<usize> = all.chunks(WORDS).enumerate().filter(|(_, w)| w[0] != OK).map(|(r, _)| r).collect();
        let local = settled.and_then(|v| {
            if !failed.is_empty() {
                return Err(Error::Collective(format!(
                    "writing failed on rank(s) {failed:?}; version {version} was not committed"
                )));
            }
            if all.chunks(WORDS).any(|w| w[1] != version) {
                let versions: Vec<u64> = all.chunks(WORDS).map(|w| w[1]).collect();
                return Err(Error::Collective(format!("ranks asked for different versions {versions:?}")));
            }
            Ok(v)
        });
        let written = match (&local, self.comm.rank()) {
            (Ok(_), 0) => {
                let entries = all
                    .chunks(WORDS)
                    .enumerate()
                    .map(|(r, w)| RankEntry {
                        rank: r as u32,
                        baseline: w[2] != 0,
                        file_len: w[3],
                        trailer: crate::store::hex(&w[4..].iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()),
                    })
                    .collect();
                let record = CommitRecord { version, ranks: self.comm.size() as u32, entries };
                record.write_to(self.engine.store().storage().as_ref())
            }
            _ => Ok(()),
        };
        let outcome = match local {
            Ok(v) => all_agree(self.comm, "the commit record", version, written.map(|()| v)),
            Err(e) => {
                // Keep the collective sequence identical on every rank.
                let _ =
                    all_agree(self.comm, "the commit record", version, Err::<(), _>(Error::Collective(String::new())));
                Err(e)
            }
        };
        if outcome.is_err() {
            let _ = self.engine.abandon();
            // Whatever happened to the record, no later version may build on
            // this one's state: the next version is a baseline on every rank.
            self.engine.force_baseline();
        }
        outcome
    }

    /// The reduction alone: every rank's set in, the merged set out (the
    /// same on every rank). Collective.
    pub fn reduce(&mut self, set: &[HashFreq]) -> Result<Vec<HashFreq>> {
        self.reduction.reduce(set, self.opts.threshold).map(<[HashFreq]>::to_vec)
    }
}

/// Agrees on a step's outcome across ranks (every rank gets the first
/// failure, if any); on a failure anywhere this rank abandons its pending
/// version. Collective.
pub(crate) fn agree_or_abandon<C: Communicator, E: LocalSide + ?Sized, T>(
    comm: &C,
    engine: &mut E,
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

/// The first steps of a collective checkpoint, the same over either local
/// engine: this rank's de-duplication and offer (no regions when
/// [`alone`]: every region stays this rank's), agreed by every rank, then
/// the reduction. On any failure every rank abandons the version. The
/// offer, the merged set (the same on every rank) and when the reduction
/// started and ended. Collective.
pub(crate) fn offer_and_reduce<'a, 'r, C: Communicator, E: LocalSide + ?Sized>(
    comm: &C,
    engine: &mut E,
    reduction: &'r mut Reduction,
    version: u64,
    input: Protected<'a>,
    max_level: u32,
    opts: &CollectiveOptions,
) -> Result<(step::Offer<'a>, &'r [HashFreq], Instant, Instant)> {
    let offer = match alone(comm, opts) {
        true => engine.deduplicate_local(version, input).map(|local| step::offer_of(local, Vec::new(), 1)),
        false => step::offer(engine, version, input, max_level, opts.threshold)
            .map(|o| o.without_regions_below(opts.min_region_bytes, opts.threshold)),
    };
    let offer = {
        let _span = crate::profile::Span::new("agree-dedup", version);
        agree_or_abandon(comm, engine, "de-duplication", version, offer)?
    };
    let reduced_from = Instant::now();
    if alone(comm, opts) {
        return Ok((offer, &[], reduced_from, reduced_from));
    }
    crate::profile::count("offered-entries", version, offer.set.len() as u64);
    let merged = {
        let _span = crate::profile::Span::new("reduce", version);
        reduction.reduce(&offer.set, opts.threshold)
    };
    let merged = match merged {
        Ok(m) => m,
        Err(e) => {
            let _ = engine.abandon();
            return Err(e);
        }
    };
    Ok((offer, merged, reduced_from, Instant::now()))
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
    ];
    let mut all = vec![0u64; mine.len() * comm.size() as usize];
    comm.all_gather_into(&mine[..], &mut all[..]);
    let params: Vec<&[u64]> = all.chunks(mine.len()).collect();
    if params.iter().any(|p| p[1..] != mine[1..]) {
        return Err(Error::InvalidOption(
            "ranks disagree on the chunk size, hash, method, threshold, region size or local-only setting of a \
             collective checkpoint"
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
/// every rank returns an error (its own, or one naming the failed ranks).
/// Also checks that all ranks are at the same `version`. Collective.
pub fn all_agree<C: Communicator, T>(comm: &C, step: &str, version: u64, local: Result<T>) -> Result<T> {
    let mine = [if local.is_ok() { OK } else { FAILED }, version];
    let mut all = vec![0u64; 2 * comm.size() as usize];
    comm.all_gather_into(&mine[..], &mut all[..]);
    let failed: Vec<usize> = all.chunks(2).enumerate().filter(|(_, s)| s[0] != OK).map(|(r, _)| r).collect();
    let value = local?;
    if !failed.is_empty() {
        return Err(Error::Collective(format!("{step} failed on rank(s) {failed:?}; nothing was published")));
    }
    if all.chunks(2).any(|s| s[1] != version) {
        let versions: Vec<u64> = all.chunks(2).map(|s| s[1]).collect();
        return Err(Error::Collective(format!("ranks asked for different versions {versions:?}")));
    }
    Ok(value)
}
