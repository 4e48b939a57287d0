//! Trying to break the store the way issue #8 did, through the `dckpt`
//! command: SIGKILL at random moments (one rank, and `mpirun -np 3`
//! collective jobs), two writers at once, planted symbolic links, restores
//! onto the store's own files, a damaged newest chain, a missing manifest, a
//! path through a missing directory, leftovers of a killed first
//! checkpoint, a full disk. The promise checked after each: every listed
//! version restores byte-exactly (or fails with a clear error), and the next
//! checkpoint proceeds. Every loop is bounded in iterations and in time.
#![allow(clippy::unwrap_used)] // tests may panic on setup failures

mod common;

use common::{SmallFs, noise};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn dckpt() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dckpt"))
}

fn run(args: &[&str]) -> Output {
    dckpt().args(args).output().expect("run dckpt")
}

fn ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("test paths are UTF-8")
}

/// A small deterministic generator for delays and edits.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n.max(1)
    }
}

/// The input of version `v`: a base with edits that depend on `v`.
fn version_data(len: usize, v: u64) -> Vec<u8> {
    let mut d = noise(len, 1);
    let mut r = Lcg(v);
    for _ in 0..40 {
        let at = r.next((len - 256) as u64) as usize;
        d[at..at + 200].copy_from_slice(&noise(200, v * 1000 + at as u64));
    }
    d
}

/// Writes version `v` of a `len`-byte input and checkpoints it through the CLI.
fn put_version(dir: &Path, input: &Path, v: u64, len: usize, extra: &[&str]) {
    std::fs::write(input, version_data(len, v)).unwrap();
    let version = v.to_string();
    let mut args = vec!["checkpoint", "--dir", s(dir), "--version", &version];
    args.extend_from_slice(extra);
    args.push(s(input));
    ok(&args);
}

/// Versions listed for `rank` (manifest and commit records, as every reader sees them).
fn listed(dir: &Path, rank: u32) -> Vec<u64> {
    match dckpt::store::Store::open(dir, rank) {
        Ok(st) => st.manifest().versions.iter().map(|v| v.version).collect(),
        Err(dckpt::Error::NoStore { .. }) => Vec::new(),
        Err(e) => panic!("store of rank {rank} unreadable after a kill: {e}"),
    }
}

fn restore(dir: &Path, rank: u32, v: u64) -> dckpt::Result<Vec<u8>> {
    dckpt::restore::restore_version(dir, rank, v)
}

fn temp_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(temp_files(&p));
        } else if p.to_string_lossy().ends_with(".tmp") {
            out.push(p);
        }
    }
    out
}

fn kill_after(mut child: Child, delay: Duration) {
    std::thread::sleep(delay);
    let _ = child.kill(); // SIGKILL; it may have finished already
    let _ = child.wait();
}

#[test]
fn sigkill_at_any_moment_leaves_a_store_that_restores_and_continues() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("store");
    let len = 1 << 20;
    let mut rng = Lcg(11);
    let mut expected: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut v = 1u64;
    let deadline = Instant::now() + Duration::from_secs(25);
    let mut kills = 0;
    while kills < 30 && Instant::now() < deadline {
        let data = version_data(len, v);
        let input = t.path().join("in.bin");
        std::fs::write(&input, &data).unwrap();
        let args = ["checkpoint", "--dir", s(&dir), "--version", &v.to_string(), "--chunk-size", "64", s(&input)];
        let child = dckpt().args(args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        kill_after(child, Duration::from_micros(rng.next(60_000)));
        kills += 1;
        let now = listed(&dir, 0);
        if now.contains(&v) {
            expected.insert(v, data.clone());
        }
        assert_eq!(now, expected.keys().copied().collect::<Vec<_>>(), "only completed versions are listed");
        for (&w, want) in &expected {
            assert!(restore(&dir, 0, w).unwrap() == *want, "version {w} after kill {kills}");
        }
        // An un-killed checkpoint proceeds: the same version again if it was not committed.
        if expected.contains_key(&v) {
            v += 1;
        }
        let data = version_data(len, v);
        std::fs::write(&input, &data).unwrap();
        ok(&["checkpoint", "--dir", s(&dir), "--version", &v.to_string(), "--chunk-size", "64", s(&input)]);
        expected.insert(v, data);
        assert!(temp_files(&dir).is_empty(), "a writer's open removes what killed writes left");
        v += 1;
    }
    assert!(ok(&["verify", "--dir", s(&dir)]).starts_with("ok: 1 ranks"));
}

