//! Surviving the loss of a node (issue #31): emulated nodes
//! (`ranks_per_node`), each with its own node-local directory
//! (`node-{node}`) and no shared tier. After one node's directory is
//! deleted whole, the job rebuilds its ranks' files from the partner
//! copies or the group's parity and restores every version byte-exactly;
//! losing two nodes that one scheme cannot cover is a clear error; a
//! damaged copy is caught by `verify`.

use super::*;
use dckpt::collective::TieredCollective;
use dckpt::redundancy::Redundancy;

/// Ranks per emulated node: one up to 3 ranks, two from 4.
fn per_node(w: &World) -> u32 {
    if w.size >= 4 { 2 } else { 1 }
}

fn opts(w: &World, redundancy: Redundancy) -> CollectiveOptions {
    CollectiveOptions {
        backend: test_backend(),
        redundancy,
        ranks_per_node: per_node(w),
        ..CollectiveOptions::default()
    }
}

fn scratch_only(root: &Path) -> dckpt::tiers::TierOptions {
    dckpt::tiers::TierOptions {
        local: Some(root.join("node-{node}")),
        host_cache_bytes: 64 << 20,
        ..dckpt::tiers::TierOptions::default()
    }
}

const TAKEN: u64 = 4;

/// Takes versions 1..=TAKEN of the partial-sharing scenario (references
/// across nodes), each waited for (durable, copies made).
fn take(w: &World, root: &Path, o: &CollectiveOptions) {
    let mut c = TieredCollective::open(w.comm, &scratch_only(root), len() as u64, &store_opts(), o).expect("open");
    for v in 1..=TAKEN {
        c.checkpoint(v, &buffer(Scenario::Partial, w.rank, v)).expect("checkpoint");
        c.wait(v).expect("wait: durable and protected");
        w.check(c.is_protected(v) == Some(true), &format!("version {v} not protected"));
    }
    c.finalize().expect("finalize");
}

