//! Never wedged, never wrong (issue #42), through the runtime under mpirun:
//! after losses, damage and ranks that disagree, the next run restarts
//! from a version every rank restores right, starts from the beginning on
//! purpose with the old versions set aside (never blocking new ones), or
//! stops with one error, the same on every rank. Never a hang, never other
//! bytes than the version's.
// Protecting memory by address is `unsafe`, as for a C application.
#![allow(unsafe_code)]

use super::World;
use super::common::noise;
use dckpt::config::{Bytes, Config};
use dckpt::runtime::{Region, Runtime};
use mpi::traits::*;
use std::path::{Path, PathBuf};

fn content(rank: i32, len: usize, version: u64) -> Vec<u8> {
    let mut v = noise(len, 700 + rank as u64);
    let at = (version as usize * 7919) % (len - 256);
    v[at..at + 256].copy_from_slice(&noise(256, version * 31 + rank as u64));
    v
}

fn protect(rt: &mut Runtime, buf: &mut [u8]) {
    // SAFETY: the buffer outlives the runtime's calls and is not touched
    // while a call runs (this test is single-threaded).
    unsafe { rt.protect(0, Region::host(buf)) }.expect("protect");
}

fn tiers(config: &Config) -> Vec<PathBuf> {
    [config.scratch.clone(), config.persistent.clone()].into_iter().flatten().collect()
}

/// Versions `1..=n` of `name`, every rank; the runtime finalized.
fn take(w: &World, config: &Config, name: &str, len: usize, n: u64) {
    let mut buf = vec![0u8; len];
    let mut rt = Runtime::init(w.comm, config.clone());
    for v in 1..=n {
        buf = content(w.rank, len, v);
        protect(&mut rt, &mut buf);
        rt.checkpoint(name, v).expect("checkpoint");
    }
    rt.finalize().expect("finalize");
}

/// A new job of every rank restarts `name` from `version`, with its bytes.
fn next_job_restarts(w: &World, config: &Config, name: &str, len: usize, version: u64, what: &str) {
    let mut buf = vec![0u8; len];
    let mut rt = Runtime::init(w.comm, config.clone());
    protect(&mut rt, &mut buf);
    let restored = rt.restart_latest(name);
    w.check(
        matches!(restored, Ok(Some(v)) if v == version) && buf == content(w.rank, len, version),
        &format!("{what}: {restored:?}"),
    );
    rt.finalize().expect("finalize");
}

/// The same value on every rank (an error's code, a flag).
fn same_everywhere(w: &World, x: u64) -> bool {
    let mut all = vec![0u64; w.size as usize];
    w.comm.all_gather_into(&x, &mut all[..]);
    all.iter().all(|&y| y == all[0])
}

pub fn never_wedged(w: &World, root: &Path) {
    let config = Config {
        scratch: Some(root.join("scratch")),
        persistent: Some(root.join("persistent")),
        host_cache_size: Bytes(8 << 20),
        backend: super::test_backend(),
        ..Config::default()
    };
    one_rank_lists_no_version(w, &config);
    ranks_name_different_checkpoints(w, &config);
    a_failed_restart_is_one_error_and_changes_nothing(w, &config);
    a_region_table_damaged_on_one_tier(w, &config);
    the_rank_count_comes_from_the_commit_records(w, &config);
    for collective in [true, false] {
        another_run_s_directory(w, &Config { collective, ..config.clone() });
    }
    copies_keep_up(w, &config);
    retention_waits_for_the_copies(w, &config);
    another_rank_count_on_node_local_directories(w, &config);
    a_truncated_commit_part_of_the_baseline(w, &config);
    a_damaged_manifest(w, &config);
    a_store_still_in_use(w, &config);
}

