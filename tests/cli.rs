//! The `dckpt` command as a user runs it: the contract forms, and one clear
//! line on stderr with a non-zero exit for bad input, never a panic and
//! never a partly written version.
#![allow(clippy::unwrap_used)] // tests may panic on setup failures

mod common;

use common::noise;
use std::path::Path;
use std::process::{Command, Output};

fn dckpt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dckpt")).args(args).output().expect("run dckpt")
}

fn ok(args: &[&str]) -> String {
    let out = dckpt(args);
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn fails(args: &[&str], needle: &str) {
    let out = dckpt(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    assert!(err.contains(needle), "{args:?}: expected '{needle}' in: {err}");
}

fn s(p: &Path) -> &str {
    p.to_str().expect("test paths are UTF-8")
}

#[test]
fn checkpoint_restore_verify_inspect_round_trip() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("store");
    let mut data = noise(10_000, 1);
    let mut files = Vec::new();
    for v in 1..=4 {
        data[v * 1000..v * 1000 + 100].copy_from_slice(&noise(100, v as u64));
        let f = t.path().join(format!("in{v}.bin"));
        std::fs::write(&f, &data).unwrap();
        ok(&[
            "checkpoint",
            "--dir",
            s(&dir),
            "--version",
            &v.to_string(),
            "--rank",
            "2",
            "--method",
            "tree",
            "--chunk-size",
            "64",
            "--hash",
            "xxh3",
            s(&f),
        ]);
        files.push(f);
    }
    for (v, f) in files.iter().enumerate() {
        let out = t.path().join(format!("out{v}.bin"));
        ok(&["restore", "--dir", s(&dir), "--version", &(v + 1).to_string(), "--rank", "2", "--output", s(&out)]);
        assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(f).unwrap());
        let part = t.path().join(format!("part{v}.bin"));
        let v_s = (v + 1).to_string();
        ok(&[
            "restore",
            "--dir",
            s(&dir),
            "--version",
            &v_s,
            "--rank",
            "2",
            "--output",
            s(&part),
            "--range",
            "1000..5003",
        ]);
        assert_eq!(std::fs::read(&part).unwrap(), std::fs::read(f).unwrap()[1000..5003]);
        let bad = ["restore", "--dir", s(&dir), "--version", &v_s, "--rank", "2", "--output", s(&part), "--range"];
        fails(&[&bad[..], &["9..3"]].concat(), "ends before it starts");
    }
    assert!(ok(&["verify", "--dir", s(&dir)]).starts_with("ok: 1 ranks, 4 versions"));
    let json: serde_json::Value = serde_json::from_str(&ok(&["inspect", "--dir", s(&dir), "--json"])).unwrap();
    let rows = json["versions"].as_array().unwrap();
    assert_eq!(json["ranks"][0]["versions"], 4);
    assert_eq!(json["total_cross_rank_references"], 0);
    assert_eq!(rows.len(), 4);
    assert_eq!(rows[0]["rank"], 2);
    assert_eq!(rows[1]["logical_bytes"], 10_000);
    assert!(rows[1]["stored_bytes"].as_u64().unwrap() < 2_000);
    assert!(ok(&["inspect", "--dir", s(&dir)]).contains("baseline"));
}

