//! Finishing a dead rank's flushes from its journal: each version the
//! journal names, on each tier that has not settled it, written as the rank
//! kept it and listed as the rank would have (its manifest, or its commit
//! part), in version order so that no chain is listed with a hole.

use crate::error::{Error, Result};
use crate::shm::ShmView;
use crate::store::StoreWriter;
use crate::tiers::journal::{JournalEntry, JournalMeta, entry_version};
use crate::tiers::{CacheWrite, FileBytes, list_written, write_cached, write_copied};
use std::path::Path;

/// What finishing one journal did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Finished {
    /// The rank.
    pub rank: u32,
    /// The versions made durable: version and tier.
    pub written: Vec<(u64, String)>,
    /// The versions that could not be: version, tier and why.
    pub failed: Vec<(u64, String, String)>,
}

/// A dead rank's cached file, its segments mapped again.
struct MappedFile {
    views: Vec<ShmView>,
    len: usize,
}

impl MappedFile {
    fn open(dir: &Path, e: &JournalEntry) -> Result<Self> {
        let seg = usize::try_from(e.segment_len).map_err(|_| Error::corrupt(dir, "a segment length"))?;
        let len = usize::try_from(e.len).map_err(|_| Error::corrupt(dir, "a file length"))?;
        if seg == 0 || e.segments.len() != len.div_ceil(seg).max(1) {
            return Err(Error::corrupt(dir, format!("version {}: segments do not cover the file", e.version)));
        }
        let views = e
            .segments
            .iter()
            .map(|name| {
                if name.contains('/') || name.starts_with('.') {
                    return Err(Error::corrupt(dir, format!("a segment name {name:?}")));
                }
                ShmView::open(&dir.join(name), seg)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(MappedFile { views, len })
    }

    fn seg(&self) -> usize {
        self.views.first().map_or(1, |v| v.bytes().len())
    }
}

impl FileBytes for MappedFile {
    fn len(&self) -> usize {
        self.len
    }

    fn read_at(&self, offset: usize, buf: &mut [u8]) -> Option<()> {
        if offset.checked_add(buf.len())? > self.len {
            return None;
        }
        let seg = self.seg();
        let mut at = offset;
        let mut done = 0;
        while done < buf.len() {
            let bytes = self.views.get(at / seg)?.bytes();
            let from = at % seg;
            let n = (buf.len() - done).min(seg - from);
            buf[done..done + n].copy_from_slice(bytes.get(from..from + n)?);
            done += n;
            at += n;
        }
        Some(())
    }

    fn pieces(&self) -> Vec<&[u8]> {
        let mut left = self.len;
        self.views
            .iter()
            .map(|v| {
                let n = left.min(v.bytes().len());
                left -= n;
                &v.bytes()[..n]
            })
            .collect()
    }
}

/// Reads a journal directory: its meta and its entries, oldest first.
pub fn read_journal(dir: &Path) -> Result<(JournalMeta, Vec<JournalEntry>)> {
    let meta_path = dir.join("meta.json");
    let bytes = std::fs::read(&meta_path).map_err(|e| Error::io(&meta_path, e))?;
    let meta: JournalMeta = serde_json::from_slice(&bytes).map_err(|e| Error::corrupt(&meta_path, e.to_string()))?;
    let mut entries = Vec::new();
    for item in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let item = item.map_err(|e| Error::io(dir, e))?;
        let name = item.file_name();
        let Some(version) = name.to_str().and_then(entry_version) else { continue };
        let path = item.path();
        let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        let entry: JournalEntry = serde_json::from_slice(&bytes).map_err(|e| Error::corrupt(&path, e.to_string()))?;
        if entry.version != version || entry.settled.len() != meta.tiers.len() {
            return Err(Error::corrupt(&path, "an entry that does not match its name or the tiers"));
        }
        entries.push(entry);
    }
    entries.sort_by_key(|e| e.version);
    Ok((meta, entries))
}

/// Finishes the flushes of the journal in `dir`, whose process is dead (the
/// caller holds its lock). Each tier that fails to open fails its versions;
/// nothing here waits on another process.
pub fn finish(dir: &Path) -> Result<Finished> {
    let (meta, mut entries) = read_journal(dir)?;
    let mut done = Finished { rank: meta.rank, ..Finished::default() };
    if entries.is_empty() {
        return Ok(done);
    }
    // Whether the segments still hold each file: as the dead process left it.
    let valid: Vec<bool> = entries.iter().map(JournalEntry::segments_valid).collect();
    let mut stores: Vec<Result<StoreWriter>> = meta
        .tiers
        .iter()
        .map(|(_, root)| StoreWriter::open_to_finish(root, meta.rank, meta.data_len, &meta.opts))
        .collect();
    for (k, e) in entries.iter_mut().enumerate() {
        crate::failpoint::hit("agent.finish");
        let _span = crate::profile::Span::new("agent-finish", e.version);
        for tier in 0..meta.tiers.len() {
            if e.settled[tier].is_some() {
                continue;
            }
            let name = meta.tiers[tier].0.clone();
            let outcome = finish_one(dir, &meta, e, valid[k], tier, &mut stores);
            match outcome {
                Ok(()) => {
                    e.settled[tier] = Some(true);
                    done.written.push((e.version, name));
                }
                Err(err) => {
                    e.settled[tier] = Some(false);
                    done.failed.push((e.version, name, err.to_string()));
                }
            }
        }
    }
    Ok(done)
}

/// Makes version `e` durable on tier `tier`.
fn finish_one(
    dir: &Path,
    meta: &JournalMeta,
    e: &JournalEntry,
    segments_valid: bool,
    tier: usize,
    stores: &mut [Result<StoreWriter>],
) -> Result<()> {
    let store = match &stores[tier] {
        Ok(s) => s,
        Err(err) => return Err(Error::Internal(format!("the {} tier did not open: {err}", meta.tiers[tier].0))),
    };
    if store.manifest().get(e.version).is_some() {
        return Ok(()); // listed already (published, or committed by every rank)
    }
    if let Some(prev) = e.prev
        && !store.diff_path(prev).is_file()
    {
        return Err(Error::NotDurable {
            version: e.version,
            tier: meta.tiers[tier].0.clone(),
            reason: format!("its chain is incomplete on this tier (version {prev} is missing)"),
        });
    }
    let entry = if segments_valid {
        let file = MappedFile::open(dir, e)?;
        // Every tier gets the file the first tier's worker would have made.
        let how = CacheWrite { rewrite: None, sealed: e.sealed, compression: meta.compression };
        write_cached(store, e.version, e.baseline, &file, &how, &|_| false)?.0
    } else {
        // The fastest tier the process made it durable on holds the file.
        let from = (0..stores.len())
            .find(|&t| e.settled[t] == Some(true))
            .ok_or_else(|| Error::Internal(format!("version {}: no tier holds it", e.version)))?;
        let source = match &stores[from] {
            Ok(s) => s.diff_path(e.version),
            Err(err) => return Err(Error::Internal(format!("the tier holding it did not open: {err}"))),
        };
        let len = std::fs::metadata(&source).map_err(|err| Error::io(&source, err))?.len();
        write_copied(store, e.version, e.baseline, &source, len)?
    };
    let Ok(store) = &mut stores[tier] else { return Err(Error::Internal("a tier closed".into())) };
    list_written(store, meta.listing, e.version, e.baseline, e.prev, entry)
}