/// The highest rank's directory gone from every tier (a lost node whose
/// copies could not rebuild it): no version is on every rank, so `latest`
/// says none, and the versions the others keep are set aside, never
/// blocking the job's new version 1; the run after that restarts from it.
fn one_rank_lists_no_version(w: &World, config: &Config) {
    if w.size < 2 {
        return;
    }
    let (name, len) = ("nothing-common", 100_000 + 64 * w.rank as usize);
    take(w, config, name, len, 3);
    if w.rank == w.size - 1 {
        for tier in tiers(config) {
            let dir = tier.join(name).join(format!("rank-{:05}", w.rank));
            std::fs::remove_dir_all(&dir).expect("remove the rank's directory");
        }
    }
    w.comm.barrier();
    let mut buf = vec![0u8; len];
    let mut rt = Runtime::init(w.comm, config.clone());
    protect(&mut rt, &mut buf);
    let latest = rt.latest(name);
    w.check(matches!(latest, Ok(None)), &format!("no version common to every rank: {latest:?}"));
    w.check(rt.versions(name).expect("versions").is_empty(), "nothing is listed any more");
    buf = content(w.rank, len, 1);
    protect(&mut rt, &mut buf);
    let first = rt.checkpoint(name, 1);
    w.check(first.is_ok(), &format!("the new run's version 1 proceeds: {:?}", first.err()));
    rt.finalize().expect("finalize");
    let mut buf = vec![0u8; len];
    let mut rt = Runtime::init(w.comm, config.clone());
    protect(&mut rt, &mut buf);
    let again = rt.restart_latest(name);
    w.check(matches!(again, Ok(Some(1))), &format!("the next run restarts from version 1: {again:?}"));
    w.check(buf == content(w.rank, len, 1), "version 1's bytes");
    rt.finalize().expect("finalize");
}

/// Rank 0 takes `alpha`, the others `beta`: every call refuses on every
/// rank, naming the disagreement, and nothing waits.
fn ranks_name_different_checkpoints(w: &World, config: &Config) {
    if w.size < 2 {
        return;
    }
    let name = if w.rank == 0 { "alpha" } else { "beta" };
    let mut buf = content(w.rank, 50_000, 1);
    let mut rt = Runtime::init(w.comm, config.clone());
    protect(&mut rt, &mut buf);
    let taken = rt.checkpoint(name, 1);
    let said = taken.as_ref().err().map(ToString::to_string).unwrap_or_default();
    w.check(said.contains("different checkpoints"), &format!("checkpoint under different names: {said}"));
    w.check(rt.latest(name).is_err(), "latest under different names");
    w.check(rt.restart(name, 1).is_err(), "restart under different names");
    w.check(rt.versions(name).is_err(), "versions under different names");
    drop(rt);
    w.comm.barrier();
}

/// Rank 0's newest version damaged on every tier: `restart` of it fails on
/// every rank with the same code, and no rank's regions change (a name of
/// several regions is restored into its staging and placed once every rank
/// restored; a single region is restored in place, no copy: its bytes are
/// unspecified after an error, the code is still one).
fn a_failed_restart_is_one_error_and_changes_nothing(w: &World, config: &Config) {
    let (name, len) = ("failing", 120_000 + 128 * w.rank as usize);
    let split = |buf: &[u8]| (buf[..len / 3].to_vec(), buf[len / 3..].to_vec());
    let protect_both = |rt: &mut Runtime, a: &mut Vec<u8>, b: &mut Vec<u8>| {
        // SAFETY: as in `protect`.
        unsafe { rt.protect(0, Region::host(a)) }.expect("protect 0");
        unsafe { rt.protect(1, Region::host(b)) }.expect("protect 1");
    };
    let mut rt = Runtime::init(w.comm, config.clone());
    for v in 1..=2 {
        let (mut a, mut b) = split(&content(w.rank, len, v));
        protect_both(&mut rt, &mut a, &mut b);
        rt.checkpoint(name, v).expect("checkpoint");
    }
    rt.finalize().expect("finalize");
    if w.rank == 0 {
        for tier in tiers(config) {
            let file = tier.join(name).join("rank-00000").join(dckpt::store::diff_file_name(2));
            let mut bytes = std::fs::read(&file).expect("read the newest diff");
            let mid = bytes.len() / 2;
            bytes[mid..].iter_mut().for_each(|b| *b ^= 0x5a);
            std::fs::write(&file, bytes).expect("damage it");
        }
    }
    w.comm.barrier();
    let (mut a, mut b) = (vec![0xeeu8; len / 3], vec![0xeeu8; len - len / 3]);
    let mut rt = Runtime::init(w.comm, config.clone());
    protect_both(&mut rt, &mut a, &mut b);
    let failed = rt.restart(name, 2);
    let code = failed.as_ref().err().map_or(0, |e| e.code() as u64);
    w.check(code != 0, "restarting the damaged version fails");
    w.check(same_everywhere(w, code), &format!("one code on every rank: {:?}", failed.err()));
    w.check(a.iter().chain(&b).all(|&x| x == 0xee), "no rank's region changed");
    rt.restart(name, 1).expect("the version before restores");
    w.check((a.clone(), b.clone()) == split(&content(w.rank, len, 1)), "version 1's bytes");
    rt.finalize().expect("finalize");
}