#[test]
fn bad_input_gives_one_clear_line_and_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("store");
    let f = t.path().join("in.bin");
    std::fs::write(&f, noise(5_000, 1)).unwrap();
    ok(&["checkpoint", "--dir", s(&dir), "--version", "1", "--chunk-size", "64", s(&f)]);
    let manifest = dir.join("rank-00000/MANIFEST");
    let before = std::fs::read(&manifest).unwrap();

    fails(
        &["checkpoint", "--dir", s(&dir), "--version", "2", "--chunk-size", "64", s(&t.path().join("nope.bin"))],
        "nope.bin",
    );
    fails(&["checkpoint", "--dir", s(&dir), "--version", "2", "--chunk-size", "128", s(&f)], "chunk size");
    fails(
        &["checkpoint", "--dir", s(&dir), "--version", "2", "--chunk-size", "64", "--method", "list", s(&f)],
        "method",
    );
    fails(&["checkpoint", "--dir", s(&dir), "--version", "1", "--chunk-size", "64", s(&f)], "not newer");
    fails(&["checkpoint", "--dir", s(&dir), "--version", "2", "--chunk-size", "8", s(&f)], "chunk size 8");
    fails(&["checkpoint", "--dir", s(&dir), "--version", "2", "--method", "zip", s(&f)], "zip");
    let short = t.path().join("short.bin");
    std::fs::write(&short, noise(4_000, 2)).unwrap();
    fails(&["checkpoint", "--dir", s(&dir), "--version", "2", "--chunk-size", "64", s(&short)], "data length");
    fails(&["restore", "--dir", s(&dir), "--version", "9", "--output", s(&t.path().join("o"))], "version 9");
    fails(
        &["restore", "--dir", s(&dir), "--version", "1", "--rank", "3", "--output", s(&t.path().join("o"))],
        "rank 3",
    );
    fails(&["verify", "--dir", s(&t.path().join("empty"))], "empty");
    assert_eq!(std::fs::read(&manifest).unwrap(), before, "a failed command changed the manifest");
    assert!(!t.path().join("o").exists());

    let diff = dir.join("rank-00000/v000000000001.dckpt");
    let mut bytes = std::fs::read(&diff).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&diff, &bytes).unwrap();
    fails(&["verify", "--dir", s(&dir)], "v000000000001.dckpt");
    fails(&["restore", "--dir", s(&dir), "--version", "1", "--output", s(&t.path().join("o"))], "v000000000001.dckpt");
    assert!(!t.path().join("o").exists());
}

#[test]
fn gen_and_bench_run_end_to_end() {
    let t = tempfile::tempdir().unwrap();
    let w = t.path().join("w");
    ok(&["gen", "--size", "256K", "--versions", "3", "--change", "0.05", "--shape", "scattered", "--out", s(&w)]);
    let json = t.path().join("bench.json");
    let files: Vec<String> = (1..=3).map(|v| s(&w.join(format!("v{v:03}.bin"))).to_string()).collect();
    let mut args = vec!["bench", "--chunk-size", "64", "--json", s(&json)];
    args.extend(files.iter().map(String::as_str));
    let out = ok(&args);
    for name in ["full", "basic", "list", "tree", "zstd-1", "lz4", "memcpy", "hash-murmur3"] {
        assert!(out.contains(name), "bench output lacks {name}: {out}");
    }
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let tree = doc["rows"].as_array().unwrap().iter().find(|r| r["name"] == "tree").unwrap();
    assert!(tree["ratio"].as_f64().unwrap() > 1.5, "{tree}");
    fails(&["gen", "--size", "12Q", "--out", s(&w)], "12Q");
}

/// `mpirun` with the flags CI needs (root, more ranks than cores).
#[cfg(feature = "mpi")]
fn mpirun(np: usize, args: &[&str]) -> Output {
    Command::new("mpirun")
        .args(["--oversubscribe", "-np", &np.to_string()])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .arg(env!("CARGO_BIN_EXE_dckpt"))
        .args(args)
        .output()
        .expect("mpirun must be installed to test the collective CLI (apt install openmpi-bin)")
}

