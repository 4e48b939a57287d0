//! The single-rank checkpoint engine: de-duplicate, serialize, commit, and
//! only then remember. Reopening a store continues its history.

use crate::dedup::{DedupInput, DedupState};
use crate::diff::ChunkCounts;
use crate::format::{diff_file::encode_diff, record_file};
use crate::restore;
use crate::store::{Store, StoreOptions};
use crate::{Error, Result};
use std::path::Path;
use std::time::Instant;

/// What one checkpoint did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CheckpointReport {
    /// Version written.
    pub version: u64,
    /// Whether it is a baseline.
    pub baseline: bool,
    /// Chunks by label.
    pub counts: ChunkCounts,
    /// FIRST table entries (or bitmap runs).
    pub first_regions: usize,
    /// SHIFT table entries.
    pub shift_regions: usize,
    /// Bytes of the protected buffer.
    pub logical_bytes: u64,
    /// Bytes of the diff file.
    pub file_bytes: u64,
    /// Bytes of the file that are not FIRST data.
    pub metadata_bytes: u64,
    /// Entries now in the record.
    pub record_entries: usize,
    /// Seconds spent de-duplicating and serializing.
    pub dedup_seconds: f64,
    /// Seconds spent writing and committing.
    pub write_seconds: f64,
}

/// A rank's checkpointing engine over a [`Store`].
pub struct Engine {
    store: Store,
    state: DedupState,
    opts: StoreOptions,
}

impl Engine {
    /// Opens (or creates) the store of `rank` under `root` for a buffer of
    /// `data_len` bytes. An existing store continues its history: the record
    /// is reloaded from the segments of the current chain and the previous
    /// leaves are re-hashed from a restore of the latest version.
    pub fn open_or_create(root: &Path, rank: u32, data_len: u64, opts: &StoreOptions) -> Result<Self> {
        let store = Store::open_or_create(root, rank, data_len, opts)?;
        let layout = store.layout()?;
        let mut state = DedupState::new(layout, opts.hash, rank);
        if let Some(latest) = store.manifest().latest().map(|v| v.version) {
            if opts.method.uses_record() {
                let chain = store.manifest().chain(latest).unwrap_or(&[]).to_vec();
                for v in chain {
                    let path = store.record_path(v.version);
                    let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
                    record_file::decode_into(&bytes, &path, rank, v.version, &mut state.record)?;
                }
            }
            if opts.method.uses_previous() {
                let data = restore::restore_version(root, rank, latest)?;
                let leaves = crate::dedup::hash_leaves(&data, layout, opts.hash, None);
                state.previous = Some(leaves.into_iter().map(|(_, d)| d).collect());
            }
        }
        Ok(Engine { store, state, opts: opts.clone() })
    }

    /// The underlying store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The de-duplication state.
    pub fn state(&self) -> &DedupState {
        &self.state
    }

    /// Whether the next checkpoint must be a baseline.
    fn next_is_baseline(&self) -> bool {
        let m = self.store.manifest();
        let Some(latest) = m.latest() else { return true };
        let chain_len = m.chain(latest.version).map_or(0, <[_]>::len) as u64;
        self.opts.max_chain.is_some_and(|max| chain_len >= max.max(1))
            || self.opts.max_record_entries.is_some_and(|max| self.state.record.len() as u64 > max)
    }

    /// Takes checkpoint `version` of `data`. On error nothing is committed
    /// and the engine's state is unchanged.
    pub fn checkpoint(&mut self, version: u64, data: &[u8]) -> Result<CheckpointReport> {
        if let Some(latest) = self.store.manifest().latest()
            && latest.version >= version
        {
            return Err(Error::VersionNotNewer { latest: latest.version, requested: version });
        }
        let t0 = Instant::now();
        let input = DedupInput { data, version, baseline: self.next_is_baseline() };
        let outcome = self.opts.method.deduplicator().deduplicate(&self.state, &input)?;
        let file = encode_diff(&outcome.diff, data);
        let entries = outcome.pending_entries();
        let rec = record_file::encode(self.state.rank, version, &entries);
        let t1 = Instant::now();
        let baseline = outcome.diff.baseline;
        self.store.commit(version, baseline, &file, &rec, entries.len() as u64)?;
        let t2 = Instant::now();
        let diff = &outcome.diff;
        let report = CheckpointReport {
            version,
            baseline,
            counts: diff.counts(),
            first_regions: diff.first.len(),
            shift_regions: diff.shift.len(),
            logical_bytes: data.len() as u64,
            file_bytes: file.len() as u64,
            metadata_bytes: file.len() as u64 - diff.data_bytes(),
            record_entries: 0,
            dedup_seconds: (t1 - t0).as_secs_f64(),
            write_seconds: (t2 - t1).as_secs_f64(),
        };
        self.state.commit(outcome.pending);
        Ok(CheckpointReport { record_entries: self.state.record.len(), ..report })
    }
}