/// Rank 0's region table damaged on the persistent tier (the scratch copy
/// intact), and the last rank's deleted on every tier: the restart proceeds
/// (each table written again), and a job of another size reading the old
/// regions gets the old tables, none missing.
fn a_region_table_damaged_on_one_tier(w: &World, config: &Config) {
    let (name, len) = ("tables", 90_000 + 32 * w.rank as usize);
    take(w, config, name, len, 2);
    let table = |tier: &Path, rank: i32| tier.join(name).join("regions").join(format!("rank-{rank:05}.json"));
    if w.rank == 0 {
        let persistent = config.persistent.as_ref().expect("persistent");
        let path = table(persistent, 0);
        let mut bytes = std::fs::read(&path).expect("read the table");
        let last = bytes.len() - 3;
        bytes[last] ^= 0x01;
        std::fs::write(&path, bytes).expect("damage it");
    }
    if w.size > 1 && w.rank == w.size - 1 {
        for tier in tiers(config) {
            std::fs::remove_file(table(&tier, w.rank)).expect("delete the table");
        }
    }
    w.comm.barrier();
    let mut buf = vec![0u8; len];
    let mut rt = Runtime::init(w.comm, config.clone());
    protect(&mut rt, &mut buf);
    let restored = rt.restart_latest(name);
    w.check(matches!(restored, Ok(Some(2))), &format!("restart with a damaged table copy: {restored:?}"));
    w.check(buf == content(w.rank, len, 2), "version 2's bytes");
    let old = rt.old_regions(name).expect("every rank's table, written again");
    w.check(old.len() == w.size as usize, "one table a rank");
    w.check(old[w.rank as usize].regions[0].len == len as u64, "this rank's region");
    rt.finalize().expect("finalize");
}

/// The highest rank's region table deleted on every tier, read by a job of
/// one rank fewer: the commit records name the ranks that wrote it, so the
/// smaller job gets `RankCount` (it used to count the tables left and
/// restart the bigger job's state as its own, exit 0).
fn the_rank_count_comes_from_the_commit_records(w: &World, config: &Config) {
    if w.size < 2 {
        return;
    }
    let (name, len) = ("counted", 40_000);
    take(w, config, name, len, 1);
    if w.rank == w.size - 1 {
        for tier in tiers(config) {
            let path = tier.join(name).join("regions").join(format!("rank-{:05}.json", w.rank));
            std::fs::remove_file(path).expect("delete the table");
        }
    }
    w.comm.barrier();
    let color = if w.rank == w.size - 1 { 1 } else { 0 };
    let part = w.comm.split_by_color(mpi::topology::Color::with_value(color)).expect("split");
    if color == 0 {
        let mut buf = vec![0u8; len];
        let mut rt = Runtime::init(&part, config.clone());
        protect(&mut rt, &mut buf);
        let latest = rt.latest(name);
        w.check(
            matches!(&latest, Err(e) if e.kind() == dckpt::ErrorKind::RankCount),
            &format!("latest on {} of {} ranks, the last table gone: {latest:?}", part.size(), w.size),
        );
        let old = rt.old_regions(name);
        w.check(
            matches!(&old, Err(e) if e.kind() == dckpt::ErrorKind::MissingRegion),
            &format!("the old regions with a table missing: {old:?}"),
        );
        drop(rt);
    }
    w.comm.barrier();
}

