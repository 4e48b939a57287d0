//! Simulation-like evolving buffers, for measurements on data shaped like
//! what the applications checkpoint (the compression study of
//! `dckpt study-compression`), next to the synthetic edits of
//! [`crate::bench::generate`]. Deterministic from the seed.
//!
//! - [`Simulation::Heat`]: a 2-D explicit heat stencil (f32, 5 points) with a
//!   few fixed hot sources on a cold plate: the warm regions grow version by
//!   version and every cell they cover changes a little at every step.
//! - [`Simulation::Labels`]: label propagation over a mesh-like graph (a 2-D
//!   grid plus a few random long edges, vertices numbered along a Z-order
//!   curve, as partitioners do); seeds spread their labels one hop per
//!   iteration, so only the frontier's vertices change. Each vertex holds
//!   `(label u32, hops u32)`.

use dckpt::error::{Error, Result};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// Which simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Simulation {
    /// 2-D heat stencil.
    Heat,
    /// Label propagation on a mesh-like graph.
    Labels,
}

impl FromStr for Simulation {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "heat" => Ok(Simulation::Heat),
            "labels" => Ok(Simulation::Labels),
            _ => Err(Error::InvalidOption(format!("unknown simulation '{s}' (expected heat or labels)"))),
        }
    }
}

/// Stencil steps between two versions of the heat simulation.
pub const HEAT_STEPS_PER_VERSION: usize = 20;
/// Propagation iterations between two versions of the label simulation.
pub const LABEL_ITERATIONS_PER_VERSION: usize = 4;

/// A running simulation whose state is the checkpointed buffer.
pub struct SimWorkload {
    state: State,
    bytes: Vec<u8>,
}

enum State {
    Heat(Heat),
    Labels(Labels),
}

impl SimWorkload {
    /// A simulation whose state takes at most `size` bytes (the grid or the
    /// graph is the largest that fits; [`SimWorkload::current`] has its length).
    pub fn new(kind: Simulation, size: usize, seed: u64) -> Result<Self> {
        let state = match kind {
            Simulation::Heat => State::Heat(Heat::new(size, seed)?),
            Simulation::Labels => State::Labels(Labels::new(size, seed)?),
        };
        let mut w = SimWorkload { state, bytes: Vec::new() };
        w.encode();
        Ok(w)
    }

    /// The state's bytes now (the first version before any `advance`).
    pub fn current(&self) -> &[u8] {
        &self.bytes
    }

    /// Runs the simulation to its next version.
    pub fn advance(&mut self) {
        match &mut self.state {
            State::Heat(h) => (0..HEAT_STEPS_PER_VERSION).for_each(|_| h.step()),
            State::Labels(l) => (0..LABEL_ITERATIONS_PER_VERSION).for_each(|_| l.step()),
        }
        self.encode();
    }

    fn encode(&mut self) {
        match &self.state {
            State::Heat(h) => {
                self.bytes.resize(h.u.len() * 4, 0);
                self.bytes.par_chunks_mut(4).zip(&h.u).for_each(|(b, v)| b.copy_from_slice(&v.to_le_bytes()));
            }
            State::Labels(l) => {
                self.bytes.resize(l.label.len() * 8, 0);
                self.bytes.par_chunks_mut(8).zip(l.label.par_iter().zip(&l.hops)).for_each(|(b, (lab, hop))| {
                    b[..4].copy_from_slice(&lab.to_le_bytes());
                    b[4..].copy_from_slice(&hop.to_le_bytes());
                });
            }
        }
    }
}

/// An `n × n` plate; `hot` marks the fixed sources.
struct Heat {
    n: usize,
    u: Vec<f32>,
    next: Vec<f32>,
    hot: Vec<bool>,
}

impl Heat {
    fn new(size: usize, seed: u64) -> Result<Self> {
        let n = ((size / 4) as f64).sqrt() as usize;
        if n < 16 {
            return Err(Error::InvalidOption(format!("a heat plate needs at least 1 KiB, not {size} bytes")));
        }
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut u = vec![0.0f32; n * n];
        let mut hot = vec![false; n * n];
        let side = (n / 64).max(2);
        for _ in 0..8 {
            let (r, c) = (rng.random_range(0..n - side), rng.random_range(0..n - side));
            let t = rng.random_range(50.0f32..100.0);
            for i in r..r + side {
                for j in c..c + side {
                    u[i * n + j] = t;
                    hot[i * n + j] = true;
                }
            }
        }
        Ok(Heat { n, next: u.clone(), u, hot })
    }

    /// One explicit step (alpha 0.2, cold fixed border).
    fn step(&mut self) {
        let n = self.n;
        let (u, hot) = (&self.u, &self.hot);
        self.next.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
            for (j, out) in row.iter_mut().enumerate() {
                let k = i * n + j;
                if hot[k] || i == 0 || j == 0 || i == n - 1 || j == n - 1 {
                    *out = u[k];
                    continue;
                }
                let lap = u[k - 1] + u[k + 1] + u[k - n] + u[k + n] - 4.0 * u[k];
                *out = u[k] + 0.2 * lap;
            }
        });
        std::mem::swap(&mut self.u, &mut self.next);
    }
}

