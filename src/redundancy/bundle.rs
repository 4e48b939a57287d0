//! One rank's files of one version as one byte string: what a partner
//! stores and what a parity group computes its segments over.
//!
//! ```text
//! dckpt-bundle 1 <hex BLAKE3-256 of everything after this line>
//! {"rank":3,"version":7,"files":[{"path":"rank-00003/MANIFEST","len":412},{"path":"rank-00003/v000000000007.dckpt","len":…},{"path":"commits/v000000000007.r000003.part","len":…}]}
//! <the files' bytes, in that order>
//! ```
//!
//! The files are the rank's manifest with its version list cleared (the
//! store's parameters; the versions roll forward from the commit parts),
//! its diff file and its commit part: the same bytes whenever the bundle
//! is made, so survivors remake theirs for a parity rebuild. A bundle
//! names only these three paths for its own rank and version; any other
//! path, a length that does not add up or a changed byte is refused.

use super::envelope;
use crate::error::{Error, Result};
use crate::format::manifest::Manifest;
use crate::storage::{self, Storage};
use crate::store::commits::part_rel;
use crate::store::{diff_file_name, rank_rel};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

const TAG: &str = "dckpt-bundle";

/// One file of a bundle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEntry {
    path: String,
    len: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    rank: u32,
    version: u64,
    files: Vec<FileEntry>,
}

/// A decoded bundle: its rank, version and files (paths relative to a tier root).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bundle {
    /// The rank whose files these are.
    pub rank: u32,
    /// The version.
    pub version: u64,
    /// Each file's path (relative to the tier root) and bytes.
    pub files: Vec<(PathBuf, Vec<u8>)>,
}

/// The paths a bundle of `rank`'s `version` holds, in order.
fn paths(rank: u32, version: u64) -> [PathBuf; 3] {
    [rank_rel(rank).join("MANIFEST"), rank_rel(rank).join(diff_file_name(version)), part_rel(version, rank)]
}

/// Makes the bundle of `rank`'s `version` from the tier at `storage`.
pub fn make(storage: &dyn Storage, rank: u32, version: u64) -> Result<Vec<u8>> {
    let [manifest_rel, diff_rel, part_rel] = paths(rank, version);
    let manifest_path = storage.locate(&manifest_rel);
    let manifest =
        storage.read(&manifest_rel)?.ok_or_else(|| Error::NoStore { dir: storage.locate(Path::new("")), rank })?;
    let mut manifest = Manifest::decode(&manifest, &manifest_path)?;
    manifest.versions.clear();
    let read_all = |rel: &Path| -> Result<Vec<u8>> {
        let f = storage.open(rel)?;
        let mut buf = vec![0u8; usize::try_from(f.len()).map_err(|_| Error::too_large("a diff file", f.len()))?];
        f.read_exact_at(&mut buf, 0).map_err(|e| Error::io(storage.locate(rel), e))?;
        Ok(buf)
    };
    let files = [manifest.encode(), read_all(&diff_rel)?, read_all(&part_rel)?];
    Ok(encode(rank, version, &[manifest_rel, diff_rel, part_rel], &files))
}

fn encode(rank: u32, version: u64, rels: &[PathBuf], files: &[Vec<u8>]) -> Vec<u8> {
    let header = Header {
        rank,
        version,
        files: rels
            .iter()
            .zip(files)
            .map(|(p, b)| FileEntry { path: p.to_string_lossy().into_owned(), len: b.len() as u64 })
            .collect(),
    };
    let payload: Vec<&[u8]> = files.iter().map(Vec::as_slice).collect();
    envelope::encode(TAG, &header, &payload)
}

/// Checks a bundle without copying its files: its rank and version.
pub fn check(bytes: &[u8], path: &Path) -> Result<(u32, u64)> {
    let (header, _) = parse(bytes, path)?;
    Ok((header.rank, header.version))
}

/// Parses and checks a bundle (`path` names it in errors).
pub fn decode(bytes: &[u8], path: &Path) -> Result<Bundle> {
    let (header, slices) = parse(bytes, path)?;
    let files = paths(header.rank, header.version).into_iter().zip(slices).map(|(rel, b)| (rel, b.to_vec())).collect();
    Ok(Bundle { rank: header.rank, version: header.version, files })
}

/// The header and each file's bytes, every check made.
fn parse<'b>(bytes: &'b [u8], path: &Path) -> Result<(Header, Vec<&'b [u8]>)> {
    let corrupt = |r: &str| Error::corrupt(path, format!("bundle: {r}"));
    let (header, mut payload): (Header, &[u8]) = envelope::decode(bytes, path, TAG, "bundle")?;
    let expected = paths(header.rank, header.version);
    let named_right = header.files.len() == expected.len()
        && header.files.iter().zip(&expected).all(|(f, p)| Path::new(&f.path) == p.as_path());
    if !named_right {
        return Err(corrupt("its files are not the rank's manifest, diff file and commit part"));
    }
    let mut files = Vec::with_capacity(expected.len());
    for f in &header.files {
        let len = usize::try_from(f.len).map_err(|_| corrupt("a file too large"))?;
        if payload.len() < len {
            return Err(corrupt("shorter than its files"));
        }
        let (bytes, tail) = payload.split_at(len);
        files.push(bytes);
        payload = tail;
    }
    if !payload.is_empty() {
        return Err(corrupt("longer than its files"));
    }
    Ok((header, files))
}

impl Bundle {
    /// Writes the files back under the tier at `storage` (each durably,
    /// the manifest only where the rank has none, a file already there
    /// with the same bytes left as it is).
    pub fn restore_to(&self, storage: &dyn Storage) -> Result<()> {
        for (rel, bytes) in &self.files {
            let existing = storage.read(rel)?;
            if existing.as_deref() == Some(bytes.as_slice()) || (rel.ends_with("MANIFEST") && existing.is_some()) {
                continue;
            }
            if let Some(dir) = rel.parent() {
                storage.create_dir(dir)?;
            }
            storage::write_bytes(storage, rel, bytes)?;
            storage.barrier(rel.parent().unwrap_or(Path::new("")))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Vec<u8>, Vec<Vec<u8>>) {
        let rels = paths(3, 7);
        let files = vec![b"manifest".to_vec(), vec![7u8; 1000], b"part".to_vec()];
        (encode(3, 7, &rels, &files), files)
    }

    #[test]
    fn a_bundle_reads_back_its_files() {
        let (bytes, files) = sample();
        let b = decode(&bytes, Path::new("b")).unwrap();
        assert_eq!((b.rank, b.version), (3, 7));
        assert_eq!(b.files.iter().map(|(_, f)| f.clone()).collect::<Vec<_>>(), files);
        assert_eq!(b.files[1].0, Path::new("rank-00003/v000000000007.dckpt"));
    }

    /// Any flipped byte, a cut or a file named elsewhere is refused.
    #[test]
    fn a_damaged_or_foreign_bundle_is_refused() {
        let (bytes, _) = sample();
        for at in [0, 20, bytes.len() / 2, bytes.len() - 1] {
            let mut b = bytes.clone();
            b[at] ^= 1;
            assert!(decode(&b, Path::new("b")).is_err(), "flip at {at}");
        }
        assert!(decode(&bytes[..bytes.len() - 1], Path::new("b")).is_err());
        let evil = encode(
            3,
            7,
            &[PathBuf::from("../x"), paths(3, 7)[1].clone(), paths(3, 7)[2].clone()],
            &[vec![1], vec![2], vec![3]],
        );
        let e = decode(&evil, Path::new("b")).unwrap_err().to_string();
        assert!(e.contains("not the rank's manifest"), "{e}");
    }
}
