//! One rank's side of a collective checkpoint, without the transport: what
//! it offers to the reduction ([`offer`]) and how it settles once the merged
//! set is known ([`settle`]). The MPI layer calls these around the
//! reduction; tests drive several in-process ranks with
//! [`reduce_all`](super::reduce_all) instead.

use super::merge::{HashFreq, local_set};
use super::regions::{self, Conversion, Region};
use crate::Result;
use crate::engine::{Engine, LocalCheckpoint, StagedCheckpoint};
use crate::layout::Layout;
use crate::memory::Protected;

/// A rank's de-duplicated version and the regions it offers.
#[derive(Debug)]
pub struct Offer {
    /// The local diff, not yet written.
    pub local: LocalCheckpoint,
    /// Its FIRST regions.
    pub regions: Vec<Region>,
    /// The tuple set sent to the reduction (at most `threshold` entries).
    pub set: Vec<HashFreq>,
}

/// De-duplicates `input` locally (CPU or GPU) and builds the rank's tuple set.
pub fn offer(
    engine: &mut Engine,
    version: u64,
    input: Protected<'_>,
    max_level: u32,
    threshold: usize,
) -> Result<Offer> {
    let local = engine.deduplicate_local(version, input)?;
    let regions = engine.regions(&local, input.host_bytes(), max_level)?;
    Ok(offer_of(local, regions, threshold))
}

/// The offer of a version already de-duplicated (by the engine or by the
/// asynchronous tiers) whose FIRST `regions` are known.
pub fn offer_of(local: LocalCheckpoint, regions: Vec<Region>, threshold: usize) -> Offer {
    let rank = local.diff().rank;
    let set = local_set(rank, regions.iter().map(|r| (r.digest, r.bytes, r.node)), threshold);
    Offer { local, regions, set }
}

/// Applies the merged set: the regions other ranks own become references
/// (and the record follows), then the files are written, still invisible.
/// `layouts[r]` is rank `r`'s layout; `data` is the protected buffer (CPU;
/// the GPU ignores it).
pub fn settle(
    engine: &mut Engine,
    offer: Offer,
    merged: &[HashFreq],
    layouts: &[Layout],
    data: &[u8],
) -> Result<(StagedCheckpoint, Vec<Conversion>)> {
    let (local, conv) = give_away(offer, merged, layouts)?;
    Ok((engine.stage(local, data)?, conv))
}

/// Applies the merged set to the version alone: the regions other ranks
/// own become references (and the record follows). The caller writes it.
pub fn give_away(offer: Offer, merged: &[HashFreq], layouts: &[Layout]) -> Result<(LocalCheckpoint, Vec<Conversion>)> {
    let Offer { mut local, regions, .. } = offer;
    let conv = regions::conversions(local.diff().rank, &regions, merged, layouts);
    local.give_away(&conv, layouts)?;
    Ok((local, conv))
}