/// A graph in CSR form; `label[v] == u32::MAX` until a seed's label reaches v.
struct Labels {
    offsets: Vec<usize>,
    edges: Vec<u32>,
    label: Vec<u32>,
    hops: Vec<u32>,
}

/// Interleaves the bits of `x` and `y` (the Z-order index of a grid cell).
fn morton(x: u32, y: u32) -> u64 {
    let spread = |v: u32| {
        let mut v = u64::from(v);
        v = (v | (v << 16)) & 0x0000_ffff_0000_ffff;
        v = (v | (v << 8)) & 0x00ff_00ff_00ff_00ff;
        v = (v | (v << 4)) & 0x0f0f_0f0f_0f0f_0f0f;
        v = (v | (v << 2)) & 0x3333_3333_3333_3333;
        (v | (v << 1)) & 0x5555_5555_5555_5555
    };
    spread(x) | (spread(y) << 1)
}

impl Labels {
    fn new(size: usize, seed: u64) -> Result<Self> {
        // The largest power-of-two side whose vertices (8 bytes each) fit.
        let mut side = 1usize;
        while 4 * side * side * 8 <= size {
            side *= 2;
        }
        if side < 8 {
            return Err(Error::InvalidOption(format!("a label graph needs at least 512 bytes, not {size}")));
        }
        let n = side * side;
        let id = |x: usize, y: usize| morton(x as u32, y as u32) as usize;
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut adj: Vec<Vec<u32>> = vec![Vec::with_capacity(4); n];
        for y in 0..side {
            for x in 0..side {
                let v = id(x, y);
                if x + 1 < side {
                    adj[v].push(id(x + 1, y) as u32);
                    adj[id(x + 1, y)].push(v as u32);
                }
                if y + 1 < side {
                    adj[v].push(id(x, y + 1) as u32);
                    adj[id(x, y + 1)].push(v as u32);
                }
            }
        }
        // A few long edges (one per 4096 vertices), as in meshes with contacts.
        for _ in 0..n / 4096 {
            let (a, b) = (rng.random_range(0..n), rng.random_range(0..n));
            adj[a].push(b as u32);
            adj[b].push(a as u32);
        }
        let mut offsets = Vec::with_capacity(n + 1);
        let mut edges = Vec::new();
        offsets.push(0);
        for a in &adj {
            edges.extend_from_slice(a);
            offsets.push(edges.len());
        }
        let mut label = vec![u32::MAX; n];
        let mut hops = vec![u32::MAX; n];
        for s in 0..16u32 {
            let v = rng.random_range(0..n);
            label[v] = s;
            hops[v] = 0;
        }
        Ok(Labels { offsets, edges, label, hops })
    }

    /// One iteration: every vertex takes the smallest label among itself and
    /// its neighbours (hops: one more than that neighbour's).
    fn step(&mut self) {
        let (offsets, edges, label, hops) = (&self.offsets, &self.edges, &self.label, &self.hops);
        let next: Vec<(u32, u32)> = (0..label.len())
            .into_par_iter()
            .map(|v| {
                let mut best = (label[v], hops[v]);
                for &w in &edges[offsets[v]..offsets[v + 1]] {
                    let w = w as usize;
                    if label[w] < best.0 {
                        best = (label[w], hops[w].saturating_add(1));
                    }
                }
                best
            })
            .collect();
        for (v, (l, h)) in next.into_iter().enumerate() {
            self.label[v] = l;
            self.hops[v] = h;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulations_are_deterministic_and_change_part_of_their_state() {
        for kind in [Simulation::Heat, Simulation::Labels] {
            let (mut a, mut b) =
                (SimWorkload::new(kind, 1 << 16, 3).unwrap(), SimWorkload::new(kind, 1 << 16, 3).unwrap());
            assert!(a.current().len() <= 1 << 16 && a.current().len() >= 1 << 13, "{kind:?}");
            let first = a.current().to_vec();
            a.advance();
            b.advance();
            assert_eq!(a.current(), b.current(), "{kind:?}: same seed, same bytes");
            let changed = a.current().iter().zip(&first).filter(|(x, y)| x != y).count();
            assert!(changed > 0 && changed < first.len() / 2, "{kind:?}: {changed} of {} bytes changed", first.len());
        }
    }

    #[test]
    fn morton_interleaves_bits() {
        assert_eq!(morton(0, 0), 0);
        assert_eq!(morton(1, 0), 1);
        assert_eq!(morton(0, 1), 2);
        assert_eq!(morton(3, 3), 15);
        assert_eq!(morton(2, 1), 6);
    }
}