/// The last rank's node directory (emulated nodes, one rank each, a
/// node-local tier alone) replaced by the same node's of another run of the
/// same name and sizes, its commit parts with it (a node restored from the
/// wrong backup): `restart` of any version is refused on every rank with
/// one code, before anything is read, and `restart_latest`, finding no
/// version of one run, starts from the beginning (every version set aside),
/// collective and local-only alike (both used to restart that rank from the
/// other run's state, exit 0).
fn another_run_s_directory(w: &World, config: &Config) {
    if w.size < 2 {
        return;
    }
    let name = if config.collective { "foreign" } else { "foreign-local" };
    let len = 60_000;
    let root = config.scratch.as_ref().expect("scratch").with_extension("nodes");
    let on_nodes = |run: &str| Config {
        scratch: Some(root.join(run).join("node-{node}")),
        persistent: None,
        ranks_per_node: 1,
        ..config.clone()
    };
    let (mine, other) = (on_nodes("mine"), on_nodes("other"));
    take(w, &mine, name, len, 2);
    // The other run: other bytes, the same versions.
    let mut buf = vec![0u8; len];
    let mut rt = Runtime::init(w.comm, other.clone());
    for v in 1..=2 {
        buf = content(w.rank + 100, len, v);
        protect(&mut rt, &mut buf);
        rt.checkpoint(name, v).expect("checkpoint of the other run");
    }
    rt.finalize().expect("finalize");
    if w.rank == w.size - 1 {
        let node = |run: &str| root.join(run).join(format!("node-{}", w.rank)).join(name);
        std::fs::remove_dir_all(node("mine")).expect("remove");
        std::fs::rename(node("other"), node("mine")).expect("put the other run's node directory in its place");
    }
    w.comm.barrier();
    let mut buf = vec![0u8; len];
    let mut rt = Runtime::init(w.comm, mine.clone());
    protect(&mut rt, &mut buf);
    let refused = rt.restart(name, 2);
    let code = refused.as_ref().err().map_or(0, |e| e.code() as u64);
    w.check(code != 0, &format!("another run's directory is refused: {refused:?}"));
    w.check(same_everywhere(w, code), "one code on every rank");
    let restarted = rt.restart_latest(name);
    w.check(matches!(restarted, Ok(None)), &format!("from the beginning: {restarted:?}"));
    w.check(buf.iter().all(|&b| b == 0), "nothing restored");
    w.check(rt.versions(name).expect("versions").is_empty(), "every version set aside");
    buf = content(w.rank, len, 1);
    protect(&mut rt, &mut buf);
    rt.checkpoint(name, 1).expect("the new run's first version proceeds");
    rt.finalize().expect("finalize");
    w.comm.barrier();
}

/// Partner copies made slowly (every version's protection delayed, as a
/// thread starved at the least priority would be): with `max_copy_lag = 1`
/// the calls wait for them, counted, and no call leaves more than one
/// version without its copies; without a bound, they fall behind.
fn copies_keep_up(w: &World, config: &Config) {
    if w.size < 2 {
        return;
    }
    let root = config.scratch.as_ref().expect("scratch").with_extension("lag");
    let len = 30_000;
    let mut seen = Vec::new();
    for (bound, name) in [(1u64, "bounded"), (0, "unbounded")] {
        let config = Config {
            scratch: Some(root.join("node-{node}")),
            persistent: None,
            ranks_per_node: 1,
            redundancy: "partner".parse().expect("partner"),
            max_copy_lag: bound,
            mode: dckpt::config::Mode::Async,
            ..config.clone()
        };
        dckpt::failpoint::delay("protect.version", std::time::Duration::from_millis(150));
        let mut buf = vec![0u8; len];
        let mut rt = Runtime::init(w.comm, config);
        for v in 1..=6 {
            buf = content(w.rank, len, v);
            protect(&mut rt, &mut buf);
            rt.checkpoint(name, v).expect("checkpoint");
        }
        let stats = rt.stats();
        dckpt::failpoint::delay("protect.version", std::time::Duration::ZERO);
        rt.finalize().expect("finalize");
        seen.push((stats.max_copy_lag_seen, stats.copy_waits));
    }
    let [(bounded_lag, bounded_waits), (free_lag, free_waits)] = seen[..] else { unreachable!() };
    w.check(bounded_lag <= 1 && bounded_waits >= 3, &format!("bounded: lag {bounded_lag}, {bounded_waits} waits"));
    w.check(free_lag >= 2 && free_waits == 0, &format!("unbounded: lag {free_lag}, {free_waits} waits"));
    w.comm.barrier();
}

