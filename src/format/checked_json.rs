//! The small text files of a store (manifests, commit records): a header
//! line `<tag> <format> <hex BLAKE3-256 of the body>`, then a JSON body and a
//! newline. Any flipped byte fails the checksum; unknown formats are refused.

use crate::error::{Error, Result};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::path::Path;

/// Text form of `value` under `tag` and `format`; `pretty` for files people read.
pub fn encode<T: Serialize>(tag: &str, format: u32, value: &T, pretty: bool) -> Vec<u8> {
    // Serializing plain data to a String cannot fail.
    let body =
        if pretty { serde_json::to_string_pretty(value) } else { serde_json::to_string(value) }.unwrap_or_default();
    let sum = blake3::hash(body.as_bytes()).to_hex();
    format!("{tag} {format} {sum}\n{body}\n").into_bytes()
}

/// Parses and checks a file written by [`encode`] with `tag` and one of
/// `formats`; `what` names the kind of file in errors.
pub fn decode<T: DeserializeOwned>(bytes: &[u8], path: &Path, tag: &str, formats: &[&str], what: &str) -> Result<T> {
    let corrupt = |r: String| Error::corrupt(path, r);
    let text = std::str::from_utf8(bytes).map_err(|_| corrupt(format!("{what} is not UTF-8")))?;
    let (first, rest) = text.split_once('\n').ok_or_else(|| corrupt(format!("{what} has no header line")))?;
    let mut words = first.split(' ');
    if words.next() != Some(tag) {
        return Err(corrupt(format!("not a dckpt {what}")));
    }
    if !words.next().is_some_and(|f| formats.contains(&f)) {
        return Err(corrupt(format!("unsupported {what} format")));
    }
    let sum = words.next().ok_or_else(|| corrupt(format!("{what} checksum missing")))?;
    let body = rest.strip_suffix('\n').unwrap_or(rest);
    if blake3::hash(body.as_bytes()).to_hex().as_str() != sum {
        return Err(corrupt(format!("{what} checksum mismatch")));
    }
    serde_json::from_str(body).map_err(|e| corrupt(format!("{what}: {e}")))
}
