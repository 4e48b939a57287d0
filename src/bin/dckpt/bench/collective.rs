//! Measurements of the collective step (feature `mpi`), run under `mpirun`
//! by `dckpt bench-collective` and `scripts/bench-collective.sh`:
//!
//! - [`reduce_timing`]: the reduction alone over synthetic tuple sets of K
//!   entries per rank, worst case (every digest unique) and best case (every
//!   digest on every rank), as in Figures 2 and 3 of the paper;
//! - [`mixed_workload`]: whole checkpoints of buffers whose first part is
//!   replicated on every rank, collective vs local-only vs Full.

use crate::bench::generate::{Shape, Workload};
use ::mpi::collective::SystemOperation;
use ::mpi::traits::*;
use dckpt::collective::Reduction;
use dckpt::collective::merge::{HashFreq, local_set};
use dckpt::collective::mpi::{CollectiveReport, all_agree};
use dckpt::collective::{Collective, CollectiveOptions, TieredCollective};
use dckpt::engine::Engine;
use dckpt::error::{Error, Result};
use dckpt::hash::Digest;
use dckpt::layout::NodeId;
use dckpt::memory::Protected;
use dckpt::method::Method;
use dckpt::store::StoreOptions;
use dckpt::tiers::{TierOptions, TieredEngine};
use serde::Serialize;
use std::path::Path;
use std::str::FromStr;
use std::time::Instant;

/// Which digests the ranks hold in [`reduce_timing`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SetCase {
    /// Every digest on one rank only: the worst case (sets stay full, nothing merges).
    Unique,
    /// The same K digests on every rank: the best case.
    Shared,
}

impl FromStr for SetCase {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "unique" => Ok(SetCase::Unique),
            "shared" => Ok(SetCase::Shared),
            _ => Err(Error::InvalidOption(format!("unknown case '{s}' (expected unique or shared)"))),
        }
    }
}

/// Timing of the reduction (seconds are the slowest rank's, per repetition).
#[derive(Clone, Debug, Serialize)]
pub struct ReduceTiming {
    /// Ranks.
    pub ranks: u32,
    /// K, entries per rank.
    pub threshold: usize,
    /// Which digests were held.
    pub case: SetCase,
    /// Repetitions timed (after one warm-up).
    pub repeat: usize,
    /// Fastest repetition.
    pub min_seconds: f64,
    /// Median repetition.
    pub median_seconds: f64,
    /// Entries of the result.
    pub merged_entries: usize,
    /// Bytes of a full wire set (the most one message of the tree carries).
    pub wire_bytes: usize,
}

fn synthetic_digest(x: u64) -> Digest {
    let mut d = Digest(u128::from(x).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834));
    d.0 ^= d.0 >> 61;
    d
}

/// Times the reduction of K-entry sets (collective; every rank returns the result).
pub fn reduce_timing<C: Communicator>(comm: &C, threshold: usize, case: SetCase, repeat: usize) -> ReduceTiming {
    let rank = comm.rank() as u32;
    let base = match case {
        SetCase::Unique => u64::from(rank) << 32,
        SetCase::Shared => 0,
    };
    let set: Vec<HashFreq> = local_set(
        rank,
        (0..threshold as u64).map(|i| (synthetic_digest(base + i), 4096, NodeId::new(5, i))),
        threshold,
    );
    let mut times = Vec::with_capacity(repeat);
    let mut merged = 0;
    // One reduction for every repeat, as a run keeps one for its
    // checkpoints (the first, untimed repetition warms its buffers).
    let mut reduction = Reduction::new(comm);
    for i in 0..=repeat {
        comm.barrier();
        let t = Instant::now();
        merged = reduction.reduce(&set, threshold).map_or(0, <[HashFreq]>::len);
        let mine = t.elapsed().as_secs_f64();
        let mut slowest = 0.0f64;
        comm.all_reduce_into(&mine, &mut slowest, SystemOperation::max());
        if i > 0 {
            times.push(slowest);
        }
    }
    times.sort_by(f64::total_cmp);
    ReduceTiming {
        ranks: comm.size() as u32,
        threshold,
        case,
        repeat,
        min_seconds: times.first().copied().unwrap_or(0.0),
        median_seconds: times.get(times.len() / 2).copied().unwrap_or(0.0),
        merged_entries: merged,
        wire_bytes: dckpt::collective::merge::wire_words(threshold) * 8,
    }
}