#[test]
fn two_writers_at_once_never_report_a_version_that_is_not_there() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("store");
    let len = 1 << 20;
    let (a, b) = (t.path().join("a.bin"), t.path().join("b.bin"));
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut v = 1u64;
    for round in 0..30 {
        if Instant::now() > deadline {
            break;
        }
        let (da, db) = (version_data(len, 2 * v), version_data(len, 2 * v + 1));
        std::fs::write(&a, &da).unwrap();
        std::fs::write(&b, &db).unwrap();
        // Even rounds race for the same version, odd rounds for two versions.
        let (va, vb) = if round % 2 == 0 { (v, v) } else { (v, v + 1) };
        let spawn = |ver: u64, f: &Path| {
            dckpt()
                .args(["checkpoint", "--dir", s(&dir), "--version", &ver.to_string(), "--chunk-size", "64", s(f)])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (ca, cb) = (spawn(va, &a), spawn(vb, &b));
        let (oa, ob) = (ca.wait_with_output().unwrap(), cb.wait_with_output().unwrap());
        let now = listed(&dir, 0);
        for (out, ver, data) in [(&oa, va, &da), (&ob, vb, &db)] {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!err.contains("panicked"), "{err}");
            if out.status.success() {
                assert!(now.contains(&ver), "round {round}: a writer exited 0 for version {ver}, which is not listed");
                assert!(restore(&dir, 0, ver).unwrap() == *data, "round {round}: version {ver} holds other bytes");
            } else {
                assert!(err.contains("another writer") || err.contains("not newer"), "round {round}: {err}");
            }
        }
        v = now.last().copied().unwrap_or(0) + 1;
    }
    assert!(ok(&["verify", "--dir", s(&dir)]).starts_with("ok: 1 ranks"));
}

#[test]
fn planted_links_and_store_files_are_never_written_through() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("store");
    let input = t.path().join("in.bin");
    let victim = t.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    std::fs::write(&input, version_data(50_000, 1)).unwrap();
    ok(&["checkpoint", "--dir", s(&dir), "--version", "1", s(&input)]);
    let rank = dir.join("rank-00000");
    // A link where version 2's file goes, and at the old fixed temporary names.
    for name in ["v000000000002.dckpt", "v000000000002.tmp", "MANIFEST.tmp"] {
        std::os::unix::fs::symlink(&victim, rank.join(name)).unwrap();
    }
    std::fs::write(&input, version_data(50_000, 2)).unwrap();
    ok(&["checkpoint", "--dir", s(&dir), "--version", "2", s(&input)]);
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert!(restore(&dir, 0, 2).unwrap() == version_data(50_000, 2));
    // A link planted as the lock: refused, not followed.
    std::fs::remove_file(rank.join("LOCK")).unwrap();
    std::os::unix::fs::symlink(&victim, rank.join("LOCK")).unwrap();
    let out = run(&["checkpoint", "--dir", s(&dir), "--version", "3", s(&input)]);
    assert!(!out.status.success(), "a linked lock file must be refused");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    std::fs::remove_file(rank.join("LOCK")).unwrap();
    // Restores never write through a link, onto a store file, or over a block device.
    let own = rank.join("v000000000001.dckpt");
    for out in [victim.with_file_name("link"), own.clone(), rank.join("MANIFEST"), dir.join("new.bin")] {
        if out.ends_with("link") {
            std::os::unix::fs::symlink(&own, &out).unwrap();
        }
        let o = run(&["restore", "--dir", s(&dir), "--version", "1", "--output", s(&out)]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains("refused: not written"), "{}: {err}", out.display());
    }
    ok(&["restore", "--dir", s(&dir), "--version", "1", "--output", "/dev/null"]);
    assert!(ok(&["verify", "--dir", s(&dir)]).starts_with("ok: 1 ranks, 2 versions"));
}

