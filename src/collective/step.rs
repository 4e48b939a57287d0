//! One rank's side of a collective checkpoint over the synchronous
//! [`Engine`], without the transport: what it offers to the reduction
//! ([`offer`]) and how it settles once the merged set is known
//! ([`give_away`], [`settle`]). Tests and benchmarks drive several
//! in-process engines with [`reduce_all`](super::reduce_all) around these;
//! the MPI driver runs its step on the tiers
//! (`collective::background::run_step`).

use super::merge::{HashFreq, local_set};
use super::regions::{self, Conversion, Region};
use crate::engine::{Engine, LocalCheckpoint, StagedCheckpoint};
use crate::error::Result;
use crate::layout::Layout;
use crate::memory::Protected;

/// A rank's de-duplicated version and the regions it offers.
#[derive(Debug)]
pub struct Offer<'a> {
    /// The local diff, not yet written (borrowing the protected memory).
    pub local: LocalCheckpoint<'a>,
    /// Its FIRST regions.
    pub regions: Vec<Region>,
    /// The tuple set sent to the reduction (at most `threshold` entries).
    pub set: Vec<HashFreq>,
    /// Seconds finding the regions and their digests.
    pub regions_seconds: f64,
}

/// De-duplicates `input` locally (CPU or GPU) and builds the rank's tuple set.
pub fn offer<'a>(
    engine: &mut Engine,
    version: u64,
    input: Protected<'a>,
    max_level: u32,
    threshold: usize,
) -> Result<Offer<'a>> {
    let local = {
        let _span = crate::profile::Span::new("dedup-local", version);
        engine.deduplicate_local(version, input)?
    };
    let t = std::time::Instant::now();
    let regions = {
        let _span = crate::profile::Span::new("regions", version);
        engine.regions(&local, input.host_bytes(), max_level)?
    };
    let mut offer = offer_of(local, regions, threshold);
    offer.regions_seconds = t.elapsed().as_secs_f64();
    Ok(offer)
}

impl<'a> Offer<'a> {
    /// The offer without its regions smaller than `min_bytes` (they stay
    /// this rank's, outside the reduction), its tuple set rebuilt.
    pub fn without_regions_below(self, min_bytes: u64, threshold: usize) -> Offer<'a> {
        if min_bytes == 0 {
            return self;
        }
        let Offer { local, mut regions, regions_seconds, .. } = self;
        let set = tuple_set(local.diff().rank, &mut regions, min_bytes, threshold);
        Offer { local, regions, set, regions_seconds }
    }
}

/// The offer of a version already de-duplicated (by the engine or by the
/// asynchronous tiers) whose FIRST `regions` are known.
pub fn offer_of(local: LocalCheckpoint<'_>, mut regions: Vec<Region>, threshold: usize) -> Offer<'_> {
    let set = tuple_set(local.diff().rank, &mut regions, 0, threshold);
    Offer { local, regions, set, regions_seconds: 0.0 }
}

/// The tuple set `rank` sends to the reduction for its FIRST `regions`,
/// once the regions smaller than `min_bytes` are dropped from them (they
/// stay this rank's, outside the reduction; 0 keeps every one). The same
/// in the call and on the collective step's thread.
pub fn tuple_set(rank: u32, regions: &mut Vec<Region>, min_bytes: u64, threshold: usize) -> Vec<HashFreq> {
    regions.retain(|r| r.bytes >= min_bytes);
    local_set(rank, regions.iter().map(|r| (r.digest, r.bytes, r.node)), threshold)
}

/// Applies the merged set: the regions other ranks own become references
/// (and the record follows), then the files are written, still invisible.
/// `layouts[r]` is rank `r`'s layout; `data` is the protected buffer (CPU;
/// the GPU ignores it).
pub fn settle(
    engine: &mut Engine,
    offer: Offer<'_>,
    merged: &[HashFreq],
    layouts: &[Layout],
    data: &[u8],
) -> Result<(StagedCheckpoint, Vec<Conversion>)> {
    let (local, conv) = give_away(offer, merged, layouts)?;
    Ok((engine.stage(local, data)?, conv))
}

/// Applies the merged set to the version alone: the regions other ranks
/// own become references (and the record follows). The caller writes it.
pub fn give_away<'a>(
    offer: Offer<'a>,
    merged: &[HashFreq],
    layouts: &[Layout],
) -> Result<(LocalCheckpoint<'a>, Vec<Conversion>)> {
    let Offer { mut local, regions, .. } = offer;
    let conv = regions::conversions(local.diff().rank, &regions, merged, layouts);
    local.give_away(&conv, layouts)?;
    Ok((local, conv))
}
