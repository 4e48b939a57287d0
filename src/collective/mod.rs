//! Collective de-duplication (Nicolae, IPDPS'13, section III): after each
//! rank has de-duplicated against its own history, the regions several ranks
//! would store are stored once, by one owner chosen so that no rank becomes
//! the straggler; the others keep a cross-rank reference.
//!
//! - [`merge`](mod@self::merge): the top-K merger (Algorithm 2) as a pure function, and the
//!   wire form of a tuple set (a count word, then 5 words an entry).
//! - [`regions`]: the FIRST regions a rank offers, and the rewrite of its
//!   diff and record once owners are known.
//! - [`step`]: one rank's side of a collective checkpoint around the
//!   reduction, independent of the transport.
//! - [`mpi`] (feature `mpi`): the agreements, the checks before opening and
//!   the step's first part over MPI; the reduction merges the ranks' sets
//!   up a binomial tree, then broadcasts the result (`reduce::Reducer`).
//! - [`tiered`] (feature `mpi`): [`TieredCollective`], the one driver: the
//!   step through the asynchronous tiers; each rank flushes only its own
//!   files, and a version is committed on a tier once every rank's are
//!   durable there.
//! - [`sync`](mod@self::sync) (feature `mpi`): [`Collective`], the same driver over one
//!   shared directory, each checkpoint waited for until it is committed.
//! - [`protect`] and [`recover`] (feature `mpi`): the node-local tier's
//!   copies on other nodes, made after each version (issue #31), and a
//!   restart's rebuild of a lost node's files; `transfer` moves the bytes.

#[cfg(feature = "mpi")]
mod background;
pub mod merge;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "mpi")]
pub mod protect;
#[cfg(feature = "mpi")]
pub mod recover;
#[cfg(feature = "mpi")]
mod reduce;
pub mod regions;
pub mod step;
#[cfg(feature = "mpi")]
pub mod sync;
#[cfg(feature = "mpi")]
pub mod tiered;
#[cfg(feature = "mpi")]
mod transfer;

pub use merge::{DEFAULT_THRESHOLD, HashFreq, local_set, merge, reduce_all};
#[cfg(feature = "mpi")]
pub use mpi::CollectiveReport;
#[cfg(feature = "mpi")]
pub use reduce::Reduction;
#[cfg(feature = "mpi")]
pub use sync::Collective;
#[cfg(feature = "mpi")]
pub use tiered::TieredCollective;

use crate::backend::BackendKind;
use crate::error::{Error, Result};
use crate::redundancy::Redundancy;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// Largest region offered to the reduction when sized automatically
/// (256 KiB): a 1 GiB buffer offers at most 4096 regions.
pub const MAX_AUTO_REGION_BYTES: u64 = 256 * 1024;

/// Regions per rank share that automatic sizing aims for: a buffer
/// replicated on all P ranks is cut into about `64 P` regions, so the
/// greedy owner choice can spread it within a few percent.
pub const AUTO_REGIONS_PER_RANK: u64 = 64;

/// Bytes one cross-rank reference costs in a diff file (a 40-byte SHIFT
/// entry and a 16-byte digest).
pub const REFERENCE_BYTES: u64 = 56;

/// The region size used for `region_bytes = 0` (automatic), for the smallest
/// rank's buffer and P ranks: about `64 P` regions for balance, but large
/// enough that the P − 1 references to a replicated region cost at most 2%
/// of it (`50 · 56 · (P − 1)` bytes), and at most [`MAX_AUTO_REGION_BYTES`].
pub fn auto_region_bytes(min_data_len: u64, ranks: u32) -> u64 {
    let p = u64::from(ranks.max(1));
    let balance = min_data_len / (AUTO_REGIONS_PER_RANK * p);
    let metadata = 50 * REFERENCE_BYTES * (p - 1);
    balance.max(metadata).min(MAX_AUTO_REGION_BYTES)
}

