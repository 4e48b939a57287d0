//! A restart over node-local directories (issue #31): before a name is
//! first used, the files of ranks whose node lost its directory are
//! rebuilt from their partner copies or their group's parity, and every
//! node's directory receives every rank's commit parts (`prepare`);
//! before a restore, the owners' files its references name on other
//! nodes are fetched into memory (`fetch_for_restore`). Collective.

use super::protect::{Scheme, write_part};
use super::transfer::{self, pack, unpack};
use crate::error::{Error, Result};
use crate::format::diff_file::DiffReader;
use crate::redundancy::{Plan, REDUNDANCY_DIR, bundle, parity, parity_rel, partner_rel};
use crate::storage::{Posix, Storage};
use crate::store::commits::parse_part_name;
use crate::store::{Store, diff_file_name, rank_rel};
use crate::tiers::RemoteFiles;
use ::mpi::traits::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What `prepare` found and did (`TieredCollective::recovered`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Recovered {
    /// Ranks whose node-local store was gone.
    pub lost: Vec<u32>,
    /// Versions rebuilt on this rank.
    pub versions_rebuilt: usize,
    /// Versions whose copies could not be read (damaged), skipped.
    pub skipped: Vec<String>,
}

/// Readies the node-local tier for a job's first use of a name: rebuilds
/// lost ranks' files, then gives every node every rank's commit parts.
/// An error (on every rank) names what cannot be rebuilt. Collective.
pub(crate) fn prepare<C: Communicator>(comm: &C, scheme: &Scheme) -> Result<Recovered> {
    let storage = Posix::at(&scheme.root);
    let p = comm.size() as usize;
    // This rank's directory: its manifest there or not, a listed version
    // whose file is gone (gutted), the newest it lists.
    let listed = own_listing(&storage, scheme.me);
    let mine = [u64::from(listed.is_some()), u64::from(listed.as_ref().is_some_and(|l| l.gutted)), {
        listed.as_ref().map_or(0, |l| l.newest)
    }];
    let mut all = vec![0u64; 3 * p];
    comm.all_gather_into(&mine[..], &mut all[..]);
    // The newest copy of each rank any holder keeps: a directory listing
    // less is older than its copies (a node restored from an old snapshot).
    let held = newest_copies_held(&storage, scheme, p);
    let mut newest_copy = vec![0u64; p];
    comm.all_reduce_into(&held[..], &mut newest_copy[..], ::mpi::collective::SystemOperation::max());
    let present = |r: usize| all[3 * r] == 1;
    let behind = |r: usize| all[3 * r + 1] == 1 || newest_copy[r] > all[3 * r + 2];
    let mut lost: Vec<u32> = match (0..p).any(present) {
        true => (0..p).filter(|&r| !present(r) || behind(r)).map(|r| r as u32).collect(),
        false => Vec::new(), // a new name everywhere (or every node lost: nothing to rebuild from)
    };
    // A directory behind its copies is mended only where that leaves the
    // lost ones rebuildable: never at their expense.
    let gone: Vec<u32> = lost.iter().copied().filter(|&r| !present(r as usize)).collect();
    if lost.len() > gone.len()
        && beyond_the_scheme(scheme, &lost).is_some()
        && beyond_the_scheme(scheme, &gone).is_none()
    {
        lost = gone;
    }
    for &r in lost.iter().filter(|&&r| present(r as usize) && scheme.plan != Plan::None) {
        if scheme.me == 0 {
            let r = r as usize;
            tracing::warn!(
                "rank {r}'s node-local checkpoints are {}: rebuilt from its copies where they can be",
                if all[3 * r + 1] == 1 {
                    "missing files its manifest lists".to_string()
                } else {
                    format!(
                        "older than its copies (its newest file is version {}, a copy holds {})",
                        all[3 * r + 2],
                        newest_copy[r]
                    )
                }
            );
        }
    }
    let mut out = Recovered { lost: lost.clone(), ..Default::default() };
    if !lost.is_empty() {
        let rebuilt = match (&scheme.plan, beyond_the_scheme(scheme, &lost)) {
            // Without copies that can rebuild them, the shared tier (if any)
            // may still serve the job; else it starts from the beginning,
            // on purpose (`Runtime::latest` sets the other ranks' versions
            // aside): the same on every run would be a wedge.
            (_, Some(why)) => {
                tracing::warn!("{why}");
                Ok((0, Vec::new()))
            }
            (Plan::None, None) => Ok((0, Vec::new())),
            (Plan::Partner { holder }, None) => rebuild_from_partners(comm, scheme, &storage, &lost, holder),
            (Plan::Xor { .. }, None) => rebuild_from_parity(comm, scheme, &storage, &lost),
        };
        let (n, skipped) = rebuilt?;
        out.versions_rebuilt = n;
        out.skipped = skipped;
    }
    if scheme.nodes.count() > 1 {
        super::mpi::all_agree(comm, "sharing the commit parts and region tables", 0, share(comm, scheme, &storage))?;
    }
    Ok(out)
}

/// Every commit part and region table any node holds to every node: each
/// node's lowest rank sends those in its directory and writes the others'
/// (a part a lost node had reaches it again from another node's copy, and
/// every node can read every rank's table). The bytes written. Collective.
pub(crate) fn share<C: Communicator>(comm: &C, scheme: &Scheme, storage: &Posix) -> Result<u64> {
    use crate::store::commits::COMMITS_DIR;
    const TABLES: &str = "regions";
    let leader = scheme.nodes.leader_of(scheme.me) == scheme.me;
    // A read that fails still takes part in the gather (with nothing), and
    // fails after it: every rank meets in the same collectives.
    let read = (|| -> Result<Vec<(String, Vec<u8>)>> {
        let mut mine = Vec::new();
        if leader {
            for (dir, keep) in [(COMMITS_DIR, is_part as fn(&str) -> bool), (TABLES, is_table)] {
                for e in storage.list(Path::new(dir))?.into_iter().filter(|e| keep(&e.name)) {
                    if let Some(bytes) = storage.read(&Path::new(dir).join(&e.name))? {
                        mine.push((format!("{dir}/{}", e.name), bytes));
                    }
                }
            }
        }
        Ok(mine)
    })();
    let all = transfer::gather(comm, &pack(read.as_deref().unwrap_or_default()))?;
    read?;
    if !leader {
        return Ok(0);
    }
    let mut written = 0;
    let here = scheme.nodes.node(scheme.me);
    // Other nodes' leaders only: this node's ranks wrote their own.
    for (r, bytes) in all.iter().enumerate().filter(|&(r, _)| scheme.nodes.node(r as u32) != here) {
        for (name, body) in unpack(bytes, &format!("rank {r}"))? {
            let bad = || Error::Collective(format!("rank {r} sent '{name}', not a commit part or a region table"));
            let (dir, file) = name.split_once('/').ok_or_else(bad)?;
            if dir == COMMITS_DIR && is_part(file) {
                let (v, owner) = parse_part_name(file).ok_or_else(bad)?;
                // A part of a rank of this node whose file is not here (a
                // lost rank's version its copies could not rebuild) would
                // list a version it cannot restore: left out.
                let here_without_file = scheme.nodes.node(owner) == here
                    && !storage.locate(&rank_rel(owner).join(diff_file_name(v))).exists();
                if here_without_file {
                    continue;
                }
                // Only where none is: a copy from another node never replaces
                // a part its own rank wrote here. A damaged copy is not
                // spread (the versions it alone commits stay invisible, as
                // where it lies); it never stops the job.
                match write_part(storage, v, owner, &body, false) {
                    Ok(n) => written += n,
                    Err(e @ Error::Corrupt { .. }) => {
                        tracing::warn!("rank {}: not copied from node of rank {r}: {e}", scheme.me);
                    }
                    Err(e) => return Err(e),
                }
            } else if dir == TABLES && is_table(file) {
                let rel = Path::new(TABLES).join(file);
                if storage.read(&rel)?.is_none() {
                    storage.create_dir(Path::new(TABLES))?;
                    crate::storage::write_bytes(storage, &rel, &body)?;
                    storage.barrier(Path::new(TABLES))?;
                    written += body.len() as u64;
                }
            } else {
                return Err(bad());
            }
        }
    }
    Ok(written)
}

fn is_part(name: &str) -> bool {
    parse_part_name(name).is_some()
}

/// A region table's name, `rank-NNNNN.json`.
fn is_table(name: &str) -> bool {
    name.strip_prefix("rank-")
        .and_then(|n| n.strip_suffix(".json"))
        .is_some_and(|n| n.len() == 5 && n.bytes().all(|b| b.is_ascii_digit()))
}

/// What this rank's node-local directory lists.
struct OwnListing {
    /// The newest version whose diff file is there, listed or not (a file
    /// durable but not listed yet, when the job died, is not "behind").
    newest: u64,
    /// Whether a version it lists has no diff file.
    gutted: bool,
}

/// This rank's listing (`None`: no manifest to read, the directory lost).
fn own_listing(storage: &Posix, me: u32) -> Option<OwnListing> {
    storage.read(&rank_rel(me).join("MANIFEST")).ok().flatten()?;
    let store = Store::open(&storage.locate(Path::new("")), me).ok();
    let Some(store) = store else {
        // A manifest there but unreadable: mended from its files later,
        // never taken for a lost directory here.
        return Some(OwnListing { newest: u64::MAX, gutted: false });
    };
    let versions: Vec<u64> = store.manifest().versions.iter().map(|v| v.version).collect();
    let gutted = versions.iter().any(|&v| !storage.locate(&rank_rel(me).join(diff_file_name(v))).exists());
    let files = crate::store::versions_present(storage, &rank_rel(me)).unwrap_or_default();
    Some(OwnListing { newest: files.last().copied().unwrap_or(0), gutted })
}

/// The newest version of each rank's copy this rank holds (0: none).
fn newest_copies_held(storage: &Posix, scheme: &Scheme, ranks: usize) -> Vec<u64> {
    let mut held = vec![0u64; ranks];
    match &scheme.plan {
        Plan::None => {}
        Plan::Partner { .. } => {
            let dir = Path::new(REDUNDANCY_DIR).join("partner");
            for e in storage.list(&dir).unwrap_or_default() {
                let Some(r) = e.name.strip_prefix("rank-").and_then(|r| r.parse::<usize>().ok()) else { continue };
                let newest = storage
                    .list(&dir.join(&e.name))
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|f| f.name.strip_prefix('v')?.strip_suffix(".bundle")?.parse::<u64>().ok())
                    .max()
                    .unwrap_or(0);
                if let Some(h) = held.get_mut(r) {
                    *h = newest;
                }
            }
        }
        Plan::Xor { .. } => {
            let newest = held_parity(storage, scheme.me).last().copied().unwrap_or(0);
            for &r in scheme.plan.group_of(scheme.me).unwrap_or_default() {
                if r != scheme.me
                    && let Some(h) = held.get_mut(r as usize)
                {
                    *h = newest;
                }
            }
        }
    }
    held
}

