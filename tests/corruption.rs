//! Damaged stores fail loudly: every flipped byte and every truncation of a
//! diff file is caught by verify and by restore, a missing file in a chain
//! names the file, and a damaged manifest or record segment is reported.
#![allow(clippy::unwrap_used)] // tests may panic on setup failures

mod common;

use common::{checkpoint_all, noise, opts};
use dckpt::Method;
use dckpt::store::Store;
use std::path::Path;

fn small_store(method: Method) -> (tempfile::TempDir, Vec<Vec<u8>>) {
    let mut v1 = noise(1500, 1);
    v1[0..64].copy_from_slice(&noise(64, 9));
    let mut v2 = v1.clone();
    v2[300..420].copy_from_slice(&noise(120, 2));
    v2.copy_within(0..64, 1024);
    let mut v3 = v2.clone();
    v3[700..720].copy_from_slice(&noise(20, 3));
    let vs = vec![v1, v2, v3];
    let dir = tempfile::tempdir().unwrap();
    checkpoint_all(dir.path(), &opts(method, 32), &vs);
    (dir, vs)
}

fn problems(root: &Path) -> Vec<String> {
    match dckpt::verify::verify_store(root) {
        Ok(r) => r.problems.into_iter().map(|p| format!("{}: {}", p.path.display(), p.message)).collect(),
        Err(e) => vec![e.to_string()],
    }
}

#[test]
fn every_flipped_byte_is_caught_by_verify_and_restore() {
    for method in Method::ALL {
        let (dir, vs) = small_store(method);
        let store = Store::open(dir.path(), 0).unwrap();
        for v in 1..=3u64 {
            let path = store.diff_path(v);
            let good = std::fs::read(&path).unwrap();
            for i in 0..good.len() {
                let mut bad = good.clone();
                bad[i] ^= 1 << (i % 8);
                std::fs::write(&path, &bad).unwrap();
                let found = problems(dir.path());
                let name = path.file_name().unwrap().to_str().unwrap();
                assert!(
                    found.iter().any(|p| p.contains(name)),
                    "{method} v{v}: flip at byte {i} not reported: {found:?}"
                );
                assert!(
                    dckpt::restore::restore_version(dir.path(), 0, v).is_err(),
                    "{method} v{v}: flip at {i} restored"
                );
                // A ranged restore gives the right bytes or an error, never others.
                let want = &vs[v as usize - 1];
                for range in [0..want.len(), 100..900, want.len() - 100..want.len()] {
                    let got = dckpt::restore::restore_range(dir.path(), 0, v, range.start as u64..range.end as u64);
                    assert!(
                        got.as_ref().map_or(true, |g| g[..] == want[range.clone()]),
                        "{method} v{v}: flip at {i}: bytes {range:?} restored wrong"
                    );
                    assert!(
                        range.len() < want.len() || got.is_err(),
                        "{method} v{v}: flip at {i}: whole range restored"
                    );
                }
            }
            std::fs::write(&path, &good).unwrap();
        }
        assert!(problems(dir.path()).is_empty());
        for (i, want) in vs.iter().enumerate() {
            assert_eq!(&dckpt::restore::restore_version(dir.path(), 0, i as u64 + 1).unwrap(), want);
        }
    }
}

#[test]
fn every_truncation_is_caught() {
    let (dir, _) = small_store(Method::Tree);
    let path = Store::open(dir.path(), 0).unwrap().diff_path(2);
    let good = std::fs::read(&path).unwrap();
    for len in 0..good.len() {
        std::fs::write(&path, &good[..len]).unwrap();
        assert!(!problems(dir.path()).is_empty(), "truncation to {len} bytes not reported");
        assert!(dckpt::restore::restore_version(dir.path(), 0, 3).is_err());
    }
    std::fs::write(&path, [good.as_slice(), b"extra"].concat()).unwrap();
    assert!(!problems(dir.path()).is_empty(), "appended bytes not reported");
}

#[test]
fn a_missing_file_in_the_chain_is_named() {
    let (dir, _) = small_store(Method::Tree);
    let path = Store::open(dir.path(), 0).unwrap().diff_path(1);
    std::fs::remove_file(&path).unwrap();
    let err = dckpt::restore::restore_version(dir.path(), 0, 3).unwrap_err().to_string();
    assert!(err.contains("v000000000001.dckpt"), "{err}");
    assert!(problems(dir.path()).iter().any(|p| p.contains("v000000000001.dckpt")));
}

#[test]
fn unknown_versions_and_ranks_are_clear_errors() {
    let (dir, _) = small_store(Method::Tree);
    let e = dckpt::restore::restore_version(dir.path(), 0, 7).unwrap_err();
    assert!(matches!(e, dckpt::Error::MissingVersion { version: 7, .. }), "{e}");
    let e = dckpt::restore::restore_version(dir.path(), 5, 1).unwrap_err();
    assert!(matches!(e, dckpt::Error::NoStore { rank: 5, .. }), "{e}");
}

#[test]
fn a_foreign_file_and_a_damaged_manifest_are_reported() {
    let (dir, _) = small_store(Method::Tree);
    let (other, _) = small_store(Method::List);
    let store = Store::open(dir.path(), 0).unwrap();
    let mine = store.diff_path(2);
    let good = std::fs::read(&mine).unwrap();
    // Same rank, same version, another store: valid on its own, not the committed file.
    std::fs::copy(Store::open(other.path(), 0).unwrap().diff_path(2), &mine).unwrap();
    assert!(problems(dir.path()).iter().any(|p| p.contains("v000000000002.dckpt")));
    let e = dckpt::restore::restore_version(dir.path(), 0, 3).unwrap_err();
    assert!(e.to_string().contains("v000000000002.dckpt"), "{e}");
    std::fs::write(&mine, &good).unwrap();
    let manifest = store.dir().join("MANIFEST");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, text.replace("\"version\": 3", "\"version\": 4")).unwrap();
    assert!(problems(dir.path()).iter().any(|p| p.contains("MANIFEST")));
    assert!(dckpt::restore::restore_version(dir.path(), 0, 1).is_err());
}
