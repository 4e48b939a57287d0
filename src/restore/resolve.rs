//! Resolution: every chunk of a version traced to the stored region that
//! holds its bytes, walking the chain back to its baseline.

use super::*;

/// Resolves every chunk of `(rank, version)` to the stored bytes that hold it.
pub fn resolve(catalog: &mut Catalog, rank: u32, version: u64) -> Result<(Layout, Vec<Source>)> {
    resolve_all(catalog, rank, version).map(|r| (r.layout, r.sources))
}

/// [`resolve`], also listing the cross-rank references followed. The chunk
/// range is cut into segments that walk the chain in parallel (each claims
/// only its own chunks), so the walk scales with the cores.
pub fn resolve_all(catalog: &mut Catalog, rank: u32, version: u64) -> Result<Resolution> {
    let store = catalog.store(rank)?;
    let layout = store.layout()?;
    let chain: Vec<u64> = store
        .manifest()
        .chain(version)
        .ok_or_else(|| Error::MissingVersion { dir: store.root().to_path_buf(), rank, version })?
        .iter()
        .map(|v| v.version)
        .collect();
    {
        let _span = crate::profile::Span::new("resolve-open", version);
        catalog.preload(rank, &chain)?;
    }
    let runs_span = crate::profile::Span::new("resolve-runs", version);
    // Each version's runs, newest first, sorted by start (the files'
    // tables merged in parallel).
    let readers: Vec<&DiffReader> = chain
        .iter()
        .rev()
        .map(|&v| catalog.loaded(rank, v).ok_or_else(|| Error::Internal(format!("reader of version {v}"))))
        .collect::<Result<_>>()?;
    let walk_order: Vec<VersionRuns> = readers
        .par_iter()
        .map(|reader| {
            let diff = &reader.diff;
            // FIRST and SHIFT runs are each sorted by start and disjoint (the
            // decoder checks): merge them.
            let first = diff.first.iter().map(|r| Run { start: r.start, count: r.count, src: None, reference: None });
            let shift = diff.shift.iter().map(|s| Run {
                start: s.start,
                count: s.count,
                src: Some((s.src_rank, s.src_version, s.src_start)),
                reference: s.reference,
            });
            let mut runs = Vec::with_capacity(diff.first.len() + diff.shift.len());
            let (mut first, mut shift) = (first.peekable(), shift.peekable());
            while let Some(next) = match (first.peek(), shift.peek()) {
                (Some(a), Some(b)) if a.start < b.start => first.next(),
                (Some(_), None) => first.next(),
                _ => shift.next(),
            } {
                runs.push(next);
            }
            VersionRuns { version: reader.header.version, runs, path: std::sync::Arc::from(reader.path()) }
        })
        .collect();
    drop(runs_span);
    let _span = crate::profile::Span::new("resolve-walk", version);
    let n = layout.chunks();
    let segments = (rayon::current_num_threads() as u64 * 8).clamp(1, n);
    let walked: Vec<Walked> = (0..segments)
        .into_par_iter()
        .map(|i| {
            let mut w = walk(&walk_order, rank, (n * i / segments)..(n * (i + 1) / segments));
            // In destination order within the segment (a sorted run per
            // version: a stable sort merges them); the segments follow
            // one another, so their concatenation is sorted too.
            w.sources.sort_by_key(|s| s.dst);
            w
        })
        .collect();
    if let Some(gap) = walked.iter().find_map(|w| w.unresolved.clone()) {
        let path = catalog.store(rank)?.diff_path(chain[0]);
        return Err(Error::corrupt(
            path,
            format!("chunks {}..{} are stored in no version of the chain", gap.start, gap.end),
        ));
    }
    // The chunks each reference run gave, summed over the segments (a run
    // crossing a segment's end is claimed by both): every claim, sorted by
    // run (in parallel: a shared base makes hundreds of thousands), then
    // the claims of one run added up.
    let mut claims = concat_parallel(&walked, |w| &w.reference_claims);
    claims.par_sort_unstable_by_key(|c| c.0);
    claims.dedup_by(|later, first| {
        let same = later.0 == first.0;
        if same {
            first.1 += later.1;
        }
        same
    });
    let sources = concat_parallel(&walked, |w| &w.sources);
    crate::memory::drop_later(walked);
    let references: Vec<UsedReference> = claims
        .par_iter()
        .filter_map(|&((vi, j), claimed)| {
            let vr = &walk_order[vi];
            let run = vr.runs[j];
            let (owner, ver, src) = run.src?;
            Some(UsedReference {
                dst: run.start,
                count: run.count,
                owner,
                version: ver,
                src,
                digest: run.reference?,
                whole: claimed == run.count,
                path: vr.path.clone(),
            })
        })
        .collect();
    // The chain's run lists (hundreds of MB for a long chain of a large
    // buffer) are freed off the restore's path.
    crate::memory::drop_later(walk_order);
    Ok(Resolution { layout, sources, references })
}