#[test]
fn a_damaged_newest_chain_becomes_a_baseline_and_repair_delists_it() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("store");
    let input = t.path().join("in.bin");
    for v in 1..=4u64 {
        put_version(&dir, &input, v, 60_000, &["--chunk-size", "64"]);
    }
    let rank = dir.join("rank-00000");
    std::fs::remove_file(rank.join("v000000000004.dckpt")).unwrap();
    std::fs::write(&input, version_data(60_000, 5)).unwrap();
    let out = run(&["checkpoint", "--dir", s(&dir), "--version", "5", "--chunk-size", "64", s(&input)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(err.lines().filter(|l| l.contains("warning")).count(), 1, "{err}");
    assert!(err.contains("version 4") && err.contains("baseline"), "{err}");
    assert!(ok(&["checkpoint", "--dir", s(&dir), "--version", "6", "--chunk-size", "64", s(&input)]).contains("bytes"));
    for v in [1, 2, 3, 5, 6] {
        let want = version_data(60_000, v.min(5));
        assert!(restore(&dir, 0, v).unwrap() == want, "version {v}");
    }
    assert!(restore(&dir, 0, 4).unwrap_err().to_string().contains("v000000000004.dckpt"));
    assert!(!run(&["verify", "--dir", s(&dir)]).status.success());
    let report = ok(&["repair", "--dir", s(&dir)]);
    assert!(report.contains("v000000000004.dckpt") && report.contains("delisted"), "{report}");
    assert!(ok(&["verify", "--dir", s(&dir)]).starts_with("ok: 1 ranks, 5 versions"));
}

#[test]
fn a_missing_manifest_or_a_detour_path_never_starts_a_new_history() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("st");
    let input = t.path().join("in.bin");
    for v in 1..=3u64 {
        put_version(&dir, &input, v, 40_000, &[]);
    }
    // Through a missing directory: the same store, history kept.
    let detour = t.path().join("ghost/../st");
    std::fs::write(&input, version_data(40_000, 4)).unwrap();
    let out = run(&["checkpoint", "--dir", s(&detour), "--version", "1", s(&input)]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not newer"));
    ok(&["checkpoint", "--dir", s(&detour), "--version", "4", s(&input)]);
    assert!(ok(&["verify", "--dir", s(&dir)]).starts_with("ok: 1 ranks, 4 versions"));
    // A deleted manifest: refused with the way out, nothing written.
    let manifest = dir.join("rank-00000/MANIFEST");
    std::fs::remove_file(&manifest).unwrap();
    std::fs::write(&input, version_data(40_000, 5)).unwrap();
    let out = run(&["checkpoint", "--dir", s(&dir), "--version", "5", s(&input)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("MANIFEST is missing") && err.contains("repair"), "{err}");
    assert!(!manifest.exists());
    let report = ok(&["repair", "--dir", s(&dir)]);
    assert!(report.contains("rebuilt from 4 diff file(s)"), "{report}");
    for v in 1..=4u64 {
        assert!(restore(&dir, 0, v).unwrap() == version_data(40_000, v), "version {v}");
    }
    ok(&["checkpoint", "--dir", s(&dir), "--version", "5", s(&input)]);
}

#[test]
fn leftovers_of_a_killed_first_checkpoint_block_nothing() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("store");
    let input = t.path().join("in.bin");
    std::fs::write(&input, version_data(40_000, 1)).unwrap();
    ok(&["checkpoint", "--dir", s(&dir), "--version", "1", s(&input)]);
    // Rank 1's first checkpoint died before its manifest existed.
    let r1 = dir.join("rank-00001");
    std::fs::create_dir_all(&r1).unwrap();
    std::fs::write(r1.join(".v000000000001.dckpt.123.0.0.tmp"), b"partial").unwrap();
    assert!(ok(&["verify", "--dir", s(&dir)]).starts_with("ok: 1 ranks, 1 versions"));
    assert!(ok(&["inspect", "--dir", s(&dir)]).contains(" on disk ("));
    ok(&["checkpoint", "--dir", s(&dir), "--rank", "1", "--version", "1", s(&input)]);
    assert!(temp_files(&dir).is_empty());
    assert!(ok(&["verify", "--dir", s(&dir)]).starts_with("ok: 2 ranks, 2 versions"));
}

#[test]
fn a_full_disk_is_a_clear_error_and_older_versions_stay() {
    let t = tempfile::tempdir().unwrap();
    let Some(fs) = SmallFs::mount(&t.path().join("mnt"), "4m") else {
        println!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    };
    let dir = fs.0.join("store");
    let input = t.path().join("in.bin");
    let len = 1 << 20;
    std::fs::write(&input, version_data(len, 1)).unwrap();
    ok(&["checkpoint", "--dir", s(&dir), "--version", "1", s(&input)]);
    // Fill the disk, leaving less than version 2 needs.
    let filler = fs.0.join("filler");
    let free = 4 * 1024 * 1024 - dckpt::inspect::bytes_on_disk(&fs.0) as usize;
    std::fs::write(&filler, vec![1u8; free.saturating_sub(20_000)]).ok();
    let mut v2 = version_data(len, 2);
    v2[..300_000].copy_from_slice(&noise(300_000, 77));
    std::fs::write(&input, &v2).unwrap();
    let out = run(&["checkpoint", "--dir", s(&dir), "--version", "2", s(&input)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("no space left"), "{err}");
    assert!(!err.contains("panicked"));
    assert!(restore(&dir, 0, 1).unwrap() == version_data(len, 1));
    assert!(temp_files(&dir).is_empty(), "a failed write removes its temporary file");
    std::fs::remove_file(&filler).unwrap();
    ok(&["checkpoint", "--dir", s(&dir), "--version", "2", s(&input)]);
    assert!(restore(&dir, 0, 2).unwrap() == v2);
}

/// `mpirun` with the flags CI needs (root, more ranks than cores).
#[cfg(feature = "mpi")]
fn mpirun(np: usize) -> Command {
    let mut c = Command::new("mpirun");
    c.args(["--oversubscribe", "-np", &np.to_string()])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .arg(env!("CARGO_BIN_EXE_dckpt"));
    c
}

/// Pids of processes (other than this test) whose command line mentions `needle`.
#[cfg(feature = "mpi")]
fn pids_mentioning(needle: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
        })
        .collect()
}

