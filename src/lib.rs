//! # dckpt — frequent, small, collective checkpoints
//!
//! dckpt splits a protected buffer into small chunks, hashes them, and stores
//! only what the rank has never stored before, described by a compact set of
//! Merkle-tree regions (Tan et al., ICPP'23). Each checkpoint becomes one
//! self-checking diff file; any version restores byte-exactly by reading each
//! needed byte once.
//!
//! The crate is layered so that each module has one job:
//!
//! | module | job |
//! |---|---|
//! | [`hash`] | 128-bit chunk and node digests (Murmur3, XXH3, BLAKE3, SHA-1) |
//! | [`layout`] | the Merkle tree shape over `n` chunks (every node a contiguous range) |
//! | [`memory`] | what a checkpoint protects: host bytes or a device region the application owns |
//! | [`record`] | the historical record: digest → where its bytes were first stored |
//! | [`regions`] | a diff's regions and the rewrite that gives some to other ranks |
//! | [`dedup`] | the methods Full, Basic, List and Tree (the CPU engine) |
//! | [`diff`] | the in-memory result of one de-duplication |
//! | [`format`](mod@format) | the on-disk diff file and manifest codecs (bounds-checked) |
//! | [`storage`] | the storage contract (durable atomic write, read at offset, list, remove, barrier, lock) and its POSIX implementation |
//! | [`store`] | a rank's directory: writer lock, atomic commits, manifest, collective commit records |
//! | [`repair`] | `dckpt repair`: remove what no committed version needs, delist what no longer restores |
//! | [`backend`] | where de-duplication runs (CPU, CUDA) behind one [`backend::Backend`] contract |
//! | [`prune`] | `dckpt prune`: delete the versions no kept version needs |
//! | [`engine`] | checkpoint = dedup + write + commit, keeping the state between versions |
//! | [`tiers`] | asynchronous multi-level checkpoints: host cache, local and shared directories, background flush |
//! | [`restore`] | chain resolution and byte-exact reconstruction |
//! | [`shm`] | host memory in shared-memory files that outlive the process (the agent's cache segments) |
//! | [`agent`] | the per-node agent that finishes the flushes of killed ranks |
//! | [`verify`] | whole-store integrity and reference checks |
//! | [`inspect`] | per-version statistics |
//! | [`collective`] | collective de-duplication across ranks (feature `mpi`) |
//! | [`runtime`] | the application runtime, `Runtime` (feature `mpi`), and the C ABI in [`ffi`] |
//!
//! The benchmarks and workload generators (`dckpt bench*`, `dckpt gen`) are
//! modules of the `dckpt` binary, not of this library.
//!
//! ```
//! use dckpt::{Engine, StoreOptions, Method, HashAlgo};
//! let dir = tempfile::tempdir().unwrap();
//! let opts = StoreOptions { chunk_size: 64, method: Method::Tree, hash: HashAlgo::Murmur3, ..StoreOptions::default() };
//! let mut data = vec![7u8; 4096];
//! let mut engine = Engine::open_or_create(dir.path(), 0, data.len() as u64, &opts).unwrap();
//! engine.checkpoint(1, &data).unwrap();
//! data[100] = 42;
//! engine.checkpoint(2, &data).unwrap();
//! let restored = dckpt::restore::restore_version(dir.path(), 0, 2).unwrap();
//! assert_eq!(restored, data);
//! ```

pub mod agent;
pub mod backend;
pub mod collective;
pub mod config;
pub mod cpus;
pub mod dedup;
pub mod diff;
pub mod engine;
pub mod error;
pub mod failpoint;
#[cfg(feature = "mpi")]
pub mod ffi;
pub mod format;
pub mod halt;
pub mod hash;
pub mod inspect;
pub mod layout;
pub mod log;
pub mod memory;
pub mod method;
pub mod profile;
pub mod prune;
pub mod record;
pub mod redundancy;
pub mod regions;
pub mod repair;
pub mod restore;
pub mod runtime;
pub mod shm;
pub mod sizes;
pub mod storage;
pub mod store;
pub mod sync;
pub mod tiers;
pub mod verify;

pub use engine::Engine;
pub use error::{Error, ErrorKind, Result};
pub use hash::{Digest, HashAlgo};
pub use method::Method;
pub use store::StoreOptions;