/// The modes [`mixed_workload`] compares.
pub const MODES: [&str; 3] = ["collective", "local", "full"];

/// Parameters of [`mixed_workload`].
#[derive(Clone, Debug, Serialize)]
pub struct MixedParams {
    /// Bytes per rank.
    pub size: usize,
    /// Fraction of each buffer replicated on every rank.
    pub shared_fraction: f64,
    /// Fraction of each part rewritten per version.
    pub change: f64,
    /// Versions taken.
    pub versions: u64,
    /// Chunk size.
    pub chunk_size: u32,
    /// Through the asynchronous tiers with a host cache of this many bytes
    /// per rank (the stores are the tiers' shared directory); `None`:
    /// synchronous writes.
    pub tiered_cache_bytes: Option<u64>,
    /// With the tiers: compress each file on its way to the first tier.
    pub compression: Option<dckpt::format::Compression>,
    /// CUDA: device memory per rank.
    pub gpu_memory: dckpt::sizes::GpuMemory,
    /// CUDA, with the tiers: the GPU cache tier's share of it.
    pub gpu_cache: dckpt::backend::budget::GpuCache,
    /// CUDA: the buffer lives in device memory, as a GPU simulation's does
    /// (each version is uploaded before its checkpoint is timed); otherwise
    /// it is host memory, which the checkpoint uploads.
    pub resident: bool,
    /// The modes run, in this order (`collective`, `local`, `full`; one may
    /// repeat, e.g. to see what the first mode of a process pays alone).
    pub modes: Vec<String>,
}

/// Result of one mode of [`mixed_workload`] (sums and maxima over ranks).
#[derive(Clone, Debug, Serialize)]
pub struct ModeResult {
    /// collective, local or full.
    pub mode: String,
    /// cpu or cuda.
    pub backend: String,
    /// Bytes of every file of every rank.
    pub total_stored_bytes: u64,
    /// The largest rank's bytes.
    pub max_rank_bytes: u64,
    /// The smallest rank's bytes.
    pub min_rank_bytes: u64,
    /// Seconds of all checkpoints, the slowest rank's each time: what the
    /// application waited.
    pub seconds: f64,
    /// Of which local de-duplication, including the offer (collective
    /// mode), the slowest rank's each time.
    pub local_seconds: f64,
    /// Of which finding the regions offered and their digests (collective).
    pub offer_seconds: f64,
    /// The reduction (collective mode), the slowest rank's: part of
    /// `seconds`, or (`overlapped`) of the background step's thread, not
    /// waited for. Through the tiers, the slowest rank's total.
    pub reduce_seconds: f64,
    /// Each version's seconds (the slowest rank's).
    pub version_seconds: Vec<f64>,
    /// Tiered: seconds from the last checkpoint's return until every version
    /// was durable on every rank (the background flush left to finish).
    pub drain_seconds: f64,
    /// Whether the collective step ran on a background thread
    /// (`CollectiveOptions::overlap` through the tiers).
    pub overlapped: bool,
}

/// One mode's checkpointing, synchronous or through the tiers.
enum Runner {
    Collective(Box<Collective>),
    Local(Engine),
    TieredCollective(Box<TieredCollective>),
    TieredLocal(TieredEngine),
}

/// A collective report's split: local, offer, reduction seconds.
fn split<R>(r: &CollectiveReport<R>) -> [f64; 3] {
    [r.local_seconds, r.offer_seconds, r.reduce_seconds]
}

impl Runner {
    /// Checkpoints `data`: the file's bytes and the seconds of local
    /// de-duplication, of the offer and of the reduction.
    fn checkpoint<C: Communicator>(&mut self, comm: &C, v: u64, data: Protected<'_>) -> Result<(u64, [f64; 3])> {
        Ok(match self {
            Runner::Collective(c) => c.checkpoint(v, data).map(|r| (r.checkpoint.file_bytes, split(&r)))?,
            Runner::Local(e) => {
                let r = all_agree(comm, "checkpoint", v, e.checkpoint(v, data))?;
                (r.file_bytes, [r.dedup_seconds, 0.0, 0.0])
            }
            // Bytes and reductions are counted when settled ([`Runner::settled`]).
            Runner::TieredCollective(c) => {
                c.checkpoint(v, data).map(|r| (0, [r.local_seconds, r.offer_seconds, 0.0]))?
            }
            Runner::TieredLocal(e) => {
                let r = all_agree(comm, "checkpoint", v, e.checkpoint(v, data))?;
                (r.file_bytes, [r.dedup_seconds, 0.0, 0.0])
            }
        })
    }

