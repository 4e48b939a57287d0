//! The benchmarks and the workload generators: the top floor, over the
//! library's public API only. They live in the binary (`dckpt bench*`,
//! `dckpt gen`, `dckpt study-compression`), not in the library that
//! applications link.
//!
//! - [`generate`], [`simulate`]: the synthetic and simulation-like evolving
//!   buffers every benchmark runs on (also included by `benches/`);
//! - [`methods`]: `dckpt bench`, the in-memory methods;
//! - [`kernels`]: `dckpt bench --backend cuda`, the GPU pipeline alone;
//! - [`e2e`]: `dckpt bench --e2e [--tiered CACHE]`, through the store and the tiers;
//! - [`rtm`]: `dckpt bench-rtm`, an adjoint run with restores;
//! - [`compression`]: `dckpt bench-compression`;
//! - [`collective`]: `dckpt bench-collective` (feature `mpi`);
//! - [`runtime`]: `dckpt bench-runtime`, the `Runtime` under `mpirun` (feature `mpi`).

#[cfg(feature = "mpi")]
pub mod collective;
pub mod compression;
pub mod e2e;
pub mod generate;
#[cfg(test)]
mod generate_tests;
pub mod kernels;
pub mod methods;
pub mod rtm;
#[cfg(feature = "mpi")]
pub mod runtime;
pub mod simulate;
