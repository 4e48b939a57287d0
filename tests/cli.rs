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
    let rows: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let tree = rows.as_array().unwrap().iter().find(|r| r["name"] == "tree").unwrap();
    assert!(tree["ratio"].as_f64().unwrap() > 1.5, "{tree}");
    fails(&["gen", "--size", "12Q", "--out", s(&w)], "12Q");
}