/// Why the copies cannot rebuild the `lost` ranks (the same answer on
/// every rank: it depends only on the scheme and the ranks lost), if they
/// cannot.
fn beyond_the_scheme(scheme: &Scheme, lost: &[u32]) -> Option<String> {
    match &scheme.plan {
        Plan::None => Some(format!(
            "the node-local checkpoints of rank(s) {lost:?} are gone and redundancy is none: nothing on the \
             node-local tier can rebuild them"
        )),
        Plan::Partner { holder } => {
            let gone: Vec<(u32, u32)> =
                lost.iter().map(|&l| (l, holder[l as usize])).filter(|(_, h)| lost.contains(h)).collect();
            (!gone.is_empty()).then(|| {
                let nodes: BTreeSet<u32> = lost.iter().map(|&r| scheme.nodes.node(r)).collect();
                format!(
                    "cannot rebuild the node-local checkpoints: rank(s) {lost:?} on node(s) {nodes:?} are lost, and \
                     the partner copies of {:?} were on lost ranks {:?} too (partner survives the loss of one node)",
                    gone.iter().map(|g| g.0).collect::<Vec<_>>(),
                    gone.iter().map(|g| g.1).collect::<Vec<_>>(),
                )
            })
        }
        Plan::Xor { groups } => groups.iter().find_map(|g| {
            let gone: Vec<u32> = g.iter().copied().filter(|r| lost.contains(r)).collect();
            (gone.len() > 1).then(|| {
                let nodes: BTreeSet<u32> = gone.iter().map(|&r| scheme.nodes.node(r)).collect();
                format!(
                    "cannot rebuild the node-local checkpoints of rank(s) {gone:?}: they are in one parity group \
                     {g:?} and their nodes {nodes:?} are all lost (a group's parity rebuilds one member)"
                )
            })
        }),
    }
}