/// Settings of the collective step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CollectiveOptions {
    /// K: the most tuples a partial result keeps (the paper's threshold).
    pub threshold: usize,
    /// Largest region (Merkle node) offered, in bytes, rounded down to a
    /// power-of-two number of chunks (one chunk at least); 0 sizes it
    /// automatically ([`auto_region_bytes`]). All ranks must use the same.
    pub region_bytes: u64,
    /// Where each rank de-duplicates: `auto` (CUDA when a device is usable,
    /// ranks of a node spread over its GPUs), `cpu` or `cuda`.
    pub backend: BackendKind,
    /// Skips the reduction: each rank de-duplicates against its own history
    /// only and stores every region itself (what the collective step is
    /// measured against). Any method is allowed then, `full` included.
    pub local_only: bool,
    /// Smallest region offered, in bytes (0: every region). Smaller FIRST
    /// regions are stored by their rank without entering the reduction:
    /// fewer tuples make a shorter reduction, at the price of the bytes
    /// the small regions repeated across ranks would have saved. Opt-in.
    pub min_region_bytes: u64,
    /// Where the reduction and the give-away of a checkpoint through the
    /// tiers run: on a background thread with its own communicator, so the
    /// call returns once the rank's diff is cached (the version settles at
    /// the next collective call: checkpoint, wait, finalize), or in the
    /// call ([`Overlap`]; `auto` by default).
    pub overlap: Overlap,
    /// What a checkpoint call does when the previous version's collective
    /// step, running beside the application, has not decided yet
    /// ([`LateStep`]; `baseline` by default).
    pub late_step: LateStep,
    /// How the node-local tier is protected against the loss of a node
    /// (partner copies or XOR parity on other nodes; `none` by default).
    /// Needs a node-local tier. All ranks must use the same.
    pub redundancy: Redundancy,
    /// Ranks per node, for node membership: ranks `0..k` on node 0, the
    /// next `k` on node 1, … (emulated nodes, or a layout MPI cannot see);
    /// 0: the nodes MPI reports (ranks sharing memory).
    pub ranks_per_node: u32,
    /// Versions the node-local tier's copies on other nodes may lag behind
    /// the calls: a call finding that many without their copies waits
    /// (reported; 0: no bound). 2 by default.
    pub max_copy_lag: u64,
}

/// What a checkpoint call does when the collective step of an earlier
/// version, running on its background thread ([`Overlap`]), has not
/// decided yet. Waiting gives every version the same stored bytes
/// whatever the timing; keeping returns at once and stores that version's
/// regions on this rank (correct either way: an owner never gives its own
/// regions away). `checkpoint`, `wait` and `finalize` follow it (so a
/// drain is the bytes left to flush, not a queue of steps); a restart and
/// `settle` always wait.
///
/// Written `"baseline"`, `"keep"` or `"wait"` in a configuration file and
/// in `DCKPT_LATE_STEP`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LateStep {
    /// Wait for a baseline's step (where a shared initial state is given
    /// away: most of what the collective step saves), keep the regions of
    /// any other version (the default).
    #[default]
    Baseline,
    /// Never wait: the version keeps its regions.
    Keep,
    /// Always wait (the stored bytes do not depend on timing).
    Wait,
}

impl LateStep {
    /// Whether a call waits for the late step of a version that is a
    /// `baseline` or not.
    pub fn waits_for(self, baseline: bool) -> bool {
        match self {
            LateStep::Baseline => baseline,
            LateStep::Keep => false,
            LateStep::Wait => true,
        }
    }
}

impl fmt::Display for LateStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LateStep::Baseline => "baseline",
            LateStep::Keep => "keep",
            LateStep::Wait => "wait",
        })
    }
}

impl FromStr for LateStep {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "baseline" => Ok(LateStep::Baseline),
            "keep" => Ok(LateStep::Keep),
            "wait" => Ok(LateStep::Wait),
            _ => Err(Error::InvalidOption(format!("unknown late_step '{s}' (expected baseline, keep or wait)"))),
        }
    }
}

/// Where the collective step of a checkpoint through the tiers runs. The
/// background thread needs `MPI_THREAD_MULTIPLE` on every rank (otherwise
/// the step runs in the call, whatever this says), and it runs in the call
/// on every rank if any rank's setting keeps it there.
///
/// Written `"auto"`, `true` (or `"on"`) and `false` (or `"off"`) in a
/// configuration file and in `DCKPT_OVERLAP`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Overlap {
    /// On the background thread, except where a rank of the CPU backend
    /// can count on fewer than two CPUs (bound to one, or more ranks on its
    /// node than half the CPUs they may use: [`cpu_share`](self::mpi::cpu_share)): there
    /// the thread's reduction waits behind the applications for the CPUs,
    /// at every level of the tree, and the next call waits for it. Measured
    /// with 16 ranks on 16 cores (BENCHMARKS.md, "One core a rank"): the
    /// reduction took 0.1–1.6 ms in the call against 34–55 ms on the
    /// thread, and the heat example's checkpoints cost 1.67–1.71 ms a step
    /// against 3.71–3.95 ms. With 2 cores a rank the two are within the
    /// noise. With the CUDA backend the thread kept heat ahead also on one
    /// core (6.7 against 7.5 ms a step, 16 ranks on one H100; labels within
    /// the noise), so it stays there.
    #[default]
    Auto,
    /// On the background thread.
    On,
    /// In the call.
    Off,
}

