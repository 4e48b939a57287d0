//! `dckpt bench-rtm`: an adjoint (RTM-like) run, as HPDC'23 measures one.
//! A forward pass checkpoints `N` versions of one buffer with a compute
//! interval between them; a backward pass restores every version, in
//! reverse or in an irregular order, with a compute interval before each
//! restore. What the application waits for is timed: each checkpoint call
//! and each restore call (to the bytes back in its buffer, on the device for
//! CUDA), over the same versions through
//! - the synchronous store ([`Engine`]: write + fsync in the call, restore
//!   from disk), the baseline;
//! - the asynchronous tiers ([`TieredEngine`]) with a restore cache, for
//!   every eviction policy × {no, one, all} hints.
//!
//! Hints as in HPDC'23: *all* enqueues the whole restore order before the
//! forward pass and starts prefetching at the backward pass; *one* enqueues,
//! at the start of each backward iteration, the version the next iteration
//! restores; *none* enqueues nothing (the restore cache then holds what the
//! flush left in it and what restores read). Every restored buffer is
//! checked against the version's digest. With `cold`, the page cache of the
//! tier directories is dropped before each restore (untimed), so disk reads
//! come from the device, as on a node whose checkpoints exceed its memory.

use crate::bench::e2e::Buffer;
use crate::bench::generate::{Shape, Workload};
use dckpt::backend::BackendKind;
use dckpt::engine::Engine;
use dckpt::error::{Error, Result};
use dckpt::store::StoreOptions;
use dckpt::tiers::arena::Policy;
use dckpt::tiers::{TierOptions, TieredEngine};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The sizes of the versions' diffs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sizes {
    /// Every version rewrites the whole buffer: every diff is the buffer's
    /// size, and each restore reads one file.
    Uniform,
    /// Each version rewrites a fraction drawn log-uniformly from 1–100%
    /// (clustered edits): diffs of every size, restores that read chains.
    Variable,
}

impl std::str::FromStr for Sizes {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "uniform" => Ok(Sizes::Uniform),
            "variable" => Ok(Sizes::Variable),
            _ => Err(Error::InvalidOption(format!("sizes '{s}': uniform or variable"))),
        }
    }
}

/// The backward pass's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Order {
    /// N, N−1, …, 1.
    Reverse,
    /// A fixed pseudo-random permutation (the seed's).
    Irregular,
}

impl std::str::FromStr for Order {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "reverse" => Ok(Order::Reverse),
            "irregular" => Ok(Order::Irregular),
            _ => Err(Error::InvalidOption(format!("order '{s}': reverse or irregular"))),
        }
    }
}

/// How many restores the application announces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Hints {
    /// None.
    None,
    /// The next one, one iteration ahead.
    One,
    /// The whole order, before the forward pass.
    All,
}

impl std::str::FromStr for Hints {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "none" => Ok(Hints::None),
            "one" => Ok(Hints::One),
            "all" => Ok(Hints::All),
            _ => Err(Error::InvalidOption(format!("hints '{s}': none, one or all"))),
        }
    }
}

impl std::fmt::Display for Hints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Hints::None => "none",
            Hints::One => "one",
            Hints::All => "all",
        })
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct RtmOptions {
    /// Bytes of the buffer.
    pub size: usize,
    /// Versions written by the forward pass.
    pub versions: u32,
    /// Diff sizes.
    pub sizes: Sizes,
    /// Backward order.
    pub order: Order,
    /// Policies to compare.
    pub policies: Vec<Policy>,
    /// Hint modes to compare.
    pub hints: Vec<Hints>,
    /// The compute interval between checkpoints and before each restore.
    pub compute: Duration,
    /// Host cache of the tiers (write side).
    pub host_cache_bytes: u64,
    /// Restore cache of the tiers.
    pub restore_cache_bytes: u64,
    /// Also a shared tier (else the local directory only).
    pub shared: bool,
    /// Drop the tiers' page cache before each restore.
    pub cold: bool,
    /// Store parameters.
    pub store: StoreOptions,
    /// The tiers' GPU cache tier (CUDA).
    pub gpu_cache: dckpt::backend::budget::GpuCache,
    /// Backend.
    pub backend: BackendKind,
    /// Scratch directory (emptied first, removed after).
    pub dir: PathBuf,
    /// Workload seed.
    pub seed: u64,
}

/// One run (the synchronous baseline, or one policy × hints).
#[derive(Clone, Debug, Serialize)]
pub struct RtmRun {
    /// `sync`, or the policy.
    pub engine: String,
    /// Hint mode (`-` for the baseline).
    pub hints: String,
    /// Sum of the checkpoint calls, s.
    pub checkpoint_seconds: f64,
    /// Of which waiting for room in the host cache, s.
    pub backpressure_seconds: f64,
    /// Sum of the restore calls, s.
    pub restore_seconds: f64,
    /// Buffer bytes × versions over the checkpoint calls, GB/s.
    pub checkpoint_gbps: f64,
    /// Buffer bytes × versions over the restore calls, GB/s.
    pub restore_gbps: f64,
    /// The whole run, forward and backward, compute included, s.
    pub wall_seconds: f64,
    /// What the restore cache did (all zero for the baseline).
    #[serde(flatten)]
    pub cache: dckpt::tiers::prefetch::PrefetchStats,
}