/// SIGKILLs `pids`.
#[cfg(feature = "mpi")]
fn sigkill(pids: &[i32]) {
    for &p in pids {
        let _ = Command::new("kill").args(["-9", &p.to_string()]).status();
    }
}

/// Kills a whole job (mpirun and every rank: killing mpirun alone leaves
/// its ranks running) and waits until none is left.
#[cfg(feature = "mpi")]
fn kill_job(child: &mut Child, needle: &str) {
    let _ = child.kill();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let left = pids_mentioning(needle);
        if left.is_empty() || Instant::now() > until {
            break;
        }
        sigkill(&left);
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = child.wait();
}

/// Rank r's input at version v: a part all ranks share and a private part.
#[cfg(feature = "mpi")]
fn rank_data(r: u32, v: u64) -> Vec<u8> {
    let mut d = version_data(300_000, v);
    d[200_000..].copy_from_slice(&noise(100_000, 1000 * u64::from(r) + v));
    d
}

#[cfg(feature = "mpi")]
#[test]
fn killed_collective_jobs_commit_everywhere_or_nowhere() {
    let ranks = 3u32;
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("store");
    let mut rng = Lcg(5);
    let mut committed: Vec<u64> = Vec::new();
    let mut v = 1u64;
    let deadline = Instant::now() + Duration::from_secs(40);
    let write_inputs = |v: u64| {
        for r in 0..ranks {
            std::fs::write(t.path().join(format!("in-{r}.bin")), rank_data(r, v)).unwrap();
        }
    };
    let pattern = t.path().join("in-{rank}.bin");
    let job = |v: u64| {
        let mut c = mpirun(ranks as usize);
        c.args(["checkpoint", "--collective", "--dir", s(&dir), "--version", &v.to_string(), s(&pattern)]);
        c
    };
    let (mut killed_before_commit, mut killed_after_commit) = (0, 0);
    for attempt in 0..24 {
        if Instant::now() > deadline {
            break;
        }
        write_inputs(v);
        let mut child = job(v).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        let needle = s(&dir).to_string();
        if attempt % 2 == 0 {
            // As soon as the first rank's commit part of the version appears
            // (the others may still be writing theirs), SIGKILL one rank
            // (mpirun then aborts the others), or, every other time, the
            // whole job.
            let part_of_v = |name: &str| dckpt::store::commits::parse_part_name(name).is_some_and(|(pv, _)| pv == v);
            let until = Instant::now() + Duration::from_secs(5);
            while Instant::now() < until {
                let parts = std::fs::read_dir(dir.join("commits"))
                    .map(|d| d.flatten().any(|e| part_of_v(&e.file_name().to_string_lossy())))
                    .unwrap_or(false);
                if parts || child.try_wait().unwrap().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            if attempt % 4 == 0 {
                let ranks_only: Vec<i32> =
                    pids_mentioning(&needle).into_iter().filter(|&p| p != child.id() as i32).collect();
                if let Some(&one) = ranks_only.get(rng.next(ranks_only.len() as u64) as usize) {
                    sigkill(&[one]);
                }
                // mpirun notices and ends the job; make sure nothing is left.
                let until = Instant::now() + Duration::from_secs(10);
                while child.try_wait().unwrap().is_none() && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            kill_job(&mut child, &needle);
        } else {
            std::thread::sleep(Duration::from_millis(rng.next(400)));
            kill_job(&mut child, &needle);
        }
        // Every rank lists the same versions, and each restores byte-exactly.
        let lists: Vec<Vec<u64>> = (0..ranks).map(|r| listed(&dir, r)).collect();
        assert!(lists.iter().all(|l| *l == lists[0]), "attempt {attempt}: ranks disagree: {lists:?}");
        if lists[0].contains(&v) {
            committed.push(v);
            killed_after_commit += 1;
        } else {
            killed_before_commit += 1;
        }
        assert_eq!(lists[0], committed, "attempt {attempt}");
        for &w in &committed {
            for r in 0..ranks {
                assert!(restore(&dir, r, w).unwrap() == rank_data(r, w), "attempt {attempt}: rank {r} version {w}");
            }
        }
        // The next job proceeds, un-killed.
        if committed.contains(&v) {
            v += 1;
            write_inputs(v);
        }
        let out = job(v).output().unwrap();
        assert!(out.status.success(), "attempt {attempt}: {}", String::from_utf8_lossy(&out.stderr));
        committed.push(v);
        v += 1;
    }
    println!("killed jobs: {killed_before_commit} before the commit, {killed_after_commit} after");
    assert!(ok(&["verify", "--dir", s(&dir)]).starts_with("ok: 3 ranks"));
}

/// Found by trying to break it (review of issue #8): each of these once
/// wedged a store, lost history or reported the wrong thing.
#[test]
fn stray_names_and_planted_directories_do_not_confuse_or_block() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("store");
    let input = t.path().join("in.bin");
    std::fs::write(&input, version_data(30_000, 1)).unwrap();
    ok(&["checkpoint", "--dir", s(&dir), "--version", "1", s(&input)]);
    // Not ranks: a file with a rank's name, other spellings, an alias link.
    std::fs::write(dir.join("rank-00001"), b"x").unwrap();
    std::fs::create_dir_all(dir.join("rank-1")).unwrap();
    std::fs::create_dir_all(dir.join("rank-+0")).unwrap();
    assert!(ok(&["verify", "--dir", s(&dir)]).starts_with("ok: 1 ranks, 1 versions"));
    let json: serde_json::Value = serde_json::from_str(&ok(&["inspect", "--dir", s(&dir), "--json"])).unwrap();
    assert_eq!(json["ranks"].as_array().unwrap().len(), 1, "{json}");
    // A link aliasing rank 0 as rank 2: verify names the mismatch, repair leaves it alone.
    std::os::unix::fs::symlink(dir.join("rank-00000"), dir.join("rank-00002")).unwrap();
    let out = run(&["verify", "--dir", s(&dir)]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("rank-00002") && said.contains("symbolic link"), "{said}");
    let report = ok(&["repair", "--dir", s(&dir)]);
    assert!(report.contains("left alone"), "{report}");
    assert!(restore(&dir, 0, 1).unwrap() == version_data(30_000, 1), "repair never touches a rank through an alias");
    std::fs::remove_file(dir.join("rank-00002")).unwrap();
    // A directory where a leftover file could be does not block the next checkpoint.
    std::fs::create_dir_all(dir.join("rank-00000/v000000000009.dckpt")).unwrap();
    std::fs::write(&input, version_data(30_000, 2)).unwrap();
    ok(&["checkpoint", "--dir", s(&dir), "--version", "2", s(&input)]);
    assert!(restore(&dir, 0, 2).unwrap() == version_data(30_000, 2));
}

#[test]
fn repair_under_a_tiny_fd_limit_fails_or_keeps_every_version() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("store");
    let mut engine = dckpt::Engine::open_or_create(&dir, 0, 4096, &common::opts(dckpt::Method::Tree, 32)).unwrap();
    for v in 1..=120u64 {
        engine.checkpoint(v, &version_data(4096, v % 7)).unwrap();
    }
    drop(engine);
    let bin = env!("CARGO_BIN_EXE_dckpt");
    let st = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -n 10; exec {bin} repair --dir {}", s(&dir)))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&st.stdout);
    assert!(!out.contains("delisted") && !out.contains("damaged"), "a machine limit is not damage: {out}");
    assert!(ok(&["verify", "--dir", s(&dir)]).starts_with("ok: 1 ranks, 120 versions"));
    assert!(restore(&dir, 0, 120).unwrap() == version_data(4096, 120 % 7));
}

