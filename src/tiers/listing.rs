//! How a flush lists a version once its file is durable on a tier: the
//! rank's manifest, or its commit part of a collective version. The flush
//! workers and the agent's journal (which finishes a dead rank's flushes the
//! same way) both name it.

/// How a worker lists a version once its file is durable on its tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Listing {
    /// In the rank's manifest: committed at once (a single rank).
    Manifest,
    /// As this rank's commit part of a collective version of `ranks` ranks.
    Part {
        /// This rank.
        rank: u32,
        /// Ranks taking part.
        ranks: u32,
    },
}
