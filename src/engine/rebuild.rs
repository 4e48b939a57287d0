//! Reopening a store: the de-duplication state is rebuilt from the latest
//! committed version, which a restart restores anyway, instead of being
//! persisted beside the diffs.
//!
//! The latest version is restored (every byte verified, every cross-rank
//! reference checked) and hashed: its leaf digests are the "previous"
//! leaves, and the record holds what a baseline checkpoint of it would
//! insert — the first occurrence of each leaf digest (List, Tree) and every
//! inner node whose leaves are all first occurrences (Tree) — each moved to
//! where its bytes are physically stored: the restore's resolution maps
//! every chunk to a FIRST run of some version of some rank (the owner's copy
//! in a collective store). An inner node is kept only when all its chunks
//! sit contiguously in one file at an aligned node of the same shape there;
//! a leaf always is. On the CPU this is built in bulk (parallel hashing,
//! stable parallel sorts); the GPU backend runs its baseline pipeline over
//! the restored bytes and moves the table's entries with one kernel
//! (`table_locate`, the same rule), so both continue from the same record.
//!
//! What a rebuilt record cannot find: content that older versions of the
//! chain stored but the latest version no longer holds (an uninterrupted
//! run still remembers it), and inner nodes whose bytes are spread over
//! several files or shifted off node alignment (their leaves are found).
//! Both cost stored bytes, never correctness; BENCHMARKS.md measures it.

use crate::error::Result;
use crate::layout::Layout;
use crate::restore::{self, Catalog, PendingMap};
use crate::store::StoreOptions;
use std::path::Path;
use std::time::Instant;

pub use crate::backend::rebuild::{Rebuilt, rebuilt_from};

/// The latest version restored, with where each of its chunks is stored.
#[derive(Debug)]
pub struct Restored {
    /// Its bytes.
    pub data: Vec<u8>,
    /// Where its chunks are stored (the map still to be made).
    pub map: PendingMap,
    /// Seconds the restore took.
    pub seconds: f64,
}

/// Restores committed version `latest` of `rank` (every block verified,
/// every cross-rank reference checked) and resolves where its chunks live.
pub fn restore_latest(root: &Path, rank: u32, latest: u64) -> Result<Restored> {
    let t0 = Instant::now();
    let mut catalog = Catalog::new(root);
    let (data, _stats, res) = restore::restore_in(&mut catalog, rank, latest)?;
    let map = PendingMap::of(&mut catalog, res.sources)?;
    Ok(Restored { data, map, seconds: t0.elapsed().as_secs_f64() })
}

/// Rebuilds the CPU state of `rank` from its committed version `latest`.
pub fn rebuild_state(root: &Path, rank: u32, latest: u64, layout: Layout, opts: &StoreOptions) -> Result<Rebuilt> {
    let restored = restore_latest(root, rank, latest)?;
    let mut rebuilt = rebuilt_from(&restored.data, &restored.map.make(), layout, opts.method, opts.hash);
    rebuilt.restore_seconds = restored.seconds;
    Ok(rebuilt)
}