#[test]
fn damaged_and_stale_commit_records_never_wedge_the_store() {
    use dckpt::store::commits::{CommitRecord, RankEntry};
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("store");
    // Two ranks written with the library, committed with records as a
    // collective job would; version 3 in no manifest yet.
    let o = common::opts(dckpt::Method::Tree, 64);
    two_rank_job(&dir, [&o, &o], 3, 2);
    // Version 3 is committed by its record alone (no manifest lists it yet): restores see it.
    assert!(restore(&dir, 1, 3).unwrap() == version_data(20_000, 31));
    // Damage that record: other versions still restore, the writer keeps v3's files.
    let rec = dir.join("commits/v000000000003.commit");
    let mut b = std::fs::read(&rec).unwrap();
    b[20] ^= 1;
    std::fs::write(&rec, &b).unwrap();
    assert!(restore(&dir, 0, 2).unwrap() == version_data(20_000, 20));
    drop(dckpt::Engine::open_or_create(&dir, 0, 20_000, &o).unwrap());
    assert!(dir.join("rank-00000/v000000000003.dckpt").exists(), "files of a damaged record are not removed");
    assert!(!run(&["verify", "--dir", s(&dir)]).status.success());
    // A stale record for a version no rank has.
    let stale = CommitRecord {
        version: 1 << 33,
        ranks: 2,
        entries: (0..2)
            .map(|r| RankEntry { rank: r, baseline: true, file_len: 99, trailer: "00".repeat(32) })
            .collect(),
    };
    stale.write(&dir).unwrap();
    let report = ok(&["repair", "--dir", s(&dir)]);
    assert!(report.contains("v000000000003.commit") && report.contains("v008589934592.commit"), "{report}");
    assert!(dir.join("rank-00000/v000000000003.dckpt.damaged").exists(), "set aside, not deleted");
    assert!(ok(&["verify", "--dir", s(&dir)]).starts_with("ok: 2 ranks, 4 versions"), "v1, v2 on both ranks");
    std::fs::write(t.path().join("in.bin"), version_data(20_000, 4)).unwrap();
    ok(&["checkpoint", "--dir", s(&dir), "--version", "4", "--chunk-size", "64", s(&t.path().join("in.bin"))]);
    assert!(restore(&dir, 0, 4).unwrap() == version_data(20_000, 4));
}