/// One version's runs as the walk sees them.
pub(super) struct VersionRuns {
    version: u64,
    runs: Vec<Run>,
    path: std::sync::Arc<Path>,
}

/// What walking one segment found.
pub(super) struct Walked {
    sources: Vec<Source>,
    /// Chunks claimed through each cross-rank reference run `(version index, run index)`.
    reference_claims: Vec<((usize, usize), u64)>,
    /// The first chunks no version stores, if any.
    unresolved: Option<Range<u64>>,
}

/// Resolves the chunks of `segment`: newest version first, each version's
/// runs claim the chunks still unresolved (FIXED chunks fall through).
pub(super) fn walk(versions: &[VersionRuns], rank: u32, segment: Range<u64>) -> Walked {
    let mut out = Walked { sources: Vec::new(), reference_claims: Vec::new(), unresolved: None };
    let mut unresolved: Vec<Range<u64>> = if segment.is_empty() { Vec::new() } else { vec![segment.clone()] };
    for (vi, vr) in versions.iter().enumerate() {
        if unresolved.is_empty() {
            break;
        }
        let runs = &vr.runs;
        let mut still = Vec::new();
        let mut k = runs.partition_point(|r| r.start + r.count <= segment.start);
        for gap in unresolved {
            let mut at = gap.start;
            while k < runs.len() && runs[k].start + runs[k].count <= at {
                k += 1;
            }
            let mut j = k;
            while at < gap.end {
                match runs.get(j) {
                    Some(run) if run.start < gap.end => {
                        if run.start > at {
                            still.push(at..run.start);
                            at = run.start;
                        }
                        let end = (run.start + run.count).min(gap.end);
                        let (srank, sver, sstart) = run.src.unwrap_or((rank, vr.version, run.start));
                        out.sources.push(Source {
                            dst: at,
                            count: end - at,
                            rank: srank,
                            version: sver,
                            src: sstart + (at - run.start),
                        });
                        if run.reference.is_some() {
                            out.reference_claims.push(((vi, j), end - at));
                        }
                        at = end;
                        j += 1;
                    }
                    _ => {
                        still.push(at..gap.end);
                        at = gap.end;
                    }
                }
            }
            k = j.saturating_sub(1);
        }
        unresolved = still;
    }
    out.unresolved = unresolved.into_iter().next();
    out
}

/// The concatenation of `parts`' lists, written by every core (joining
/// them one after another was one core copying, and faulting in, hundreds
/// of MB at 4 GiB).
pub(super) fn concat_parallel<P: Sync, T: Copy + Send + Sync>(parts: &[P], list: impl Fn(&P) -> &[T] + Sync) -> Vec<T> {
    let mut starts = Vec::with_capacity(parts.len() + 1);
    let mut total = 0usize;
    for p in parts {
        starts.push(total);
        total += list(p).len();
    }
    starts.push(total);
    (0..total)
        .into_par_iter()
        .with_min_len(1 << 14)
        .map_init(
            || 0usize,
            |part, i| {
                // Indices come in runs: the part of the previous one, mostly.
                if !(starts[*part] <= i && i < starts[*part + 1]) {
                    *part = starts.partition_point(|&s| s <= i) - 1;
                }
                list(&parts[*part])[i - starts[*part]]
            },
        )
        .collect()
}

