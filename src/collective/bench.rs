//! Measurements of the collective step (feature `mpi`), run under `mpirun`
//! by `dckpt bench-collective` and `scripts/bench-collective.sh`:
//!
//! - [`reduce_timing`]: the reduction alone over synthetic tuple sets of K
//!   entries per rank, worst case (every digest unique) and best case (every
//!   digest on every rank), as in Figures 2 and 3 of the paper;
//! - [`mixed_workload`]: whole checkpoints of buffers whose first part is
//!   replicated on every rank, collective vs local-only vs Full.

use super::merge::{HashFreq, local_set};
use super::mpi::{all_agree, reduce_sets};
use super::{Collective, CollectiveOptions};
use crate::engine::Engine;
use crate::generate::{Shape, Workload};
use crate::hash::Digest;
use crate::layout::NodeId;
use crate::store::StoreOptions;
use crate::{Error, Method, Result};
use ::mpi::collective::SystemOperation;
use ::mpi::traits::*;
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
    /// Bytes of one wire set (what each message step carries).
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
    for i in 0..=repeat {
        comm.barrier();
        let t = Instant::now();
        merged = reduce_sets(comm, &set, threshold).map_or(0, |m| m.len());
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
        wire_bytes: super::merge::wire_words(threshold) * 8,
    }
}

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
    /// Seconds of all checkpoints, the slowest rank's.
    pub seconds: f64,
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
    let mut out = Vec::new();
    for mode in ["collective", "local", "full"] {
        let dir = root.join(mode);
        let store = StoreOptions {
            chunk_size: p.chunk_size,
            method: if mode == "full" { Method::Full } else { Method::Tree },
            ..StoreOptions::default()
        };
        let mut bufs = MixedBuffers::new(p, rank)?;
        let mut bytes = 0u64;
        let mut seconds = 0.0;
        let mut collective =
            if mode == "collective" { Some(Collective::open(comm, &dir, p.size as u64, &store, copts)?) } else { None };
        let mut engine = if mode == "collective" {
            None
        } else {
            // The same backend and GPU as the collective mode uses.
            let device = comm.split_shared(0).rank().max(0) as usize % crate::backend::cuda::device_count().max(1);
            let opened = Engine::open_on_device(&dir, rank, p.size as u64, &store, copts.backend, device);
            Some(all_agree(comm, "open", 0, opened)?)
        };
        for v in 1..=p.versions {
            comm.barrier();
            let t = Instant::now();
            let file_bytes = match (&mut collective, &mut engine) {
                (Some(c), _) => c.checkpoint(v, &bufs.buf)?.checkpoint.file_bytes,
                (_, Some(e)) => all_agree(comm, "checkpoint", v, e.checkpoint(v, &bufs.buf))?.file_bytes,
                _ => 0,
            };
            let mine = t.elapsed().as_secs_f64();
            let mut slowest = 0.0f64;
            comm.all_reduce_into(&mine, &mut slowest, SystemOperation::max());
            seconds += slowest;
            bytes += file_bytes;
            bufs.advance();
        }
        let (mut total, mut max, mut min) = (0u64, 0u64, 0u64);
        comm.all_reduce_into(&bytes, &mut total, SystemOperation::sum());
        comm.all_reduce_into(&bytes, &mut max, SystemOperation::max());
        comm.all_reduce_into(&bytes, &mut min, SystemOperation::min());
        let backend = match (&collective, &engine) {
            (Some(c), _) => c.engine().backend(),
            (_, Some(e)) => e.backend(),
            _ => crate::backend::BackendKind::Cpu,
        };
        out.push(ModeResult {
            mode: mode.into(),
            backend: format!("{backend:?}").to_lowercase(),
            total_stored_bytes: total,
            max_rank_bytes: max,
            min_rank_bytes: min,
            seconds,
        });
    }
    Ok(out)
}