/// One node's directory of a store spread over nodes (here: rank 1's
/// directory alone, the commit records naming ranks 0 and 1): repair
/// refuses unchanged, naming what to do (it used to delist every version,
/// wedging the job); `--ranks-lost` says the other ranks are gone for good.
#[test]
fn repair_of_one_node_s_directory_is_refused_unchanged() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("store");
    let o = common::opts(dckpt::Method::Tree, 64);
    two_rank_job(&dir, [&o, &o], 3, 3);
    let elsewhere = t.path().join("rank-0-on-another-node");
    std::fs::rename(dir.join("rank-00000"), &elsewhere).unwrap();
    let listing = |d: &Path| {
        let mut names: Vec<String> = walk(d).into_iter().map(|p| p.display().to_string()).collect();
        names.sort();
        names
    };
    let before = listing(&dir);
    let out = run(&["repair", "--dir", s(&dir)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("[0]") && err.contains("--ranks-lost"), "{err}");
    assert_eq!(listing(&dir), before, "nothing changed");
    // Both ranks' directories in place: nothing to do, every version kept.
    std::fs::rename(&elsewhere, dir.join("rank-00000")).unwrap();
    ok(&["repair", "--dir", s(&dir)]);
    assert!(ok(&["verify", "--dir", s(&dir)]).starts_with("ok: 2 ranks, 6 versions"));
    // Rank 0 lost for good, said so: the versions needing it are delisted.
    std::fs::remove_dir_all(dir.join("rank-00000")).unwrap();
    let report = ok(&["repair", "--dir", s(&dir), "--ranks-lost"]);
    assert!(report.contains("whose directory is missing"), "{report}");
}