/// Each lost rank's bundles from its partner; the versions rebuilt here
/// and the copies skipped. Collective.
fn rebuild_from_partners<C: Communicator>(
    comm: &C,
    scheme: &Scheme,
    storage: &Posix,
    lost: &[u32],
    holder: &[u32],
) -> Result<(usize, Vec<String>)> {
    let p = comm.size() as usize;
    let mut out = vec![Vec::new(); p];
    let sending = (|| -> Result<()> {
        for &l in lost.iter().filter(|&&l| holder[l as usize] == scheme.me) {
            let dir = partner_rel(l, 0).parent().map(Path::to_path_buf).unwrap_or_default();
            let mut files = Vec::new();
            for e in storage.list(&dir)? {
                if let Some(bytes) = storage.read(&dir.join(&e.name))? {
                    files.push((e.name.clone(), bytes));
                }
            }
            out[l as usize] = pack(&files);
        }
        Ok(())
    })();
    let got = transfer::exchange(comm, &out)?;
    super::mpi::all_agree(comm, "reading the partner copies", 0, sending)?;
    let mut skipped = Vec::new();
    let mut rebuilt = 0;
    let restored = (|| -> Result<()> {
        if !lost.contains(&scheme.me) {
            return Ok(());
        }
        let h = holder[scheme.me as usize];
        for (name, bytes) in unpack(&got[h as usize], &format!("rank {h}"))? {
            let path = storage.locate(&Path::new(REDUNDANCY_DIR).join("partner").join(&name));
            match bundle::decode(&bytes, &path) {
                Ok(b) if b.rank == scheme.me => {
                    b.restore_to(storage)?;
                    rebuilt += 1;
                }
                Ok(b) => skipped.push(format!("{name} on rank {h}: a copy of rank {}", b.rank)),
                Err(e) => skipped.push(format!("{name} on rank {h}: {e}")),
            }
        }
        Ok(())
    })();
    super::mpi::all_agree(comm, "rebuilding from the partner copies", 0, restored)?;
    for s in &skipped {
        tracing::warn!("rank {}: not rebuilt from its partner copy: {s}", scheme.me);
    }
    Ok((rebuilt, skipped))
}

