//! Record segments: the record entries one version added, so that a new
//! process continues de-duplicating against the whole history.
//!
//! ```text
//! magic "DCKPTREC" | format u16 | reserved u16 | rank u32 | version u64 | count u64
//! count × (digest 16 B | node u64 | version u32 | rank u32) | BLAKE3-256 of all before
//! ```

use super::codec::{Cursor, PutLe, table_len};
use crate::hash::Digest;
use crate::layout::NodeId;
use crate::record::{Record, RecordEntry};
use crate::{Error, Result};
use std::path::Path;

const MAGIC: [u8; 8] = *b"DCKPTREC";
const FORMAT: u16 = 1;
const HEAD: u64 = 32;
const ENTRY: u64 = 32;

/// Encodes the entries a version added.
pub fn encode(rank: u32, version: u64, entries: &[(Digest, RecordEntry)]) -> Vec<u8> {
    let mut out = Vec::with_capacity((HEAD + ENTRY * entries.len() as u64 + 32) as usize);
    out.extend_from_slice(&MAGIC);
    out.put_u16(FORMAT);
    out.put_u16(0);
    out.put_u32(rank);
    out.put_u64(version);
    out.put_u64(entries.len() as u64);
    for (d, e) in entries {
        out.extend_from_slice(&d.to_bytes());
        out.put_u64(e.node.raw());
        out.put_u32(e.version);
        out.put_u32(e.rank);
    }
    let sum = *blake3::hash(&out).as_bytes();
    out.extend_from_slice(&sum);
    out
}

/// Decodes a segment into `into`; checks magic, rank, version and checksum.
pub fn decode_into(bytes: &[u8], path: &Path, rank: u32, version: u64, into: &mut Record) -> Result<u64> {
    let corrupt = |r: String| Error::corrupt(path, r);
    if bytes.len() < (HEAD + 32) as usize {
        return Err(corrupt("record segment is truncated".into()));
    }
    let (body, sum) = bytes.split_at(bytes.len() - 32);
    if blake3::hash(body).as_bytes() != sum {
        return Err(corrupt("record segment checksum mismatch".into()));
    }
    let mut c = Cursor::new(body);
    if c.take(8, "magic").map_err(corrupt)? != MAGIC {
        return Err(corrupt("not a record segment".into()));
    }
    if c.u16("format").map_err(corrupt)? != FORMAT {
        return Err(corrupt("unsupported record segment format".into()));
    }
    c.u16("reserved").map_err(corrupt)?;
    let (r, v) = (c.u32("rank").map_err(corrupt)?, c.u64("version").map_err(corrupt)?);
    if (r, v) != (rank, version) {
        return Err(corrupt(format!("segment belongs to rank {r} version {v}")));
    }
    let count = c.u64("count").map_err(corrupt)?;
    let len = table_len(count, ENTRY, c.remaining() as u64, "record entries").map_err(corrupt)?;
    if len != c.remaining() as u64 {
        return Err(corrupt("record segment length does not match its count".into()));
    }
    for _ in 0..count {
        let d = Digest::from_bytes(c.bytes16("digest").map_err(corrupt)?);
        let node = NodeId::from_raw(c.u64("node").map_err(corrupt)?);
        let version = c.u32("version").map_err(corrupt)?;
        let rank = c.u32("rank").map_err(corrupt)?;
        into.insert_if_absent(d, RecordEntry { version, rank, node });
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let entries = vec![(Digest(7), RecordEntry { version: 3, rank: 1, node: NodeId::new(2, 5) })];
        let bytes = encode(1, 3, &entries);
        let mut r = Record::new();
        assert_eq!(decode_into(&bytes, Path::new("x"), 1, 3, &mut r).unwrap(), 1);
        assert_eq!(r.get(Digest(7)), Some(entries[0].1));
        assert!(decode_into(&bytes, Path::new("x"), 2, 3, &mut Record::new()).is_err());
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 1;
            assert!(decode_into(&b, Path::new("x"), 1, 3, &mut Record::new()).is_err());
        }
        assert!(decode_into(&bytes[..40], Path::new("x"), 1, 3, &mut Record::new()).is_err());
    }
}