fn walk(d: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(d).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

#[test]
fn repair_delists_every_version_whose_chain_ran_through_a_damaged_one() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("store");
    let input = t.path().join("in.bin");
    for v in 1..=4u64 {
        put_version(&dir, &input, v, 60_000, &["--chunk-size", "64"]);
    }
    // Damage a data byte of version 2 (after its 96-byte header and tables).
    let v2 = dir.join("rank-00000/v000000000002.dckpt");
    let mut b = std::fs::read(&v2).unwrap();
    let at = b.len() - 32 * 3 - 100;
    b[at] ^= 0x40;
    std::fs::write(&v2, &b).unwrap();
    let report = ok(&["repair", "--dir", s(&dir)]);
    for v in ["v000000000002", "v000000000003", "v000000000004"] {
        assert!(report.contains(v), "{v} must be delisted: {report}");
    }
    // Never other bytes: what stays listed restores exactly, the rest is a clear error.
    assert!(ok(&["verify", "--dir", s(&dir)]).starts_with("ok: 1 ranks, 1 versions"));
    assert!(restore(&dir, 0, 1).unwrap() == version_data(60_000, 1));
    assert!(restore(&dir, 0, 3).is_err());
    std::fs::write(&input, version_data(60_000, 5)).unwrap();
    ok(&["checkpoint", "--dir", s(&dir), "--version", "5", "--chunk-size", "64", s(&input)]);
    assert!(restore(&dir, 0, 5).unwrap() == version_data(60_000, 5));
}

/// Writes versions `1..=last` of two ranks as the earlier synchronous
/// collective driver committed them (one record each; still read), each rank's manifest listing those up to
/// `listed_through`; rank `r` opens with `opts[r]`.
fn two_rank_job(dir: &Path, opts: [&dckpt::store::StoreOptions; 2], last: u64, listed_through: u64) {
    use dckpt::store::commits::{CommitRecord, RankEntry};
    let mut engines: Vec<dckpt::Engine> =
        (0..2).map(|r| dckpt::Engine::open_or_create(dir, r, 20_000, opts[r as usize]).unwrap()).collect();
    for v in 1..=last {
        let mut entries = Vec::new();
        for (r, e) in engines.iter_mut().enumerate() {
            let data = version_data(20_000, 10 * v + r as u64);
            let local = e.deduplicate_local(v, dckpt::memory::Protected::Host(&data)).unwrap();
            let staged = e.stage(local, &data).unwrap();
            let en = staged.entry().clone();
            entries.push(RankEntry {
                rank: r as u32,
                baseline: en.baseline,
                file_len: en.file_len,
                trailer: en.trailer,
            });
            if v <= listed_through {
                e.publish(staged).unwrap();
            }
        }
        CommitRecord { version: v, ranks: 2, entries }.write(dir).unwrap();
    }
}