    fn backend(&self) -> dckpt::backend::BackendKind {
        match self {
            Runner::Collective(c) => c.engine().backend(),
            Runner::Local(e) => e.backend(),
            Runner::TieredCollective(c) => c.engine().backend(),
            Runner::TieredLocal(e) => e.backend(),
        }
    }

    /// The stored bytes and reduction seconds of the versions whose
    /// collective step settled since the last call (through the tiers, a
    /// version settles in a later call when its step runs in the background).
    fn settled(&mut self) -> (u64, f64) {
        match self {
            Runner::TieredCollective(c) => {
                c.take_settled().iter().fold((0, 0.0), |(b, s), r| (b + r.checkpoint.file_bytes, s + r.reduce_seconds))
            }
            _ => (0, 0.0),
        }
    }

    /// Settles the last version (a collective step in the background).
    fn settle(&mut self) {
        if let Runner::TieredCollective(c) = self {
            c.settle();
        }
    }

    /// Whether the collective step runs on a background thread.
    fn overlapped(&self) -> bool {
        matches!(self, Runner::TieredCollective(c) if c.overlapped())
    }

    /// Waits for the background flush (tiers); nothing to do when synchronous.
    fn finish<C: Communicator>(self, comm: &C) -> Result<()> {
        match self {
            Runner::Collective(c) => c.finalize(),
            Runner::Local(_) => Ok(()),
            Runner::TieredCollective(c) => c.finalize(),
            Runner::TieredLocal(e) => all_agree(comm, "finalize", 0, e.finalize()),
        }
    }
}

/// The ranks' buffers at each version: a part identical on every rank
/// (seeded the same) followed by a private part.
struct MixedBuffers {
    shared: Option<Workload>,
    private: Option<Workload>,
    buf: Vec<u8>,
}

impl MixedBuffers {
    fn new(p: &MixedParams, rank: u32) -> Result<Self> {
        let shared_len = (p.size as f64 * p.shared_fraction) as usize;
        let private_len = p.size - shared_len;
        let shared = (shared_len > 0).then(|| Workload::new(shared_len, p.change, Shape::Clustered, 7)).transpose()?;
        let private = (private_len > 0)
            .then(|| Workload::new(private_len, p.change, Shape::Clustered, 1000 + u64::from(rank)))
            .transpose()?;
        let mut m = MixedBuffers { shared, private, buf: Vec::with_capacity(p.size) };
        m.refresh();
        Ok(m)
    }
    fn refresh(&mut self) {
        self.buf.clear();
        for w in [&self.shared, &self.private].into_iter().flatten() {
            self.buf.extend_from_slice(w.current());
        }
    }
    fn advance(&mut self) {
        for w in [&mut self.shared, &mut self.private].into_iter().flatten() {
            w.advance();
        }
        self.refresh();
    }
}

/// The largest of every rank's `x`. Collective.
fn slowest<C: Communicator>(comm: &C, x: f64) -> f64 {
    let mut max = 0.0f64;
    comm.all_reduce_into(&x, &mut max, SystemOperation::max());
    max
}

