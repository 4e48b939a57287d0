//! A store as a hostile user leaves it (issue #28): a FIFO in place of a
//! diff file, a MANIFEST or a commit record, and a symbolic link in place
//! of `commits/` or a rank directory. Every command answers with a clear
//! error or a report, within seconds (never a hang), and nothing outside
//! the store is read, written, renamed or removed.
#![allow(clippy::unwrap_used)] // tests may panic on setup failures

mod common;

use common::noise;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn s(p: &Path) -> &str {
    p.to_str().expect("test paths are UTF-8")
}

/// Runs `dckpt args`, killed after 30 s: `(exit code, stdout + stderr)`;
/// a hang fails the test.
fn bounded(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dckpt"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run dckpt");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("dckpt {args:?} hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

/// A store of three versions under `dir`.
fn store(dir: &Path) {
    let input = dir.join("input.bin");
    let mut data = noise(40_000, 1);
    for v in 1..=3u64 {
        data[(v as usize) * 1000..(v as usize) * 1000 + 300].copy_from_slice(&noise(300, v + 10));
        std::fs::write(&input, &data).unwrap();
        let (code, text) = bounded(&["checkpoint", "--dir", s(&dir.join("s")), "--version", &v.to_string(), s(&input)]);
        assert_eq!(code, Some(0), "{text}");
    }
}

fn mkfifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    let made = Command::new("mkfifo").arg(path).status().expect("run mkfifo (coreutils)");
    assert!(made.success(), "mkfifo {}", path.display());
}

fn every_command(root: &Path) -> Vec<(Vec<String>, Option<i32>, String)> {
    let out = root.parent().unwrap().join("out.bin");
    let cmds: Vec<Vec<&str>> = vec![
        vec!["verify", "--dir", s(root)],
        vec!["inspect", "--dir", s(root)],
        vec!["restore", "--dir", s(root), "--version", "3", "--output", s(&out)],
        vec!["repair", "--dir", s(root), "--dry-run"],
        vec!["prune", "--dir", s(root), "--keep", "1", "--dry-run"],
    ];
    cmds.into_iter()
        .map(|c| {
            let (code, text) = bounded(&c);
            (c.into_iter().map(String::from).collect(), code, text)
        })
        .collect()
}

#[test]
fn a_fifo_in_a_store_is_a_clear_error_never_a_hang() {
    for target in ["v000000000003.dckpt", "v000000000001.dckpt", "MANIFEST"] {
        let dir = tempfile::tempdir().unwrap();
        store(dir.path());
        let root = dir.path().join("s");
        mkfifo(&root.join("rank-00000").join(target));
        for (cmd, code, text) in every_command(&root) {
            // verify and restore must say what is wrong; inspect, repair's and
            // prune's dry runs may report it; none may hang or crash.
            assert!(code.is_some(), "{cmd:?} on a FIFO {target} crashed: {text}");
            if cmd[0] == "verify" || (cmd[0] == "restore" && target != "v000000000001.dckpt") {
                assert_ne!(code, Some(0), "{cmd:?} with a FIFO {target} succeeded: {text}");
            }
            if code != Some(0) {
                assert!(text.contains("FIFO") || text.contains(target), "{cmd:?} with a FIFO {target}: {text}");
            }
        }
        // The next checkpoint of an intact version still proceeds or says why.
        let input = dir.path().join("input.bin");
        let (code, text) = bounded(&["checkpoint", "--dir", s(&root), "--version", "4", s(&input)]);
        assert!(code.is_some(), "checkpoint after a FIFO {target}: {text}");
    }
}

#[test]
fn a_symbolic_link_in_place_of_a_store_directory_is_never_followed() {
    let dir = tempfile::tempdir().unwrap();
    store(dir.path());
    let root = dir.path().join("s");
    // Outside the store: a directory with a file, and one with a store's
    // rank directory in it.
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(outside.join("rank-00000")).unwrap();
    std::fs::write(outside.join("precious"), b"keep").unwrap();
    std::fs::write(outside.join("rank-00000").join("v000000000009.dckpt.tmp"), b"keep").unwrap();
    let before = listing(&outside);
    // `commits/` as a link to it.
    std::os::unix::fs::symlink(&outside, root.join("commits")).unwrap();
    for args in [
        vec!["repair", "--dir", s(&root)],
        vec!["prune", "--dir", s(&root), "--keep", "1"],
        vec!["verify", "--dir", s(&root)],
    ] {
        let (code, text) = bounded(&args);
        assert!(code.is_some(), "{args:?}: {text}");
        assert_eq!(listing(&outside), before, "{args:?} changed files outside the store: {text}");
    }
    let input = dir.path().join("input.bin");
    let (code, text) = bounded(&["checkpoint", "--dir", s(&root), "--version", "4", s(&input)]);
    assert_ne!(code, Some(0), "a checkpoint through a linked commits/ succeeded: {text}");
    assert!(text.contains("symbolic link"), "{text}");
    assert_eq!(listing(&outside), before, "the checkpoint changed files outside the store");
}

/// Every file under `dir` with its content.
fn listing(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn repair_reports_only_what_it_did() {
    let dir = tempfile::tempdir().unwrap();
    store(dir.path());
    let rank = dir.path().join("s").join("rank-00000");
    // A junk manifest, and no diff file that verifies to rebuild it from.
    std::fs::write(rank.join("MANIFEST"), b"junk").unwrap();
    for v in 1..=3 {
        std::fs::write(rank.join(format!("v{v:012}.dckpt")), b"junk too").unwrap();
    }
    let root = dir.path().join("s");
    let (code, text) = bounded(&["repair", "--dir", s(&root)]);
    assert_eq!(code, Some(0), "{text}");
    assert!(!text.contains("rebuilt"), "nothing was rebuilt, but repair says so: {text}");
    assert!(rank.join("MANIFEST.damaged").exists(), "the junk manifest is set aside: {text}");
    // The rank starts anew: the next checkpoint proceeds.
    let input = dir.path().join("input.bin");
    let (code, text) = bounded(&["checkpoint", "--dir", s(&root), "--version", "1", s(&input)]);
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = bounded(&["verify", "--dir", s(&root)]);
    assert_eq!(code, Some(0), "{text}");
}

#[test]
fn inspect_on_a_runtime_directory_names_the_checkpoints_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input.bin");
    std::fs::write(&input, noise(10_000, 3)).unwrap();
    let tier = dir.path().join("persistent");
    for name in ["heat", "labels"] {
        let (code, text) = bounded(&["checkpoint", "--dir", s(&tier.join(name)), "--version", "1", s(&input)]);
        assert_eq!(code, Some(0), "{text}");
    }
    let (code, text) = bounded(&["inspect", "--dir", s(&tier)]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("heat") && text.contains("labels") && text.contains("runtime directory"), "{text}");
}
