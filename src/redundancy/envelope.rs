//! The checked form of the copies' files (bundles, parity segments): a
//! line `<tag> 1 <hex BLAKE3-256 of everything after it>`, a JSON header
//! line, then the payload. Any flipped byte fails the checksum.

use crate::error::{Error, Result};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::path::Path;

/// `header` and `payload` under `tag`, checksummed.
pub fn encode<H: Serialize>(tag: &str, header: &H, payload: &[&[u8]]) -> Vec<u8> {
    // Serializing plain data cannot fail.
    let mut rest = serde_json::to_vec(header).unwrap_or_default();
    rest.push(b'\n');
    for p in payload {
        rest.extend_from_slice(p);
    }
    let mut out = format!("{tag} 1 {}\n", blake3::hash(&rest).to_hex()).into_bytes();
    out.extend_from_slice(&rest);
    out
}

/// The header and the payload of a file [`encode`] made under `tag`, the
/// checksum checked; errors name `path` and `what` the file is.
pub fn decode<'b, H: DeserializeOwned>(bytes: &'b [u8], path: &Path, tag: &str, what: &str) -> Result<(H, &'b [u8])> {
    let corrupt = |r: &str| Error::corrupt(path, format!("{what}: {r}"));
    let line = bytes.iter().position(|&b| b == b'\n').ok_or_else(|| corrupt("no header line"))?;
    let first = std::str::from_utf8(&bytes[..line]).map_err(|_| corrupt("header is not UTF-8"))?;
    let rest = &bytes[line + 1..];
    let mut words = first.split(' ');
    if words.next() != Some(tag) || words.next() != Some("1") {
        return Err(corrupt(&format!("not a dckpt {what} of format 1")));
    }
    if words.next() != Some(blake3::hash(rest).to_hex().as_str()) {
        return Err(corrupt("checksum mismatch"));
    }
    let json_end = rest.iter().position(|&b| b == b'\n').ok_or_else(|| corrupt("no header"))?;
    let header = serde_json::from_slice(&rest[..json_end]).map_err(|e| corrupt(&e.to_string()))?;
    Ok((header, &rest[json_end + 1..]))
}