#[cfg(feature = "mpi")]
#[test]
fn collective_checkpoint_under_mpirun_then_offline_restore_verify_inspect() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("store");
    let ranks = 3;
    // Rank r's file at version v: a common part and a private part.
    let file = |r: usize, v: usize| {
        let mut d = noise(200_000, 7 + v as u64);
        d[150_000..].copy_from_slice(&noise(50_000, 100 * r as u64 + v as u64));
        d
    };
    for v in 1..=2 {
        for r in 0..ranks {
            std::fs::write(t.path().join(format!("in-{r}-{v}.bin")), file(r, v)).unwrap();
        }
        let pattern = t.path().join(format!("in-{{rank}}-{v}.bin"));
        let v_s = v.to_string();
        let out = mpirun(ranks, &["checkpoint", "--collective", "--dir", s(&dir), "--version", &v_s, s(&pattern)]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "mpirun failed: {stdout} {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(stdout.lines().filter(|l| l.contains("regions referenced on other ranks")).count(), ranks);
    }
    // Offline, no MPI: any rank's any version.
    for r in 0..ranks {
        for v in 1..=2 {
            let out = t.path().join("out.bin");
            let (r_s, v_s) = (r.to_string(), v.to_string());
            ok(&["restore", "--dir", s(&dir), "--rank", &r_s, "--version", &v_s, "--output", s(&out)]);
            assert!(std::fs::read(&out).unwrap() == file(r, v), "rank {r} version {v}");
        }
    }
    assert!(ok(&["verify", "--dir", s(&dir)]).starts_with("ok: 3 ranks, 6 versions"));
    let json: serde_json::Value = serde_json::from_str(&ok(&["inspect", "--dir", s(&dir), "--json"])).unwrap();
    assert_eq!(json["ranks"].as_array().unwrap().len(), ranks);
    assert!(json["total_cross_rank_references"].as_u64().unwrap() > 0);
    assert!(json["ranks"][0]["stored_bytes"].as_u64().unwrap() > 0);
    // Per version, the common 150 KB once plus 3 private 50 KB parts
    // (local-only would store 3 x 200 KB): 600 KB for both, metadata aside.
    let total = json["total_stored_bytes"].as_u64().unwrap();
    assert!((600_000..660_000).contains(&total), "{total} bytes stored");
    // A rank that cannot read its file fails the whole job with a clear line, and nothing is published.
    std::fs::remove_file(t.path().join("in-1-2.bin")).unwrap();
    let pattern = t.path().join("in-{rank}-2.bin");
    let out = mpirun(ranks, &["checkpoint", "--collective", "--dir", s(&dir), "--version", "3", s(&pattern)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("in-1-2.bin") && !err.contains("panicked"), "{err}");
    assert!(ok(&["verify", "--dir", s(&dir)]).starts_with("ok: 3 ranks, 6 versions"));
}

/// Version 0 is no version (`latest`'s "none" in C and Fortran): the
/// collective CLI, over one directory and through the tiers, and the local
/// CLI refuse it with the one error every API gives, write nothing, and the
/// next version, 1, is kept (it once deleted the store's version 0 and
/// stored 1 as a new baseline, exit 0).
#[cfg(feature = "mpi")]
#[test]
fn version_zero_is_refused_everywhere_and_version_one_is_kept() {
    let t = tempfile::tempdir().unwrap();
    let ranks = 2;
    let file = |r: usize, v: usize| noise(100_000, 10 * r as u64 + v as u64);
    for v in 0..=1 {
        for r in 0..ranks {
            std::fs::write(t.path().join(format!("in-{r}-{v}.bin")), file(r, v)).unwrap();
        }
    }
    let shared = t.path().join("shared");
    let local = t.path().join("local");
    let layouts: [&[&str]; 2] = [&["--dir", s(&shared)], &["--dir", s(&shared), "--local", s(&local)]];
    for (i, layout) in layouts.iter().enumerate() {
        let _ = std::fs::remove_dir_all(&shared);
        let _ = std::fs::remove_dir_all(&local);
        let take = |v: usize| {
            let pattern = t.path().join(format!("in-{{rank}}-{v}.bin"));
            let v_s = v.to_string();
            let mut args = vec!["checkpoint", "--collective", "--version", &v_s];
            args.extend_from_slice(layout);
            args.push(s(&pattern));
            let out = mpirun(ranks, &args);
            (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
        };
        let (zero_ok, err) = take(0);
        assert!(!zero_ok, "layout {i}: version 0 was taken");
        assert!(err.contains("version 0: versions start at 1") && !err.contains("panicked"), "layout {i}: {err}");
        let (one_ok, err) = take(1);
        assert!(one_ok, "layout {i}: version 1 failed: {err}");
        for r in 0..ranks {
            let out = t.path().join("out.bin");
            let r_s = r.to_string();
            ok(&["restore", "--dir", s(&shared), "--rank", &r_s, "--version", "1", "--output", s(&out)]);
            assert!(std::fs::read(&out).unwrap() == file(r, 1), "layout {i}: rank {r} version 1");
            let out0 = dckpt(&["restore", "--dir", s(&shared), "--rank", &r_s, "--version", "0", "--output", s(&out)]);
            assert!(!out0.status.success(), "layout {i}: rank {r} lists a version 0");
        }
        assert!(ok(&["verify", "--dir", s(&shared)]).starts_with("ok: 2 ranks, 2 versions"), "layout {i}");
    }
    // The local CLI, one rank: the same error, nothing written.
    let alone = t.path().join("alone");
    fails(
        &["checkpoint", "--dir", s(&alone), "--version", "0", s(&t.path().join("in-0-0.bin"))],
        "version 0: versions start at 1",
    );
    ok(&["checkpoint", "--dir", s(&alone), "--version", "1", s(&t.path().join("in-0-1.bin"))]);
    assert!(ok(&["verify", "--dir", s(&alone)]).starts_with("ok: 1 ranks, 1 versions"));
}

#[test]
fn collective_options_need_collective() {
    fails(&["checkpoint", "--dir", "d", "--version", "1", "--threshold", "8", "f"], "--collective");
}

#[test]
fn prune_deletes_old_chains_and_what_stays_restores() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("store");
    let mut data = noise(20_000, 5);
    let mut files = Vec::new();
    for v in 1..=5 {
        data[v * 100] ^= 0x5a;
        let f = t.path().join(format!("in{v}"));
        std::fs::write(&f, &data).unwrap();
        ok(&[
            "checkpoint",
            "--dir",
            s(&dir),
            "--version",
            &v.to_string(),
            "--max-chain",
            "2",
            "--chunk-size",
            "64",
            s(&f),
        ]);
        files.push(f);
    }
    // Baselines at 1, 3, 5: keeping the last version needs only 5.
    let out = ok(&["prune", "--dir", s(&dir), "--keep", "1", "--dry-run"]);
    assert!(out.contains("would delete 4"), "{out}");
    let out = ok(&["prune", "--dir", s(&dir), "--keep", "1"]);
    assert!(out.contains("deleted 4"), "{out}");
    let restored = t.path().join("out");
    ok(&["restore", "--dir", s(&dir), "--version", "5", "--output", s(&restored)]);
    assert!(std::fs::read(&restored).unwrap() == std::fs::read(&files[4]).unwrap());
    fails(&["restore", "--dir", s(&dir), "--version", "2", "--output", s(&restored)], "E003");
    ok(&["verify", "--dir", s(&dir)]);
    fails(&["prune", "--dir", s(&dir), "--keep", "0"], "at least one");
}

#[test]
fn checkpoint_takes_its_options_from_a_config_file() {
    let t = tempfile::tempdir().unwrap();
    let (dir, scratch, cfg) = (t.path().join("store"), t.path().join("scratch"), t.path().join("dckpt.toml"));
    std::fs::write(
        &cfg,
        format!(
            "chunk_size = 64\nhash = \"xxh3\"\nmax_chain = 2\nmax_versions = 2\nbackend = \"cpu\"\nscratch = \"{}\"\n",
            s(&scratch)
        ),
    )
    .unwrap();
    let mut data = noise(20_000, 7);
    let mut files = Vec::new();
    for v in 1..=4u64 {
        data[(v as usize * 997) % 19_000..][..300].copy_from_slice(&noise(300, v));
        let f = t.path().join(format!("v{v}.bin"));
        std::fs::write(&f, &data).unwrap();
        let out = ok(&["checkpoint", "--dir", s(&dir), "--version", &v.to_string(), "--config", s(&cfg), s(&f)]);
        assert!(out.contains("durable on"), "through the tiers the file names: {out}");
        files.push(f);
    }
    // The store has the file's chunk size and hash; the scratch tier keeps two versions.
    let json: serde_json::Value = serde_json::from_str(&ok(&["inspect", "--dir", s(&dir), "--json"])).unwrap();
    assert_eq!(json["versions"][0]["first_chunks"], 20_000u64.div_ceil(64), "{json}");
    let manifest = std::fs::read_to_string(dir.join("rank-00000/MANIFEST")).unwrap();
    assert!(manifest.contains("\"hash\": \"xxh3\""), "{manifest}");
    let kept = std::fs::read_dir(scratch.join("rank-00000")).unwrap();
    let diffs = kept.filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".dckpt")).count();
    assert_eq!(diffs, 2, "max_versions = 2 on the scratch tier (v3 a baseline: max_chain = 2)");
    let out = t.path().join("out.bin");
    ok(&["restore", "--dir", s(&dir), "--version", "4", "--output", s(&out)]);
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&files[3]).unwrap());
    // The layers: a flag goes over the environment, which goes over the
    // file (here the store's 64 refuses the 128 a layer above asks for).
    fails(
        &["checkpoint", "--dir", s(&dir), "--version", "5", "--config", s(&cfg), "--chunk-size", "128", s(&files[0])],
        "has 64, but 128 was requested",
    );
    let layered = |env: &[(&str, &str)], flags: &[&str]| {
        let mut args = vec!["checkpoint", "--dir", s(&dir), "--version", "5", "--config", s(&cfg)];
        args.extend_from_slice(flags);
        args.push(s(&files[0]));
        Command::new(env!("CARGO_BIN_EXE_dckpt")).args(&args).envs(env.iter().copied()).output().expect("run dckpt")
    };
    let err = |o: Output| String::from_utf8_lossy(&o.stderr).into_owned();
    let e = err(layered(&[("DCKPT_CHUNK_SIZE", "256")], &[]));
    assert!(e.contains("has 64, but 256 was requested"), "the environment over the file: {e}");
    let e = err(layered(&[("DCKPT_CHUNK_SIZE", "256")], &["--chunk-size", "512"]));
    assert!(e.contains("has 64, but 512 was requested"), "the flag over the environment: {e}");
    // A bad flag value is named by its flag, through the configuration's parser.
    let e = err(layered(&[], &["--chunk-size", "7"]));
    assert!(e.contains("configuration (--chunk-size)") && e.contains("chunk_size"), "{e}");
    let e = err(layered(&[], &["--method", "fastest"]));
    assert!(e.contains("configuration (--method)"), "{e}");
    // A bad key names the key and the file.
    std::fs::write(&cfg, "chunk_sise = 64\n").unwrap();
    fails(&["checkpoint", "--dir", s(&dir), "--version", "5", "--config", s(&cfg), s(&files[0])], "chunk_sise");
}