/// Each lost rank's bundles from its group's parity; the versions rebuilt
/// here and the ones skipped. Collective.
fn rebuild_from_parity<C: Communicator>(
    comm: &C,
    scheme: &Scheme,
    storage: &Posix,
    lost: &[u32],
) -> Result<(usize, Vec<String>)> {
    let p = comm.size() as usize;
    let me = scheme.me;
    let group = scheme.plan.group_of(me).map(<[u32]>::to_vec).unwrap_or_default();
    let lost_here = group.iter().copied().find(|r| lost.contains(r));
    // The versions each survivor holds parity of; per group, those all its survivors hold.
    let mine: Vec<u8> = match lost_here {
        Some(l) if l != me => held_parity(storage, me).iter().flat_map(|v| v.to_le_bytes()).collect(),
        _ => Vec::new(),
    };
    let held = transfer::gather(comm, &mine)?;
    let versions: Vec<u64> = match lost_here {
        Some(l) => {
            let lists: Vec<BTreeSet<u64>> = group
                .iter()
                .filter(|&&r| r != l)
                .map(|&r| {
                    held[r as usize]
                        .chunks_exact(8)
                        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
                        .collect()
                })
                .collect();
            let first = lists.first().cloned().unwrap_or_default();
            first.into_iter().filter(|v| lists.iter().all(|s| s.contains(v))).collect()
        }
        None => Vec::new(),
    };
    let mut rounds = versions.len() as u64;
    let mut max_rounds = 0u64;
    comm.all_reduce_into(&rounds, &mut max_rounds, ::mpi::collective::SystemOperation::max());
    rounds = max_rounds;
    let (mut rebuilt, mut skipped) = (0usize, Vec::new());
    for round in 0..rounds as usize {
        let version = versions.get(round).copied();
        // 1. Each survivor's segments for the other survivors.
        let mut out = vec![Vec::new(); p];
        let mut own: Option<(parity::ParityHeader, Vec<u8>)> = None;
        if let (Some(l), Some(v)) = (lost_here, version)
            && l != me
        {
            match survivor_side(storage, me, v, &group) {
                Ok((header, seg, b)) => {
                    let pos = group.iter().position(|&r| r == me).unwrap_or(0);
                    for (j, &r) in group.iter().enumerate().filter(|&(_, &r)| r != me && r != l) {
                        out[r as usize] = parity::segment(&b, parity::slot(pos, j), header.segment_len);
                    }
                    own = Some((header, seg));
                }
                Err(e) => skipped.push(format!("version {v}: rank {me}'s part of the rebuild: {e}")),
            }
        }
        let given = transfer::exchange(comm, &out)?;
        // 2. Each survivor's piece (and its header) to the lost member.
        let mut out = vec![Vec::new(); p];
        if let (Some(l), Some((header, seg))) = (lost_here, &own) {
            let others: Vec<Vec<u8>> =
                group.iter().filter(|&&r| r != me && r != l).map(|&r| given[r as usize].clone()).collect();
            let complete = others.iter().all(|g| g.len() as u64 == header.segment_len);
            if complete {
                let piece = parity::piece(seg, &others);
                let json = serde_json::to_vec(header).unwrap_or_default();
                out[l as usize] = pack(&[("piece".into(), piece), ("header".into(), json)]);
            }
        }
        let pieces = transfer::exchange(comm, &out)?;
        // 3. The lost member assembles its bundle and writes its files.
        if let (Some(l), Some(v)) = (lost_here, version)
            && l == me
        {
            match assemble(storage, me, v, &group, &pieces) {
                Ok(()) => rebuilt += 1,
                Err(e) => skipped.push(format!("version {v}: {e}")),
            }
        }
    }
    for s in &skipped {
        tracing::warn!("rank {me}: not rebuilt from parity: {s}");
    }
    Ok((rebuilt, skipped))
}

