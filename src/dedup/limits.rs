//! Bounds on what one version may need from a bounded de-duplication state
//! (the CUDA backend's device-memory budget, `backend::budget`), and the
//! rule that turns them into a diff: the same rule on the CPU and the GPU,
//! so that both write the same files under the same bounds.
//!
//! A version that would overfill the record first forgets the record (it
//! de-duplicates against the previous version's leaves and against itself
//! only, and the record restarts with its own entries); a version whose
//! own entries, regions or file still exceed a bound is stored whole (as a
//! dense version: a baseline, the record restarts empty). Bytes are never
//! dropped: a bound costs de-duplication, and [`BoundsHit`] reports it.

use serde::Serialize;

/// The bounds one version is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Limits {
    /// Most entries the record may hold after a version.
    pub record_entries: u64,
    /// Most regions (subtree roots before coalescing) a version may have.
    pub roots: u64,
    /// Most bytes of a version's file before its trailer, as a device
    /// writes it before the encoder's fold (every coalesced run of plain
    /// roots an entry, and every repeat node:
    /// `format::diff_file::device_file_len`).
    pub file_prefix: u64,
}

impl Limits {
    /// No bounds (the CPU engine's default).
    pub const UNLIMITED: Limits = Limits { record_entries: u64::MAX, roots: u64::MAX, file_prefix: u64::MAX };

    /// Whether a record of `entries` entries overfills.
    pub fn record_overflows(&self, entries: u64) -> bool {
        entries > self.record_entries
    }

    /// Whether a version of `roots` regions and a file of `file_len` bytes
    /// (trailer included) must be stored whole.
    pub fn must_store_whole(&self, roots: u64, file_len: u64) -> bool {
        roots > self.roots || file_len.saturating_sub(32) > self.file_prefix
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits::UNLIMITED
    }
}

/// What the bounds cost so far: versions that restarted the record, and
/// versions stored whole because of a bound (not because most chunks changed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BoundsHit {
    /// Versions that forgot the record because it would have overfilled.
    pub record_restarts: u64,
    /// Versions stored whole because a bound was exceeded.
    pub stored_whole: u64,
}