/// Checks each followed cross-rank reference against its region digest:
/// restored bytes that came wholly from it are hashed in `out`, the others
/// are read from the owner again (through its verified blocks), both in
/// parallel: with a shared base most of a buffer is references. A mismatch
/// is an error (the first reference in order that fails), never other bytes.
pub fn check_references(
    catalog: &mut Catalog,
    rank: u32,
    layout: &Layout,
    refs: &[UsedReference],
    out: Option<&[u8]>,
) -> Result<()> {
    use rayon::prelude::*;
    let (hash, cs) = {
        let m = catalog.store(rank)?.manifest();
        (m.hash, m.chunk_size)
    };
    // Whether each reference matched: restored bytes hashed where it was
    // whole, the rest owner file by owner file (each opened once), in
    // parallel within one. One byte a reference (there are hundreds of
    // thousands with a shared base); an owner that cannot be read keeps its
    // error apart.
    const UNCHECKED: u8 = 0;
    const MATCHED: u8 = 1;
    const MISMATCHED: u8 = 2;
    const UNREADABLE: u8 = 3;
    let verdict = |ok: bool| if ok { MATCHED } else { MISMATCHED };
    let mut state: Vec<u8> = refs
        .par_iter()
        .with_min_len(256)
        .map(|r| match out.filter(|_| r.whole) {
            Some(out) => {
                let b = layout.chunk_bytes(r.dst..r.dst + r.count);
                verdict(subtree_digest(hash, cs, &out[b.start as usize..b.end as usize]) == r.digest)
            }
            None => UNCHECKED,
        })
        .collect();
    let mut by_file: std::collections::BTreeMap<(u32, u64), Vec<usize>> = std::collections::BTreeMap::new();
    for (i, r) in refs.iter().enumerate().filter(|(i, _)| state[*i] == UNCHECKED) {
        by_file.entry((r.owner, r.version)).or_default().push(i);
    }
    let mut unreadable: std::collections::HashMap<usize, Error> = std::collections::HashMap::new();
    for ((owner, version), indices) in by_file {
        let reader = match owner_reader(catalog, rank, owner, version) {
            Ok(reader) => reader,
            Err(e) => {
                // The file's first reference carries the error (its others come later).
                indices.iter().for_each(|&i| state[i] = UNREADABLE);
                unreadable.insert(indices[0], e);
                continue;
            }
        };
        let results: Vec<Result<bool>> = indices
            .par_iter()
            .map(|&i| {
                let r = &refs[i];
                Ok(subtree_digest(hash, cs, &reader.read_chunks(r.src..r.src + r.count)?) == r.digest)
            })
            .collect();
        for (i, result) in indices.into_iter().zip(results) {
            match result {
                Ok(ok) => state[i] = verdict(ok),
                Err(e) => {
                    state[i] = UNREADABLE;
                    unreadable.insert(i, e);
                }
            }
        }
    }
    // The first reference in order that fails names the error.
    if let Some(i) = state.iter().position(|&s| s != MATCHED) {
        let r = &refs[i];
        return Err(match state[i] {
            UNREADABLE => unreadable.remove(&i).unwrap_or_else(|| Error::Internal("an owner's error lost".into())),
            UNCHECKED => Error::Internal("a reference left unchecked".into()),
            _ => Error::BrokenReference {
                path: r.path.to_path_buf(),
                reason: format!(
                    "chunks {}..+{} reference bytes of rank {} version {} that do not match the region's digest",
                    r.dst, r.count, r.owner, r.version
                ),
            },
        });
    }
    Ok(())
}