/// Retention against copies not yet made: one scratch directory for every
/// emulated node (each rank its own node, none named in the path), so a
/// version commits there as soon as every rank's part is written, without
/// waiting for the copies; the copies come slowly and unbounded
/// (`max_copy_lag = 0`), one version kept, a baseline every 2. Retention
/// used to delete a rank's files before its partner copy was made: the
/// copies failed ("No such file") and `finalize` reported the version not
/// durable on the redundancy tier. Now it keeps what the copies still need,
/// and deletes it after.
fn retention_waits_for_the_copies(w: &World, config: &Config) {
    if w.size < 2 {
        return;
    }
    let root = config.scratch.as_ref().expect("scratch").with_extension("retained");
    let config = Config {
        scratch: Some(root.clone()),
        persistent: None,
        ranks_per_node: 1,
        redundancy: "partner".parse().expect("partner"),
        max_copy_lag: 0,
        max_versions: Some(1),
        max_chain: Some(2),
        mode: dckpt::config::Mode::Async,
        ..config.clone()
    };
    let len = 20_000;
    dckpt::failpoint::delay("protect.version", std::time::Duration::from_millis(60));
    let mut buf = vec![0u8; len];
    let mut rt = Runtime::init(w.comm, config);
    for v in 1..=10 {
        buf = content(w.rank, len, v);
        protect(&mut rt, &mut buf);
        rt.checkpoint("retained", v).expect("checkpoint");
    }
    let lag = rt.stats().max_copy_lag_seen;
    dckpt::failpoint::delay("protect.version", std::time::Duration::ZERO);
    let finalized = rt.finalize();
    w.check(finalized.is_ok(), &format!("finalize: {finalized:?}"));
    // Not vacuous: the copies lagged, and retention did delete old files.
    let mine = root.join("retained").join(format!("rank-{:05}", w.rank));
    let files = std::fs::read_dir(&mine)
        .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".dckpt")).count());
    w.check(lag >= 2, &format!("the copies kept up (lag {lag}): nothing to test"));
    w.check(matches!(files, Ok(n) if n < 10), &format!("retention deleted nothing: {files:?}"));
    w.comm.barrier();
}

/// A job of one rank fewer reading a store kept on node-local directories
/// only (one emulated node a rank, no `persistent`): the last old rank's
/// files are on a node this job does not have. Every rank of the smaller
/// job gets the same refusal from `old_regions`, naming the rank count to
/// restart with (it used to return the tables, and `read_region` then
/// failed on some ranks only: heat stopped on one rank and hung, or named
/// different checkpoints on a new node). On the old rank count the store
/// is read as always.
fn another_rank_count_on_node_local_directories(w: &World, config: &Config) {
    if w.size < 2 {
        return;
    }
    let root = config.scratch.as_ref().expect("scratch").with_extension("resized");
    let config =
        Config { scratch: Some(root.join("node-{node}")), persistent: None, ranks_per_node: 1, ..config.clone() };
    let (name, len) = ("resized", 30_000);
    take(w, &config, name, len, 2);
    let color = if w.rank == w.size - 1 { 1 } else { 0 };
    let part = w.comm.split_by_color(mpi::topology::Color::with_value(color)).expect("split");
    if color == 0 {
        let rt = Runtime::init(&part, config.clone());
        let old = rt.old_regions(name);
        let refused = matches!(&old, Err(e) if e.kind() == dckpt::ErrorKind::InvalidOption
            && e.to_string().contains(&format!("restart with {} ranks", w.size)));
        w.check(refused, &format!("another rank count on node-local directories: {old:?}"));
        drop(rt);
    }
    w.comm.barrier();
    let rt = Runtime::init(w.comm, config);
    let old = rt.old_regions(name);
    w.check(matches!(&old, Ok(t) if t.len() == w.size as usize), &format!("the old rank count: {old:?}"));
    drop(rt);
    w.comm.barrier();
}