/// The versions whose parity segment `rank` holds.
fn held_parity(storage: &Posix, rank: u32) -> Vec<u64> {
    let dir = parity_rel(rank, 0).parent().map(Path::to_path_buf).unwrap_or_default();
    let mut v: Vec<u64> = storage
        .list(&dir)
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e.name.strip_prefix('v')?.strip_suffix(".parity")?.parse().ok())
        .collect();
    v.sort_unstable();
    v
}

/// A survivor's parity file of `version` (checked against the group) and
/// its own bundle (checked against the digest the parity recorded).
fn survivor_side(
    storage: &Posix,
    me: u32,
    version: u64,
    group: &[u32],
) -> Result<(parity::ParityHeader, Vec<u8>, Vec<u8>)> {
    let rel = parity_rel(me, version);
    let path = storage.locate(&rel);
    let bytes = storage.read(&rel)?.ok_or_else(|| Error::corrupt(&path, "parity file missing"))?;
    let (header, seg) = parity::decode(&bytes, &path)?;
    if header.members != group || header.version != version || header.holder != me {
        return Err(Error::corrupt(&path, "parity of another group or version"));
    }
    let b = bundle::make(storage, me, version)?;
    let pos = group.iter().position(|&r| r == me).unwrap_or(0);
    if blake3::hash(&b).to_hex().as_str() != header.digests[pos] {
        return Err(Error::corrupt(
            &path,
            format!("rank {me}'s files of version {version} changed since the parity was made"),
        ));
    }
    Ok((header, seg, b))
}