/// A reader that closes the pipe early (`dckpt inspect | head -1`) ends the
/// command quietly (status 141, as SIGPIPE would), never with a panic.
#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s");
    let file = dir.path().join("data.bin");
    std::fs::write(&file, vec![7u8; 4096]).unwrap();
    for v in 1..=3 {
        let out = dckpt(&[
            "checkpoint",
            "--dir",
            store.to_str().unwrap(),
            "--version",
            &v.to_string(),
            file.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_dckpt"))
        .args(["inspect", "--dir", store.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // closed before the command prints
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    // 141 where the print met the closed pipe (nearly always), else 0.
    assert!(matches!(out.status.code(), Some(141) | Some(0)), "{:?}: {stderr}", out.status);
}

/// Every command that reports takes `--json`: one object with `schema` and
/// `command` beside the report's fields.
#[test]
fn reports_come_as_json_with_a_schema_version() {
    let t = tempfile::tempdir().unwrap();
    let (dir, input, out) = (t.path().join("store"), t.path().join("in.bin"), t.path().join("out.bin"));
    let json = |args: &[&str]| -> serde_json::Value {
        let v: serde_json::Value = serde_json::from_str(&ok(args)).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        assert_eq!(v["schema"], 1, "{v}");
        assert_eq!(v["command"], args[0], "{v}");
        v
    };
    for v in 1..=3u64 {
        let mut data = noise(50_000, 7);
        data[..100 * v as usize].fill(v as u8);
        std::fs::write(&input, &data).unwrap();
        let r = json(&["checkpoint", "--dir", s(&dir), "--version", &v.to_string(), "--json", s(&input)]);
        assert_eq!(r["version"], v);
        assert!(r["file_bytes"].as_u64().unwrap() > 0, "{r}");
    }
    let r = json(&["restore", "--dir", s(&dir), "--version", "3", "--output", s(&out), "--json"]);
    assert_eq!(r["stats"]["data_len"], 50_000);
    assert!(std::fs::read(&out).unwrap() == std::fs::read(&input).unwrap());
    let r = json(&["verify", "--dir", s(&dir), "--json"]);
    assert_eq!((r["versions"].as_u64(), r["problems"].as_array().map(Vec::len)), (Some(3), Some(0)), "{r}");
    assert_eq!(json(&["inspect", "--dir", s(&dir), "--json"])["versions"].as_array().unwrap().len(), 3);
    assert!(json(&["repair", "--dir", s(&dir), "--dry-run", "--json"])["actions"].is_array());
    let r = json(&["prune", "--dir", s(&dir), "--keep", "1", "--dry-run", "--json"]);
    assert!(r["deleted"].is_array() && r["kept"].is_array(), "{r}");
    // The configuration, and where each value came from.
    let conf = t.path().join("dckpt.toml");
    std::fs::write(&conf, format!("scratch = \"{}\"\nchunk_size = 256\n", s(&dir))).unwrap();
    let r = json(&["config", "--check", s(&conf), "--json"]);
    assert_eq!((r["config"]["chunk_size"].as_u64(), r["config"]["method"].as_str()), (Some(256), Some("tree")), "{r}");
    assert!(r["origins"]["chunk_size"].as_str().unwrap().contains("dckpt.toml"), "{r}");
    // A benchmark writes the same kind of document to the file --json names.
    let report = t.path().join("bench.json");
    ok(&["bench", "--synthetic", "scattered:0.01", "--size", "256K", "--versions", "2", "--json", s(&report)]);
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!((r["schema"].as_u64(), r["command"].as_str()), (Some(1), Some("bench")), "{r}");
    assert!(!r["rows"].as_array().unwrap().is_empty(), "{r}");
}

/// A single rank's store takes every method from the command line, Full and
/// Basic too (the collective step's need for a record does not apply).
#[test]
fn a_single_rank_checkpoint_takes_every_method() {
    let t = tempfile::tempdir().unwrap();
    let input = t.path().join("in.bin");
    std::fs::write(&input, noise(20_000, 3)).unwrap();
    for method in ["full", "basic", "list", "tree"] {
        let dir = t.path().join(method);
        let out = ok(&["checkpoint", "--dir", s(&dir), "--version", "1", "--method", method, s(&input)]);
        assert!(out.contains("version 1"), "{method}: {out}");
        let restored = t.path().join(format!("{method}.out"));
        ok(&["restore", "--dir", s(&dir), "--version", "1", "--output", s(&restored)]);
        assert_eq!(std::fs::read(&restored).unwrap(), std::fs::read(&input).unwrap(), "{method}");
    }
}

#[test]
fn a_directory_of_the_wrong_level_gets_a_hint_naming_the_right_one() {
    let t = tempfile::tempdir().unwrap();
    // A runtime's tier directory: one store per checkpoint name below it.
    let store = t.path().join("tier").join("heat");
    let f = t.path().join("in.bin");
    std::fs::write(&f, noise(10_000, 3)).unwrap();
    ok(&["checkpoint", "--dir", s(&store), "--version", "1", "--rank", "1", s(&f)]);
    let tier = t.path().join("tier");
    let rank_dir = store.join("rank-00001");
    let out = t.path().join("out.bin");
    for cmd in [
        vec!["verify", "--dir"],
        vec!["inspect", "--dir"],
        vec!["prune", "--keep", "1", "--dir"],
        vec!["repair", "--dry-run", "--dir"],
        vec!["restore", "--version", "1", "--rank", "1", "--output", s(&out), "--dir"],
    ] {
        // One level too deep: a rank's directory inside the store.
        let mut args = cmd.clone();
        args.push(s(&rank_dir));
        fails(&args, &format!("hint: {} is rank 1's directory inside the store {}", s(&rank_dir), s(&store)));
        if cmd[0] != "inspect" {
            // One level too high: the runtime's tier directory (inspect lists its names instead).
            let mut args = cmd.clone();
            args.push(s(&tier));
            fails(&args, &format!("below it: {}: give one, e.g. --dir {}", s(&store), s(&store)));
        }
        // Two levels too high: the directory a job was given, holding its tiers.
        let mut args = cmd.clone();
        args.push(s(t.path()));
        fails(&args, &format!("give one, e.g. --dir {}", s(&store)));
    }
    assert!(ok(&["inspect", "--dir", s(&tier)]).contains("heat"));
    // `.` inside a rank's directory names the store by its real path.
    let out = Command::new(env!("CARGO_BIN_EXE_dckpt"))
        .args(["verify", "--dir", "."])
        .current_dir(&rank_dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let real = std::fs::canonicalize(&store).unwrap();
    assert!(!out.status.success() && err.contains(&format!("inside the store {}", real.display())), "{err}");
}