/// The whole comparison.
#[derive(Clone, Debug, Serialize)]
pub struct RtmReport {
    /// Backend used.
    pub backend: String,
    /// Device name (GPU) or `cpu`.
    pub device: String,
    /// Buffer bytes.
    pub size: u64,
    /// Versions.
    pub versions: u32,
    /// Diff sizes.
    pub sizes: Sizes,
    /// Backward order.
    pub order: Order,
    /// The diff files' bytes (the synchronous run's).
    pub diff_bytes: u64,
    /// Compute interval, ms.
    pub compute_ms: f64,
    /// Host cache bytes (write side).
    pub host_cache_bytes: u64,
    /// Restore cache bytes.
    pub restore_cache_bytes: u64,
    /// Page cache dropped before each restore.
    pub cold: bool,
    /// The baseline first.
    pub runs: Vec<RtmRun>,
}

/// The versions' states, regenerated from the seed for each run (a run
/// never holds more than the current state and the versions' digests).
struct Versions<'a> {
    o: &'a RtmOptions,
    workload: Workload,
    rng: SmallRng,
}

impl<'a> Versions<'a> {
    fn new(o: &'a RtmOptions) -> Result<Self> {
        let change = if o.sizes == Sizes::Uniform { 1.0 } else { 0.01 };
        let workload = Workload::new(o.size, change, Shape::Clustered, o.seed)?;
        Ok(Versions { o, workload, rng: SmallRng::seed_from_u64(o.seed ^ 0x5eed) })
    }

    /// The state of version 1, then of each next version.
    fn next(&mut self, version: u64) -> Result<&[u8]> {
        if version > 1 {
            if self.o.sizes == Sizes::Variable {
                // log-uniform in [1%, 100%]
                let change = 10f64.powf(self.rng.random_range(-2.0..=0.0));
                self.workload.set_change(change)?;
            }
            self.workload.advance();
        }
        Ok(self.workload.current())
    }
}

/// The backward pass's order of versions.
fn backward_order(o: &RtmOptions) -> Vec<u64> {
    let mut order: Vec<u64> = (1..=u64::from(o.versions)).rev().collect();
    if o.order == Order::Irregular {
        let mut rng = SmallRng::seed_from_u64(o.seed ^ 0x0dd);
        for i in (1..order.len()).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
    }
    order
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    *blake3::Hasher::new().update_rayon(bytes).finalize().as_bytes()
}

/// A checkpointer under test: the baseline or the tiers.
trait Checkpointer {
    /// Checkpoints `buf` as `version`; seconds of backpressure.
    fn checkpoint(&mut self, version: u64, buf: &Buffer) -> Result<f64>;
    /// Restores `version` into `buf`.
    fn restore(&mut self, version: u64, buf: &mut Buffer) -> Result<()>;
    /// At the start of backward iteration `k` (before its compute).
    fn backward_iteration(&mut self, _k: usize) {}
}

impl Checkpointer for Engine {
    fn checkpoint(&mut self, version: u64, buf: &Buffer) -> Result<f64> {
        Engine::checkpoint(self, version, buf.protected()?).map(|_| 0.0)
    }
    fn restore(&mut self, version: u64, buf: &mut Buffer) -> Result<()> {
        self.restore_into(version, buf.protected_mut()?)
    }
}

/// The tiers, with the application's hints.
struct Tiered<'a> {
    engine: TieredEngine,
    hints: Hints,
    order: &'a [u64],
}

impl Checkpointer for Tiered<'_> {
    fn checkpoint(&mut self, version: u64, buf: &Buffer) -> Result<f64> {
        self.engine.checkpoint(version, buf.protected()?).map(|r| r.backpressure_seconds)
    }
    fn restore(&mut self, version: u64, buf: &mut Buffer) -> Result<()> {
        self.engine.restore_into(version, buf.protected_mut()?)
    }
    fn backward_iteration(&mut self, k: usize) {
        if self.hints == Hints::One {
            if k == 0 {
                self.engine.prefetch_enqueue(self.order[0]);
            }
            if let Some(next) = self.order.get(k + 1) {
                self.engine.prefetch_enqueue(*next);
            }
        }
        if k == 0 {
            self.engine.prefetch_start();
        }
    }
}

/// What one pass pair measured.
struct Passes {
    checkpoint: f64,
    backpressure: f64,
    restore: f64,
    wall: f64,
}

