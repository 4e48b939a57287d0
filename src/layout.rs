//! The Merkle tree's shape over `n ≥ 1` chunks.
//!
//! Level 0 holds the `n` leaves; level `k + 1` pairs the nodes of level `k`
//! two by two, and an odd last node is *carried* up unchanged. Node `(k, i)`
//! therefore always covers the contiguous chunk range
//! `[i·2^k, min((i+1)·2^k, n))` — also when `n` is not a power of two, which a
//! plain heap layout with `2n − 1` slots cannot promise.

use crate::error::{Error, Result};
use std::ops::Range;

/// Smallest supported chunk size: a chunk must be larger than two 16-byte
/// digests for inner-node hashing to be cheaper than leaf hashing.
pub const MIN_CHUNK_SIZE: u32 = 32;
/// Largest supported chunk size.
pub const MAX_CHUNK_SIZE: u32 = 64 * 1024;

/// Identifies one Merkle node: `level` in the top 6 bits, `index` in the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(u64);

impl NodeId {
    const INDEX_BITS: u32 = 58;

    /// Node `index` of `level`.
    pub fn new(level: u32, index: u64) -> Self {
        debug_assert!(level < 64 && index < (1 << Self::INDEX_BITS));
        NodeId((u64::from(level) << Self::INDEX_BITS) | index)
    }

    /// A leaf (level 0).
    pub fn leaf(index: u64) -> Self {
        Self::new(0, index)
    }

    /// The tree level (0 = leaves).
    pub fn level(self) -> u32 {
        (self.0 >> Self::INDEX_BITS) as u32
    }

    /// The index inside its level.
    pub fn index(self) -> u64 {
        self.0 & ((1 << Self::INDEX_BITS) - 1)
    }

    /// First chunk covered.
    pub fn first_chunk(self) -> u64 {
        self.index() << self.level()
    }

    /// The packed form stored in records and files.
    pub fn raw(self) -> u64 {
        self.0
    }

    /// From the packed form (no validation: see [`Layout::contains`]).
    pub fn from_raw(raw: u64) -> Self {
        NodeId(raw)
    }
}

/// Chunking of a buffer of `data_len` bytes into `chunk_size`-byte chunks
/// (the last one may be short), and the tree over them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    data_len: u64,
    chunk_size: u32,
    chunks: u64,
}

impl Layout {
    /// A layout, checking the chunk size range and that there is data.
    pub fn new(data_len: u64, chunk_size: u32) -> Result<Self> {
        if !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&chunk_size) {
            return Err(Error::InvalidOption(format!(
                "chunk size {chunk_size} is outside {MIN_CHUNK_SIZE}..={MAX_CHUNK_SIZE} bytes"
            )));
        }
        if data_len == 0 {
            return Err(Error::InvalidOption("cannot checkpoint an empty buffer".into()));
        }
        let chunks = data_len.div_ceil(u64::from(chunk_size));
        Ok(Layout { data_len, chunk_size, chunks })
    }

    /// Bytes of protected data.
    pub fn data_len(&self) -> u64 {
        self.data_len
    }

    /// Chunk size in bytes.
    pub fn chunk_size(&self) -> u32 {
        self.chunk_size
    }

    /// Number of chunks (leaves).
    pub fn chunks(&self) -> u64 {
        self.chunks
    }

    /// Number of levels, leaves included (1 for a single chunk).
    pub fn levels(&self) -> u32 {
        64 - (self.chunks - 1).leading_zeros() + 1
    }

    /// Number of nodes on `level`.
    pub fn level_len(&self, level: u32) -> u64 {
        self.chunks.div_ceil(1u64 << level)
    }

    /// Whether `node` exists in this tree.
    pub fn contains(&self, node: NodeId) -> bool {
        node.level() < self.levels() && node.index() < self.level_len(node.level())
    }

    /// The chunks a node covers.
    pub fn node_chunks(&self, node: NodeId) -> Range<u64> {
        let start = node.first_chunk();
        let end = ((node.index() + 1) << node.level()).min(self.chunks);
        start..end
    }

    /// The bytes a range of chunks covers.
    pub fn chunk_bytes(&self, chunks: Range<u64>) -> Range<u64> {
        let cs = u64::from(self.chunk_size);
        (chunks.start * cs).min(self.data_len)..(chunks.end * cs).min(self.data_len)
    }

    /// The bytes a node covers.
    pub fn node_bytes(&self, node: NodeId) -> Range<u64> {
        self.chunk_bytes(self.node_chunks(node))
    }

    /// Whether node `(level, index)` has only a left child (it is carried up).
    pub fn is_carried(&self, level: u32, index: u64) -> bool {
        level > 0 && 2 * index + 1 >= self.level_len(level - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_covers_a_contiguous_range_that_its_children_partition() {
        for n in 1..=70u64 {
            let lay = Layout::new(n * 32, 32).unwrap();
            assert_eq!(lay.chunks(), n);
            let top = lay.levels() - 1;
            assert_eq!(lay.level_len(top), 1, "n={n}");
            assert_eq!(lay.node_chunks(NodeId::new(top, 0)), 0..n);
            for level in 1..lay.levels() {
                for i in 0..lay.level_len(level) {
                    let r = lay.node_chunks(NodeId::new(level, i));
                    let left = lay.node_chunks(NodeId::new(level - 1, 2 * i));
                    assert_eq!(left.start, r.start);
                    if lay.is_carried(level, i) {
                        assert_eq!(left, r);
                    } else {
                        let right = lay.node_chunks(NodeId::new(level - 1, 2 * i + 1));
                        assert_eq!(left.end, right.start);
                        assert_eq!(right.end, r.end);
                    }
                }
            }
        }
    }

    #[test]
    fn short_last_chunk_and_byte_ranges() {
        let lay = Layout::new(100, 32).unwrap();
        assert_eq!(lay.chunks(), 4);
        assert_eq!(lay.node_bytes(NodeId::leaf(3)), 96..100);
        assert_eq!(lay.node_bytes(NodeId::new(2, 0)), 0..100);
    }

    #[test]
    fn rejects_bad_parameters() {
        assert!(Layout::new(100, 16).is_err());
        assert!(Layout::new(100, 128 * 1024).is_err());
        assert!(Layout::new(0, 64).is_err());
        assert!(Layout::new(1, 64).is_ok());
    }

    #[test]
    fn node_id_packs_level_and_index() {
        let id = NodeId::new(13, 123_456_789);
        assert_eq!((id.level(), id.index()), (13, 123_456_789));
        assert_eq!(NodeId::from_raw(id.raw()), id);
    }
}
