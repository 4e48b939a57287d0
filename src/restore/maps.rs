//! Where a version's chunks are stored: sources coalesced into runs, and
//! the map a rebuild reads (made later, by whoever needs it).

use super::*;

impl StoredMap {
    /// The map of a restore's resolution, each rank's layout read through
    /// `catalog` (which the restore opened them in).
    pub fn of(catalog: &mut Catalog, sources: Vec<Source>) -> Result<Self> {
        PendingMap::of(catalog, sources).map(PendingMap::make)
    }
}

impl PendingMap {
    /// `sources` with their ranks' layouts, read through `catalog` (which
    /// the restore opened them in).
    pub fn of(catalog: &mut Catalog, sources: Vec<Source>) -> Result<Self> {
        // The ranks, found by every core (sources come in long stretches of
        // one rank: look up only changes).
        let ranks = sources
            .par_chunks(COALESCE_PART)
            .map(|part| {
                let (mut ranks, mut last) = (std::collections::HashSet::new(), None);
                for s in part {
                    if last != Some(s.rank) {
                        ranks.insert(s.rank);
                        last = Some(s.rank);
                    }
                }
                ranks
            })
            .reduce(std::collections::HashSet::new, |mut a, b| {
                a.extend(b);
                a
            });
        let mut layouts = HashMap::new();
        for rank in ranks {
            layouts.insert(rank, catalog.store(rank)?.layout()?);
        }
        Ok(PendingMap { sources, layouts })
    }

    /// The map: the sources coalesced.
    pub fn make(self) -> StoredMap {
        StoredMap { runs: coalesce(self.sources), layouts: self.layouts }
    }

    /// Lets the sources go without making the map (freed on another
    /// thread: they may take hundreds of megabytes).
    pub fn discard(self) {
        crate::memory::drop_later(self.sources);
    }
}

/// Sources one task of [`coalesce`] (and of [`StoredMap::of`]) handles.
pub(super) const COALESCE_PART: usize = 1 << 16;

/// Whether `next` continues `last` in the same file.
pub(super) fn continues(last: &Source, next: &Source) -> bool {
    last.rank == next.rank
        && last.version == next.version
        && last.dst + last.count == next.dst
        && last.src + last.count == next.src
}

/// `sources` with neighbours that continue each other merged.
pub(super) fn coalesce_slice(sources: &[Source]) -> Vec<Source> {
    let mut out: Vec<Source> = Vec::with_capacity(sources.len());
    for s in sources {
        match out.last_mut() {
            Some(last) if continues(last, s) => last.count += s.count,
            _ => out.push(*s),
        }
    }
    out
}

/// Merges neighbouring pieces that continue each other in the same file:
/// parts of the list merged by every core, then the seams between them.
pub(crate) fn coalesce(sources: Vec<Source>) -> Vec<Source> {
    if sources.len() <= COALESCE_PART {
        return coalesce_slice(&sources);
    }
    let mut parts: Vec<Vec<Source>> = sources.par_chunks(COALESCE_PART).map(coalesce_slice).collect();
    crate::memory::drop_later(sources);
    // A part's first source may continue the last one kept before it (a
    // part merged whole into the one before leaves that one the last).
    let mut skip = vec![0usize; parts.len()];
    let mut last: Option<(usize, usize)> = None;
    for p in 0..parts.len() {
        if let (Some((lp, li)), Some(&first)) = (last, parts[p].first()) {
            let kept = &mut parts[lp][li];
            if continues(kept, &first) {
                kept.count += first.count;
                skip[p] = 1;
            }
        }
        if parts[p].len() > skip[p] {
            last = Some((p, parts[p].len() - 1));
        }
    }
    let views: Vec<&[Source]> = parts.iter().zip(&skip).map(|(p, &k)| &p[k..]).collect();
    let out = concat_parallel(&views, |v| v);
    crate::memory::drop_later(parts);
    out
}