/// The forward and backward passes over `c` (the first run records the
/// versions' digests, later runs check against them).
fn passes(
    o: &RtmOptions,
    c: &mut dyn Checkpointer,
    buf: &mut Buffer,
    digests: &mut Vec<[u8; 32]>,
    progress: &mut impl FnMut(&str),
) -> Result<Passes> {
    let start = Instant::now();
    let mut versions = Versions::new(o)?;
    let (mut checkpoint, mut backpressure) = (0.0, 0.0);
    let record = digests.is_empty();
    for v in 1..=u64::from(o.versions) {
        let state = versions.next(v)?;
        if record {
            digests.push(digest(state));
        }
        buf.load(state)?;
        std::thread::sleep(o.compute);
        let t = Instant::now();
        backpressure += c.checkpoint(v, buf)?;
        checkpoint += t.elapsed().as_secs_f64();
        progress("forward");
    }
    drop(versions);
    let mut restore = 0.0;
    for (k, &v) in backward_order(o).iter().enumerate() {
        c.backward_iteration(k);
        std::thread::sleep(o.compute);
        if o.cold {
            dckpt::storage::fsio::drop_cached_pages(&o.dir);
        }
        let t = Instant::now();
        c.restore(v, buf)?;
        restore += t.elapsed().as_secs_f64();
        if digest(&buf.copy_out()?) != digests[v as usize - 1] {
            return Err(Error::Internal(format!("version {v} restored wrong bytes")));
        }
        progress("backward");
    }
    Ok(Passes { checkpoint, backpressure, restore, wall: start.elapsed().as_secs_f64() })
}

impl RtmOptions {
    fn run_of(
        &self,
        engine: String,
        hints: String,
        p: &Passes,
        stats: dckpt::tiers::prefetch::PrefetchStats,
    ) -> RtmRun {
        let bytes = self.size as f64 * f64::from(self.versions) / 1e9;
        RtmRun {
            engine,
            hints,
            checkpoint_seconds: p.checkpoint,
            backpressure_seconds: p.backpressure,
            restore_seconds: p.restore,
            checkpoint_gbps: bytes / p.checkpoint.max(1e-9),
            restore_gbps: bytes / p.restore.max(1e-9),
            wall_seconds: p.wall,
            cache: stats,
        }
    }

    fn fresh_dir(&self) -> Result<()> {
        if self.dir.exists() {
            std::fs::remove_dir_all(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
        }
        std::fs::create_dir_all(&self.dir).map_err(|e| Error::io(&self.dir, e))
    }
}

/// Runs the baseline, then every policy × hints; `progress` is called after
/// each checkpoint and restore.
pub fn run(o: &RtmOptions, mut progress: impl FnMut(&str)) -> Result<RtmReport> {
    if o.versions == 0 {
        return Err(Error::InvalidOption("versions must be positive".into()));
    }
    let backend = o.backend.resolve();
    let (mut buf, device) = Buffer::new(backend, &vec![0u8; o.size])?;
    let len = o.size as u64;
    let mut digests = Vec::new();
    let mut runs = Vec::new();

    o.fresh_dir()?;
    let store_dir = o.dir.join("sync");
    let mut engine = Engine::open_with_backend(&store_dir, 0, len, &o.store, backend)?;
    let p = passes(o, &mut engine, &mut buf, &mut digests, &mut progress)?;
    drop(engine);
    let diff_bytes = dckpt::inspect::store_stats(&store_dir)?.total_stored_bytes;
    runs.push(o.run_of("sync".into(), "-".into(), &p, Default::default()));

    let order = backward_order(o);
    for &policy in &o.policies {
        for &hints in &o.hints {
            o.fresh_dir()?;
            let tiers = TierOptions {
                local: Some(o.dir.join("local")),
                shared: o.shared.then(|| o.dir.join("shared")),
                host_cache_bytes: o.host_cache_bytes,
                prefetch_cache_bytes: o.restore_cache_bytes,
                eviction: policy,
                gpu_cache: o.gpu_cache,
                ..TierOptions::default()
            };
            let engine = TieredEngine::open(0, len, &o.store, &tiers, backend)?;
            if hints == Hints::All {
                order.iter().for_each(|v| engine.prefetch_enqueue(*v));
            }
            let mut t = Tiered { engine, hints, order: &order };
            let p = passes(o, &mut t, &mut buf, &mut digests, &mut progress)?;
            let stats = t.engine.prefetch_stats().unwrap_or_default();
            t.engine.finalize()?;
            runs.push(o.run_of(policy.to_string(), hints.to_string(), &p, stats));
        }
    }
    std::fs::remove_dir_all(&o.dir).map_err(|e| Error::io(&o.dir, e))?;
    Ok(RtmReport {
        backend: backend.to_string(),
        device,
        size: len,
        versions: o.versions,
        sizes: o.sizes,
        order: o.order,
        diff_bytes,
        compute_ms: o.compute.as_secs_f64() * 1e3,
        host_cache_bytes: o.host_cache_bytes,
        restore_cache_bytes: o.restore_cache_bytes,
        cold: o.cold,
        runs,
    })
}