/// Takes versions 1..=TAKEN as [`take`] does, node 1's directory copied
/// after version `at`; at the end that copy replaces it.
fn take_with_snapshot(w: &World, root: &Path, o: &CollectiveOptions, at: u64) {
    let snapshot = root.with_extension("snapshot");
    let mut c = TieredCollective::open(w.comm, &scratch_only(root), len() as u64, &store_opts(), o).expect("open");
    for v in 1..=TAKEN {
        c.checkpoint(v, &buffer(Scenario::Partial, w.rank, v)).expect("checkpoint");
        c.wait(v).expect("wait: durable and protected");
        if v == at {
            w.comm.barrier();
            if w.rank == 0 {
                copy_dir(&root.join("node-1"), &snapshot);
            }
            w.comm.barrier();
        }
    }
    c.finalize().expect("finalize");
    w.comm.barrier();
    if w.rank == 0 {
        std::fs::remove_dir_all(root.join("node-1")).unwrap();
        std::fs::rename(&snapshot, root.join("node-1")).unwrap();
    }
    w.comm.barrier();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// Deletes the emulated nodes' directories `nodes` (rank 0; everyone waits).
fn lose(w: &World, root: &Path, nodes: &[u32]) {
    w.comm.barrier();
    if w.rank == 0 {
        for n in nodes {
            std::fs::remove_dir_all(root.join(format!("node-{n}"))).unwrap();
        }
    }
    w.comm.barrier();
}

/// Reopens and restores every version on every rank, then goes on.
fn restart(w: &World, root: &Path, o: &CollectiveOptions, what: &str) {
    let mut c = TieredCollective::open(w.comm, &scratch_only(root), len() as u64, &store_opts(), o).expect("reopen");
    let node = w.rank as u32 / per_node(w);
    w.check(
        c.recovered().lost.contains(&(w.rank as u32)) == (node == 1),
        &format!("{what}: lost ranks {:?}", c.recovered().lost),
    );
    for v in (1..=TAKEN).rev() {
        c.settle_for_restore(v);
        let mut back = vec![0u8; len()];
        let got = c.restart_into(v, dckpt::memory::ProtectedMut::Host(&mut back));
        w.check(got.is_ok() && back == buffer(Scenario::Partial, w.rank, v), &format!("{what}: version {v}: {got:?}"));
    }
    // The job goes on from the rebuilt history.
    let v = TAKEN + 1;
    c.checkpoint(v, &buffer(Scenario::Partial, w.rank, v)).expect("checkpoint after the rebuild");
    c.wait(v).expect("wait after the rebuild");
    c.finalize().expect("finalize after the rebuild");
}

pub(super) fn node_loss(w: &World, root: &Path) {
    if w.size < 2 {
        // One rank is one node: no scheme can protect it, and it says so.
        let err = TieredCollective::open(
            w.comm,
            &scratch_only(root),
            len() as u64,
            &store_opts(),
            &opts(w, Redundancy::Partner),
        )
        .err()
        .map(|e| e.to_string());
        w.check(err.as_deref().is_some_and(|e| e.contains("two nodes")), &format!("one node: {err:?}"));
        return;
    }
    let nodes = (w.size as u32).div_ceil(per_node(w));
    for (name, scheme) in [("partner", Redundancy::Partner), ("xor", Redundancy::Xor(2))] {
        let dir = root.join(name);
        let o = opts(w, scheme);
        take(w, &dir, &o);
        // A damaged copy is caught by verify (then mended, for the rebuild).
        if w.rank == 0 {
            let holder_dir = dir.join("node-0");
            let copy = find(&holder_dir.join("redundancy"), if name == "partner" { "bundle" } else { "parity" });
            let original = std::fs::read(&copy).unwrap();
            let mut bad = original.clone();
            let at = bad.len() - 10;
            bad[at] ^= 0x55;
            std::fs::write(&copy, &bad).unwrap();
            let report = dckpt::verify::verify_store(&holder_dir).unwrap();
            w.check(
                report.problems.iter().any(|p| p.message.contains("checksum")),
                &format!("{name}: verify missed a damaged copy: {:?}", report.problems),
            );
            std::fs::write(&copy, &original).unwrap();
            // (A node's directory alone lacks the other nodes' ranks, which
            // verify reports; the copies themselves now read back whole.)
            let report = dckpt::verify::verify_store(&holder_dir).unwrap();
            w.check(
                !report.problems.iter().any(|p| p.message.contains("damaged")),
                &format!("{name}: verify after mending: {:?}", report.problems),
            );
        }
        lose(w, &dir, &[1]);
        restart(w, &dir, &o, name);
        if w.rank == 0 {
            println!("  {name}: node 1 of {nodes} lost, every version of every rank rebuilt and restored");
        }
        // Node 1's directory replaced by an older copy of itself (a node
        // restored from a snapshot), then one whose files are gone but its
        // manifests kept: both rebuilt from the copies, every version
        // restored on every rank (they used to set the newer versions
        // aside everywhere, or fail).
        let stale = root.join(format!("{name}-stale"));
        take_with_snapshot(w, &stale, &o, 2);
        restart(w, &stale, &o, &format!("{name}, an older node directory"));
        let gutted = root.join(format!("{name}-gutted"));
        take(w, &gutted, &o);
        w.comm.barrier();
        if w.rank == 0 {
            for rank_dir in std::fs::read_dir(gutted.join("node-1")).unwrap().flatten() {
                let n = rank_dir.file_name().to_string_lossy().into_owned();
                if !n.starts_with("rank-") {
                    continue;
                }
                for f in std::fs::read_dir(rank_dir.path()).unwrap().flatten() {
                    if f.file_name().to_string_lossy().ends_with(".dckpt") {
                        std::fs::remove_file(f.path()).unwrap();
                    }
                }
            }
        }
        w.comm.barrier();
        restart(w, &gutted, &o, &format!("{name}, a node directory without its files"));
        if w.rank == 0 {
            println!(
                "  {name}: node 1's directory older than its copies, then emptied of its files: rebuilt both times"
            );
        }
    }
    // A job that died with rank 2's newest file durable but neither listed
    // nor committed yet (its copy made), then node 1 lost: rank 2 is not
    // "behind its copies" (its newest file is there), so node 1 alone is
    // rebuilt; taking rank 2 for stale would have made the loss look beyond
    // the scheme and set every version aside.
    if w.size == 3 && per_node(w) == 1 {
        let dir = root.join("unlisted");
        let o = opts(w, Redundancy::Partner);
        take(w, &dir, &o);
        w.comm.barrier();
        let holds_2 = dir.join("node-0/redundancy/partner/rank-00002").is_dir();
        if w.rank == 2 && holds_2 {
            let node = dir.join("node-2");
            let mpath = node.join("rank-00002/MANIFEST");
            let mut m = dckpt::format::manifest::Manifest::decode(&std::fs::read(&mpath).unwrap(), &mpath).unwrap();
            m.versions.retain(|e| e.version < TAKEN);
            std::fs::write(&mpath, m.encode()).unwrap();
            std::fs::remove_file(node.join(format!("commits/v{TAKEN:012}.r000002.part"))).unwrap();
        }
        lose(w, &dir, &[1]);
        if holds_2 {
            restart(w, &dir, &o, "rank 2's newest file not listed yet, node 1 lost");
            if w.rank == 0 {
                println!("  partner: a newest file not listed yet is not taken for an old directory");
            }
        }
    }
    // Two nodes lost where one scheme covers one: nothing can be rebuilt;
    // said once (a warning), the others' versions left for the runtime to
    // set aside (the job starts from the beginning), and no rank's files
    // made up: the lost ranks list nothing.
    if nodes >= 3 {
        for (name, scheme) in [("partner2", Redundancy::Partner), ("xor2", Redundancy::Xor(nodes))] {
            let dir = root.join(name);
            let o = opts(w, scheme);
            take(w, &dir, &o);
            lose(w, &dir, &[0, 1]);
            let opened = TieredCollective::open(w.comm, &scratch_only(&dir), len() as u64, &store_opts(), &o);
            let ok = opened.as_ref().is_ok_and(|c| {
                c.recovered().lost == [0, 1]
                    && c.recovered().versions_rebuilt == 0
                    && (w.rank > 1 || c.engine().latest().is_none())
            });
            w.check(ok, &format!("{name}: two nodes lost: {:?}", opened.as_ref().err()));
            if w.rank == 0 {
                println!("  {name}: nodes 0 and 1 lost: beyond the scheme, nothing rebuilt");
            }
        }
    }
}

/// The first file ending in `.ext` under `dir`.
fn find(dir: &Path, ext: &str) -> PathBuf {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == ext) {
                return p;
            }
        }
    }
    panic!("no .{ext} file under {}", dir.display());
}
