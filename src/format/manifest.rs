//! The manifest: a rank's store parameters and its list of complete versions.
//!
//! Text form: a first line `dckpt-manifest 1 <blake3-256 hex of the rest>`,
//! then pretty JSON. A version is listed only after its files are durable.

use crate::error::{Error, Result};
use crate::hash::HashAlgo;
use crate::method::Method;
use serde::{Deserialize, Serialize};
use std::path::Path;

const TAG: &str = "dckpt-manifest";
/// Format written. Format 1 (which also named per-version record segments,
/// no longer used) is still read: its extra field is ignored.
const MANIFEST_FORMAT: u32 = 2;

/// One complete version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionEntry {
    /// Version number.
    pub version: u64,
    /// Whether it references nothing older.
    pub baseline: bool,
    /// Length of its diff file.
    pub file_len: u64,
    /// Hex of the diff file's trailer.
    pub trailer: String,
}

/// A rank's store parameters and complete versions, oldest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Rank.
    pub rank: u32,
    /// Bytes of protected data.
    pub data_len: u64,
    /// Chunk size.
    pub chunk_size: u32,
    /// Method.
    pub method: Method,
    /// Digest algorithm.
    pub hash: HashAlgo,
    /// Complete versions, increasing.
    pub versions: Vec<VersionEntry>,
}

impl Manifest {
    /// Text form with its checksum line.
    pub fn encode(&self) -> Vec<u8> {
        super::checked_json::encode(TAG, MANIFEST_FORMAT, self, true)
    }

    /// Parses and checks the text form.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Self> {
        let corrupt = |r: String| Error::corrupt(path, r);
        let m: Manifest = super::checked_json::decode(bytes, path, TAG, &["1", "2"], "manifest")?;
        if m.versions.windows(2).any(|w| w[0].version >= w[1].version) {
            return Err(corrupt("manifest versions are not increasing".into()));
        }
        if m.versions.first().is_some_and(|v| !v.baseline) {
            return Err(corrupt("the oldest version listed is not a baseline".into()));
        }
        Ok(m)
    }

    /// The entry of `version`.
    pub fn get(&self, version: u64) -> Option<&VersionEntry> {
        self.versions.binary_search_by_key(&version, |v| v.version).ok().map(|i| &self.versions[i])
    }

    /// Versions from the last baseline at or before `version` up to `version`.
    pub fn chain(&self, version: u64) -> Option<&[VersionEntry]> {
        let end = self.versions.binary_search_by_key(&version, |v| v.version).ok()?;
        let start = self.versions[..=end].iter().rposition(|v| v.baseline)?;
        Some(&self.versions[start..=end])
    }

    /// The newest complete version.
    pub fn latest(&self) -> Option<&VersionEntry> {
        self.versions.last()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        let v = |version, baseline| VersionEntry { version, baseline, file_len: 10, trailer: "ab".into() };
        Manifest {
            rank: 3,
            data_len: 1000,
            chunk_size: 64,
            method: Method::Tree,
            hash: HashAlgo::Xxh3,
            versions: vec![v(1, true), v(2, false), v(5, true), v(7, false)],
        }
    }

    #[test]
    fn round_trip_and_chains() {
        let m = sample();
        let p = Path::new("m");
        assert_eq!(Manifest::decode(&m.encode(), p).unwrap(), m);
        let chain: Vec<u64> = m.chain(7).unwrap().iter().map(|v| v.version).collect();
        assert_eq!(chain, vec![5, 7]);
        assert_eq!(m.chain(2).unwrap().len(), 2);
        assert!(m.chain(3).is_none());
    }

    #[test]
    fn any_flipped_byte_is_rejected() {
        let bytes = sample().encode();
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x20;
            assert!(Manifest::decode(&b, Path::new("m")).is_err(), "flip at {i} accepted");
        }
    }
}
