//! Synthetic evolving buffers, so anyone can rerun the benchmarks.
//!
//! The base buffer looks like a simulation field (single-precision values of
//! a smooth function plus noise: mildly compressible). Each new version
//! rewrites `change` of its bytes with fresh values, either *clustered*
//! (runs of random length, mean 4 KiB, plus one shifted copy of a 64 KiB
//! page-aligned block) or *scattered* (isolated 64-byte granules). Everything is derived
//! from `seed`, so a spec always yields the same bytes.

use dckpt::error::{Error, Result};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// Where the changed bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Shape {
    /// Runs of mean 4 KiB plus one shifted 64 KiB block per version.
    Clustered,
    /// Isolated 64-byte granules.
    Scattered,
}

impl FromStr for Shape {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "clustered" => Ok(Shape::Clustered),
            "scattered" => Ok(Shape::Scattered),
            _ => Err(Error::InvalidOption(format!("unknown shape '{s}' (expected clustered or scattered)"))),
        }
    }
}

/// Mean length of a clustered run.
pub const MEAN_RUN: f64 = 4096.0;
/// Size of a scattered granule.
pub const GRANULE: usize = 64;
/// Size of the block copied to a new place in each clustered version.
pub const SHIFTED_BLOCK: usize = 64 * 1024;

/// Alignment of the shifted block's source and destination.
pub const SHIFT_ALIGN: usize = 4096;

/// A reproducible sequence of versions.
pub struct Workload {
    granule: usize,
    change: f64,
    shape: Shape,
    rng: SmallRng,
    data: Vec<u8>,
}

impl Workload {
    /// A workload over `size` bytes; `change` is the fraction of bytes
    /// rewritten per version (0..=1).
    pub fn new(size: usize, change: f64, shape: Shape, seed: u64) -> Result<Self> {
        if !(0.0..=1.0).contains(&change) {
            return Err(Error::InvalidOption(format!("change fraction {change} is outside 0..=1")));
        }
        if size == 0 {
            return Err(Error::InvalidOption("size must be positive".into()));
        }
        let mut data = vec![0u8; size];
        data.par_chunks_mut(1 << 20).enumerate().for_each(|(block, bytes)| {
            let mut rng = SmallRng::seed_from_u64(seed ^ (block as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let base = block * (1 << 18);
            for (k, word) in bytes.chunks_mut(4).enumerate() {
                let x = (base + k) as f32 * 1.0e-3;
                let v = x.sin() * 100.0 + rng.random_range(-0.01f32..0.01);
                let b = v.to_le_bytes();
                word.copy_from_slice(&b[..word.len()]);
            }
        });
        Ok(Workload { granule: GRANULE, change, shape, rng: SmallRng::seed_from_u64(seed.wrapping_add(1)), data })
    }

    /// Sets the size of a scattered edit (default [`GRANULE`]); with the chunk
    /// size, each edit rewrites exactly one chunk.
    pub fn with_granule(mut self, granule: usize) -> Result<Self> {
        if granule == 0 || granule > self.data.len() {
            return Err(Error::InvalidOption(format!("granule {granule} must be between 1 and the size")));
        }
        self.granule = granule;
        Ok(self)
    }

    /// Sets the fraction of bytes the next versions rewrite (0..=1).
    pub fn set_change(&mut self, change: f64) -> Result<()> {
        if !(0.0..=1.0).contains(&change) {
            return Err(Error::InvalidOption(format!("change fraction {change} is outside 0..=1")));
        }
        self.change = change;
        Ok(())
    }

    /// The current version's bytes (the base before the first `advance`).
    pub fn current(&self) -> &[u8] {
        &self.data
    }

    /// Applies one version's edits.
    pub fn advance(&mut self) {
        let size = self.data.len();
        if self.change >= 1.0 {
            // Everything changes (sampling granules with replacement would miss ~37%).
            self.rng.fill(&mut self.data[..]);
            return;
        }
        let target = (self.change * size as f64) as usize;
        let mut changed = 0;
        match self.shape {
            Shape::Clustered => {
                while changed < target {
                    let u: f64 = self.rng.random_range(f64::EPSILON..1.0);
                    let len = ((-u.ln() * MEAN_RUN) as usize)
                        .clamp(1, 16 * MEAN_RUN as usize)
                        .min(target - changed)
                        .min(size);
                    let at = self.rng.random_range(0..=size - len);
                    self.rng.fill(&mut self.data[at..at + len]);
                    changed += len;
                }
                if size >= 2 * SHIFTED_BLOCK {
                    // Page-aligned, like an array section moved by the application.
                    let pages = (size - SHIFTED_BLOCK) / SHIFT_ALIGN;
                    let from = self.rng.random_range(0..=pages) * SHIFT_ALIGN;
                    let to = self.rng.random_range(0..=pages) * SHIFT_ALIGN;
                    self.data.copy_within(from..from + SHIFTED_BLOCK, to);
                }
            }
            Shape::Scattered => {
                let gr = self.granule;
                let granules = size / gr;
                while changed < target && granules > 0 {
                    let g = self.rng.random_range(0..granules);
                    self.rng.fill(&mut self.data[g * gr..(g + 1) * gr]);
                    changed += gr;
                }
            }
        }
    }
}