impl Overlap {
    /// Whether the step runs on the background thread for a rank of
    /// `backend` (resolved) that can count on `cpus` CPUs (`None`: unknown,
    /// taken as several).
    pub fn wanted(self, backend: BackendKind, cpus: Option<usize>) -> bool {
        match self {
            Overlap::On => true,
            Overlap::Off => false,
            Overlap::Auto => !(backend == BackendKind::Cpu && cpus == Some(1)),
        }
    }
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Overlap::Auto => "auto",
            Overlap::On => "on",
            Overlap::Off => "off",
        })
    }
}

impl FromStr for Overlap {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Overlap::Auto),
            "on" | "true" => Ok(Overlap::On),
            "off" | "false" => Ok(Overlap::Off),
            _ => Err(Error::InvalidOption(format!("unknown overlap '{s}' (expected auto, on or off)"))),
        }
    }
}

impl From<bool> for Overlap {
    fn from(on: bool) -> Self {
        if on { Overlap::On } else { Overlap::Off }
    }
}

/// `true` and `false` as TOML booleans (what `overlap` was before `auto`),
/// `"auto"` as text.
impl Serialize for Overlap {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Overlap::Auto => s.serialize_str("auto"),
            Overlap::On => s.serialize_bool(true),
            Overlap::Off => s.serialize_bool(false),
        }
    }
}

impl<'de> Deserialize<'de> for Overlap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Words;
        impl serde::de::Visitor<'_> for Words {
            type Value = Overlap;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("auto, on, off, true or false")
            }
            fn visit_bool<E: serde::de::Error>(self, on: bool) -> std::result::Result<Overlap, E> {
                Ok(on.into())
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> std::result::Result<Overlap, E> {
                s.parse().map_err(|_| E::invalid_value(serde::de::Unexpected::Str(s), &self))
            }
        }
        d.deserialize_any(Words)
    }
}

impl Default for CollectiveOptions {
    fn default() -> Self {
        CollectiveOptions {
            threshold: DEFAULT_THRESHOLD,
            region_bytes: 0,
            backend: BackendKind::Auto,
            local_only: false,
            min_region_bytes: 0,
            overlap: Overlap::Auto,
            late_step: LateStep::Baseline,
            redundancy: Redundancy::None,
            ranks_per_node: 0,
            max_copy_lag: 2,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_overlap_keeps_the_step_in_the_call_only_for_a_cpu_rank_on_one_cpu() {
        use BackendKind::{Cpu, Cuda};
        assert!(!Overlap::Auto.wanted(Cpu, Some(1)));
        assert!(Overlap::Auto.wanted(Cpu, Some(2)));
        assert!(Overlap::Auto.wanted(Cpu, None), "unknown: taken as several");
        assert!(Overlap::Auto.wanted(Cuda, Some(1)));
        assert!(Overlap::On.wanted(Cpu, Some(1)));
        assert!(!Overlap::Off.wanted(Cuda, Some(16)));
        assert_eq!("off".parse::<Overlap>().ok(), Some(Overlap::Off));
        assert!("sometimes".parse::<Overlap>().is_err());
    }

    #[test]
    fn overlap_reads_back_as_written_and_refuses_other_words() {
        #[derive(Deserialize, Serialize, Debug, PartialEq)]
        struct T {
            overlap: Overlap,
        }
        for o in [Overlap::Auto, Overlap::On, Overlap::Off] {
            let text = toml::to_string(&T { overlap: o }).expect("toml");
            assert_eq!(toml::from_str::<T>(&text).expect("back"), T { overlap: o }, "{text}");
        }
        for bad in ["overlap = 1", "overlap = \"ON\"", "overlap = \"sometimes\""] {
            let e = toml::from_str::<T>(bad).expect_err(bad).to_string();
            assert!(e.contains("auto, on, off, true or false") && !e.contains("BoolOrText"), "{bad}: {e}");
        }
    }
}