/// Flips a data byte of `rank`'s version `v`.
fn damage(dir: &Path, rank: u32, v: u64) {
    let path = dir.join(format!("rank-{rank:05}/v{v:012}.dckpt"));
    let mut b = std::fs::read(&path).unwrap();
    let at = b.len() - 32 * 3 - 60;
    b[at] ^= 0x40;
    std::fs::write(&path, &b).unwrap();
}

/// The same when the ranks' chains differ (rank 1 starts a new chain at
/// v4, rank 0's v4 builds on the damaged v3): v4, which still restores on
/// rank 1, goes there too, because the job's v4 is gone on rank 0.
#[test]
fn repair_spreads_a_version_delisted_with_its_chain_to_every_rank() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("store");
    let o = common::opts(dckpt::Method::Tree, 64);
    let short = dckpt::store::StoreOptions { max_chain: Some(3), ..o.clone() };
    two_rank_job(&dir, [&o, &short], 4, 4);
    let baselines = |r: u32| -> Vec<u64> {
        dckpt::store::Store::open(&dir, r)
            .unwrap()
            .manifest()
            .versions
            .iter()
            .filter(|e| e.baseline)
            .map(|e| e.version)
            .collect()
    };
    assert_eq!((baselines(0), baselines(1)), (vec![1], vec![1, 4]), "the setup: rank 1's v4 is a baseline");
    damage(&dir, 0, 3);
    let report = ok(&["repair", "--dir", s(&dir)]);
    assert_eq!((listed(&dir, 0), listed(&dir, 1)), (vec![1, 2], vec![1, 2]), "{report}");
    assert!(ok(&["verify", "--dir", s(&dir)]).starts_with("ok: 2 ranks, 4 versions"));
}

/// Issue #28: damage to a collective version on one rank only. `repair`
/// once delisted it there alone; the other ranks kept listing it, so the
/// job's next checkpoints were refused as "not newer". Now every rank's
/// manifest agrees (the version and the chain after it go everywhere).
#[test]
fn repair_makes_every_ranks_manifest_agree_on_a_collective_version() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("store");
    let o = common::opts(dckpt::Method::Tree, 64);
    two_rank_job(&dir, [&o, &o], 4, 4);
    assert_eq!((listed(&dir, 0), listed(&dir, 1)), (vec![1, 2, 3, 4], vec![1, 2, 3, 4]));
    damage(&dir, 0, 3);
    let report = ok(&["repair", "--dir", s(&dir)]);
    assert!(report.contains("rank-00001") && report.contains("v000000000003"), "{report}");
    // Both ranks list what the job can restart, and it restores exactly.
    assert_eq!((listed(&dir, 0), listed(&dir, 1)), (vec![1, 2], vec![1, 2]), "{report}");
    for r in 0..2u32 {
        for v in 1..=2u64 {
            assert!(restore(&dir, r, v).unwrap() == version_data(20_000, 10 * v + u64::from(r)));
        }
    }
    assert!(ok(&["verify", "--dir", s(&dir)]).starts_with("ok: 2 ranks, 4 versions"));
    // The job goes on from version 3 on every rank.
    let mut engines: Vec<dckpt::Engine> =
        (0..2).map(|r| dckpt::Engine::open_or_create(&dir, r, 20_000, &o).unwrap()).collect();
    for (r, e) in engines.iter_mut().enumerate() {
        let data = version_data(20_000, 99 + r as u64);
        e.checkpoint(3, dckpt::memory::Protected::Host(&data)).unwrap();
        assert!(restore(&dir, r as u32, 3).unwrap() == data);
    }
}