/// The lost member's bundle of `version` from the survivors' pieces,
/// checked against its recorded digest, written back.
fn assemble(storage: &Posix, me: u32, version: u64, group: &[u32], pieces: &[Vec<u8>]) -> Result<()> {
    let pos = group.iter().position(|&r| r == me).unwrap_or(0);
    let mut parts: Vec<Vec<u8>> = vec![Vec::new(); group.len()];
    let mut header: Option<parity::ParityHeader> = None;
    for (j, &r) in group.iter().enumerate().filter(|&(_, &r)| r != me) {
        let files: BTreeMap<String, Vec<u8>> = unpack(&pieces[r as usize], &format!("rank {r}"))?.into_iter().collect();
        let (Some(piece), Some(h)) = (files.get("piece"), files.get("header")) else {
            return Err(Error::Collective(format!("rank {r} had no piece of it")));
        };
        parts[j] = piece.clone();
        header = Some(serde_json::from_slice(h).map_err(|e| Error::Collective(format!("rank {r}'s header: {e}")))?);
    }
    let header = header.ok_or_else(|| Error::Collective("no survivor in the group".into()))?;
    let b = parity::assemble(pos, &parts, header.lens[pos]);
    if blake3::hash(&b).to_hex().as_str() != header.digests[pos] {
        return Err(Error::Collective(format!("the rebuilt files of rank {me} do not match their recorded digest")));
    }
    let path = storage.locate(&parity_rel(me, version));
    bundle::decode(&b, &path)?.restore_to(storage)
}

/// The other nodes' files a restore of `version` on this rank reads: the
/// owners' diff files its chain references and their manifests, fetched
/// from the ranks that hold them. Collective; empty on one node.
pub(crate) fn fetch_for_restore<C: Communicator>(comm: &C, scheme: &Scheme, version: u64) -> Result<RemoteFiles> {
    let mut files = RemoteFiles::new();
    if scheme.nodes.count() < 2 {
        return Ok(files);
    }
    let p = comm.size() as usize;
    let storage = Posix::at(&scheme.root);
    // What this rank's chain references on other nodes' ranks.
    let mut wanted: Vec<BTreeSet<u64>> = vec![BTreeSet::new(); p];
    if let Ok(store) = Store::open(&scheme.root, scheme.me)
        && let Some(chain) = store.manifest().chain(version)
    {
        for e in chain {
            let Ok(reader) = DiffReader::open(&store.diff_path(e.version)) else { continue };
            for s in &reader.diff.shift {
                if scheme.nodes.node(s.src_rank) != scheme.nodes.node(scheme.me) && (s.src_rank as usize) < p {
                    wanted[s.src_rank as usize].insert(s.src_version);
                }
            }
        }
    }
    let asks: Vec<Vec<u8>> = wanted.iter().map(|w| w.iter().flat_map(|v| v.to_le_bytes()).collect()).collect();
    let asked = transfer::exchange(comm, &asks)?;
    let mut out = vec![Vec::new(); p];
    let served = (|| -> Result<()> {
        for (q, ask) in asked.iter().enumerate().filter(|(_, a)| !a.is_empty()) {
            let manifest = rank_rel(scheme.me).join("MANIFEST");
            let mut list =
                vec![(manifest.to_string_lossy().into_owned(), storage.read(&manifest)?.unwrap_or_default())];
            for v in ask.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default())) {
                let rel = rank_rel(scheme.me).join(diff_file_name(v));
                if let Some(bytes) = storage.read(&rel)? {
                    list.push((rel.to_string_lossy().into_owned(), bytes));
                }
            }
            out[q] = pack(&list);
        }
        Ok(())
    })();
    let got = transfer::exchange(comm, &out)?;
    super::mpi::all_agree(comm, "serving the owners' files", version, served)?;
    for (o, bytes) in got.iter().enumerate().filter(|(_, b)| !b.is_empty()) {
        let prefix = rank_rel(o as u32);
        for (name, body) in unpack(bytes, &format!("rank {o}"))? {
            let rel = PathBuf::from(&name);
            if rel.parent() != Some(prefix.as_path()) {
                return Err(Error::Collective(format!("rank {o} sent {name}, not one of its own files")));
            }
            files.insert(rel, Arc::new(body));
        }
    }
    Ok(files)
}