/// Rank 0's commit part of the chain's baseline truncated on every tier:
/// no version of the chain is committed anywhere, and no older chain is
/// left. The job starts from the beginning on purpose, the same on every
/// rank, with the old versions set aside (listed no more); its new
/// versions proceed, and the next job restarts from them.
fn a_truncated_commit_part_of_the_baseline(w: &World, config: &Config) {
    let (name, len) = ("truncated", 24_000);
    take(w, config, name, len, 3);
    if w.rank == 0 {
        for tier in tiers(config) {
            let part = tier.join(name).join("commits").join("v000000000001.r000000.part");
            let bytes = std::fs::read(&part).expect("the baseline's part");
            std::fs::write(&part, &bytes[..bytes.len() / 2]).expect("truncate it");
        }
    }
    w.comm.barrier();
    let mut buf = vec![0u8; len];
    let mut rt = Runtime::init(w.comm, config.clone());
    protect(&mut rt, &mut buf);
    let restored = rt.restart_latest(name);
    w.check(matches!(restored, Ok(None)), &format!("a truncated baseline part: {restored:?}"));
    w.check(same_everywhere(w, u64::from(matches!(restored, Ok(None)))), "the same answer on every rank");
    let listed = rt.versions(name);
    w.check(matches!(&listed, Ok(v) if v.is_empty()), &format!("the old versions set aside: {listed:?}"));
    buf = content(w.rank, len, 1);
    protect(&mut rt, &mut buf);
    let taken = rt.checkpoint(name, 1);
    w.check(taken.is_ok(), &format!("the new version 1: {taken:?}"));
    rt.finalize().expect("finalize");
    next_job_restarts(w, config, name, len, 1, "the next job");
}

/// A flipped byte in rank 0's `MANIFEST`, on one tier and then on every
/// tier: the restart mends it from the rank's verified files and restarts
/// from the newest version, the same on every rank (it used to stop
/// every run until `dckpt repair`).
fn a_damaged_manifest(w: &World, config: &Config) {
    let len = 20_000;
    for (name, every_tier) in [("manifest-one", false), ("manifest-all", true)] {
        take(w, config, name, len, 3);
        if w.rank == 0 {
            for tier in tiers(config).into_iter().take(if every_tier { 2 } else { 1 }) {
                let path = tier.join(name).join("rank-00000").join("MANIFEST");
                let mut bytes = std::fs::read(&path).expect("the manifest");
                let at = bytes.len() / 2;
                bytes[at] ^= 0x20;
                std::fs::write(&path, bytes).expect("damage it");
            }
        }
        w.comm.barrier();
        next_job_restarts(w, config, name, len, 3, &format!("{name}: a damaged MANIFEST"));
    }
}

/// A restart while the job before still holds the store (its ranks still
/// ending, as after a Ctrl-C): one error on every rank, `Locked`, naming
/// the writer; nothing set aside (it used to fall back version by
/// version and set aside the newer ones as damaged once the old job was
/// gone). Once the writer has finished, the next job restarts from the
/// newest version.
fn a_store_still_in_use(w: &World, config: &Config) {
    let (name, len) = ("in-use", 30_000);
    let mut buf = vec![0u8; len];
    let mut writer = Runtime::init(w.comm, config.clone());
    for v in 1..=3 {
        buf = content(w.rank, len, v);
        protect(&mut writer, &mut buf);
        writer.checkpoint(name, v).expect("checkpoint");
    }
    writer.wait(name, 3).expect("durable");
    let mut mine = vec![0u8; len];
    let mut second = Runtime::init(w.comm, config.clone());
    protect(&mut second, &mut mine);
    let restored = second.restart_latest(name);
    let kind = restored.as_ref().err().map(dckpt::Error::kind);
    w.check(kind == Some(dckpt::ErrorKind::Locked), &format!("a store in use: {restored:?}"));
    w.check(same_everywhere(w, u64::from(kind == Some(dckpt::ErrorKind::Locked))), "the same error everywhere");
    w.check(
        restored.as_ref().err().is_some_and(|e| e.to_string().contains("another writer")),
        &format!("the error says why: {restored:?}"),
    );
    second.finalize().expect("finalize the second");
    writer.finalize().expect("finalize the writer");
    next_job_restarts(w, config, name, len, 3, "after the writer finished");
}