/// Checkpoints the same sequence of buffers three ways under `root` —
/// collective (Tree + the collective step), local-only Tree, and Full, all on
/// `copts.backend` — and reports stored bytes and time for each. Collective.
pub fn mixed_workload<C: Communicator>(
    comm: &C,
    root: &Path,
    p: &MixedParams,
    copts: &CollectiveOptions,
) -> Result<Vec<ModeResult>> {
    let rank = comm.rank() as u32;
    if !(0.0..=1.0).contains(&p.shared_fraction) || !(0.0..=1.0).contains(&p.change) || p.size == 0 {
        // Every rank has the same parameters, so every rank returns here.
        return Err(Error::InvalidOption("shared fraction and change must be in 0..=1, the size positive".into()));
    }
    if let Some(m) = p.modes.iter().find(|m| !MODES.contains(&m.as_str())) {
        return Err(Error::InvalidOption(format!("unknown mode {m:?} (one of {MODES:?})")));
    }
    let mut out = Vec::new();
    for (i, mode) in p.modes.iter().map(String::as_str).enumerate() {
        let dir = root.join(format!("{i}-{mode}"));
        let store = StoreOptions {
            chunk_size: p.chunk_size,
            method: if mode == "full" { Method::Full } else { Method::Tree },
            gpu_memory: p.gpu_memory,
            ..StoreOptions::default()
        };
        let mut bufs = MixedBuffers::new(p, rank)?;
        let (mut bytes, mut seconds, mut split, mut version_seconds) = (0u64, 0.0, [0.0f64; 3], Vec::new());
        let mut background_reduce = 0.0;
        // The same backend and GPU in every mode.
        let device = comm.split_shared(0).rank().max(0) as usize % dckpt::backend::cuda::device_count().max(1);
        let len = p.size as u64;
        let tiers = p.tiered_cache_bytes.map(|cache| TierOptions {
            local: None,
            shared: Some(dir.clone()),
            host_cache_bytes: cache,
            compression: p.compression,
            gpu_cache: p.gpu_cache,
            ..TierOptions::default()
        });
        let mut runner = match (&tiers, mode == "collective") {
            (None, true) => Runner::Collective(Box::new(Collective::open(comm, &dir, len, &store, copts)?)),
            (Some(t), true) => Runner::TieredCollective(Box::new(TieredCollective::open(comm, t, len, &store, copts)?)),
            (None, false) => {
                let opened = Engine::open_on_device(&dir, rank, len, &store, copts.backend, device);
                Runner::Local(all_agree(comm, "open", 0, opened)?)
            }
            (Some(t), false) => {
                let opened = TieredEngine::open_on(rank, len, &store, t, copts.backend, device);
                Runner::TieredLocal(all_agree(comm, "open", 0, opened)?)
            }
        };
        let mut resident = match p.resident {
            true => {
                Some(all_agree(comm, "device buffer", 0, dckpt::backend::cuda::DeviceStaging::new(device, p.size))?)
            }
            false => None,
        };
        for v in 1..=p.versions {
            let input = match resident.as_mut() {
                Some(dev) => {
                    let uploaded = dev.gather(&[(0, Protected::Host(&bufs.buf))]);
                    all_agree(comm, "upload", v, uploaded)?;
                    Protected::Device(dev.region()?)
                }
                None => Protected::Host(&bufs.buf),
            };
            comm.barrier();
            let t = Instant::now();
            let (file_bytes, parts) = runner.checkpoint(comm, v, input)?;
            let took = slowest(comm, t.elapsed().as_secs_f64());
            seconds += took;
            version_seconds.push(took);
            for (sum, x) in split.iter_mut().zip(parts) {
                *sum += slowest(comm, x);
            }
            let (settled_bytes, settled_reduce) = runner.settled();
            bytes += file_bytes + settled_bytes;
            background_reduce += settled_reduce;
            bufs.advance();
        }
        runner.settle();
        let (settled_bytes, settled_reduce) = runner.settled();
        bytes += settled_bytes;
        split[2] += slowest(comm, background_reduce + settled_reduce);
        let (backend, overlapped) = (runner.backend(), runner.overlapped());
        let t = Instant::now();
        runner.finish(comm)?;
        let drain_seconds = if tiers.is_some() { slowest(comm, t.elapsed().as_secs_f64()) } else { 0.0 };
        let (mut total, mut max, mut min) = (0u64, 0u64, 0u64);
        comm.all_reduce_into(&bytes, &mut total, SystemOperation::sum());
        comm.all_reduce_into(&bytes, &mut max, SystemOperation::max());
        comm.all_reduce_into(&bytes, &mut min, SystemOperation::min());
        out.push(ModeResult {
            mode: mode.into(),
            backend: format!("{backend:?}").to_lowercase(),
            total_stored_bytes: total,
            max_rank_bytes: max,
            min_rank_bytes: min,
            seconds,
            local_seconds: split[0],
            offer_seconds: split[1],
            reduce_seconds: split[2],
            version_seconds,
            drain_seconds,
            overlapped,
        });
    }
    Ok(out)
}
