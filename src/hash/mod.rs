//! 128-bit chunk and node digests.
//!
//! Leaves (chunks) are hashed with the plain algorithm (Murmur3 x64_128 with
//! seed 0 is the default, as in the ICPP'23 prototype). Inner Merkle nodes hash
//! the 32-byte concatenation of their children's digests in a *separate domain*
//! (seed 1, a fixed BLAKE3 key, or a SHA-1 prefix byte) so that a 32-byte chunk
//! whose bytes happen to equal two digests can never be mistaken for an inner
//! node of a different size.

/// MurmurHash3 x64_128 of `data` with `seed` (h1 = h2 = seed), the
/// `fastmurmur3` crate's: the hand-written one it replaced (issue #45) was no
/// faster, 7.5–10 GB/s for both on one core at 64 B – 4 KiB chunks
/// (BENCHMARKS.md, "Murmur3"). The CUDA kernel computes the same function.
pub fn murmur3_x64_128(data: &[u8], seed: u32) -> u128 {
    fastmurmur3::murmur3_x64_128(data, u64::from(seed))
}

use serde::{Deserialize, Serialize};
use sha1::Digest as _;
use std::fmt;
use std::str::FromStr;

/// A 128-bit digest. Its canonical byte form is little-endian
/// (for Murmur3: `h1` then `h2`, as `MurmurHash3_x64_128` writes them).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Digest(pub u128);

impl Digest {
    /// The canonical 16 bytes.
    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_le_bytes()
    }

    /// From the canonical 16 bytes.
    pub fn from_bytes(b: [u8; 16]) -> Self {
        Digest(u128::from_le_bytes(b))
    }

    /// The top `bits` bits, used to pick a shard of the record.
    pub fn shard(self, bits: u32) -> usize {
        if bits == 0 { 0 } else { (self.0 >> (128 - bits)) as usize }
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.to_bytes()))
    }
}

/// The digest algorithm of a store; recorded in every file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum HashAlgo {
    /// Murmur3 x64_128, seed 0 (the default; the paper's choice).
    #[default]
    Murmur3,
    /// XXH3-128 (fastest on CPUs).
    Xxh3,
    /// BLAKE3 truncated to 128 bits (the strong choice).
    Blake3,
    /// SHA-1 truncated to 128 bits (the 2013 collective paper's choice).
    Sha1,
}

/// Key that puts BLAKE3 inner-node hashing in its own domain.
const BLAKE3_NODE_KEY: [u8; 32] = *b"dckpt merkle inner node key v1..";

impl HashAlgo {
    /// Every algorithm, in code order.
    pub const ALL: [HashAlgo; 4] = [HashAlgo::Murmur3, HashAlgo::Xxh3, HashAlgo::Blake3, HashAlgo::Sha1];

    /// Stable one-byte code used in the file format.
    pub fn code(self) -> u8 {
        match self {
            HashAlgo::Murmur3 => 1,
            HashAlgo::Xxh3 => 2,
            HashAlgo::Blake3 => 3,
            HashAlgo::Sha1 => 4,
        }
    }

    /// Inverse of [`HashAlgo::code`].
    pub fn from_code(code: u8) -> Option<Self> {
        HashAlgo::ALL.into_iter().find(|a| a.code() == code)
    }

    /// The lowercase name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            HashAlgo::Murmur3 => "murmur3",
            HashAlgo::Xxh3 => "xxh3",
            HashAlgo::Blake3 => "blake3",
            HashAlgo::Sha1 => "sha1",
        }
    }

    /// Digest of one chunk (a Merkle leaf).
    pub fn leaf(self, bytes: &[u8]) -> Digest {
        match self {
            HashAlgo::Murmur3 => Digest(murmur3_x64_128(bytes, 0)),
            HashAlgo::Xxh3 => Digest(xxhash_rust::xxh3::xxh3_128(bytes)),
            HashAlgo::Blake3 => Digest(truncate(blake3::hash(bytes).as_bytes())),
            HashAlgo::Sha1 => Digest(truncate(&sha1::Sha1::digest(bytes))),
        }
    }

    /// Digest of an inner node from its two children's digests.
    pub fn node(self, left: Digest, right: Digest) -> Digest {
        let mut buf = [0u8; 32];
        buf[..16].copy_from_slice(&left.to_bytes());
        buf[16..].copy_from_slice(&right.to_bytes());
        match self {
            HashAlgo::Murmur3 => Digest(murmur3_x64_128(&buf, 1)),
            HashAlgo::Xxh3 => Digest(xxhash_rust::xxh3::xxh3_128_with_seed(&buf, 1)),
            HashAlgo::Blake3 => Digest(truncate(blake3::keyed_hash(&BLAKE3_NODE_KEY, &buf).as_bytes())),
            HashAlgo::Sha1 => {
                let mut h = sha1::Sha1::new();
                h.update([0x01]);
                h.update(buf);
                Digest(truncate(&h.finalize()))
            }
        }
    }
}

fn truncate(bytes: &[u8]) -> u128 {
    let mut b = [0u8; 16];
    b.copy_from_slice(&bytes[..16]);
    u128::from_le_bytes(b)
}

impl fmt::Display for HashAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for HashAlgo {
    type Err = crate::error::Error;
    fn from_str(s: &str) -> crate::error::Result<Self> {
        HashAlgo::ALL.into_iter().find(|a| a.name() == s).ok_or_else(|| {
            crate::error::Error::InvalidOption(format!("unknown hash '{s}' (expected murmur3, xxh3, blake3 or sha1)"))
        })
    }
}

/// BLAKE3-256 of `bytes`: the integrity hash of files.
pub fn integrity(bytes: &[u8]) -> [u8; 32] {
    *blake3::hash(bytes).as_bytes()
}

/// The digest of the subtree over `bytes` cut into `chunk_size` chunks:
/// leaves, then pairs level by level with the odd last node carried up (the
/// tree's rule, which an aligned subtree shares). A region's digest; `verify`
/// recomputes it from the owner's copy.
pub fn subtree_digest(hash: HashAlgo, chunk_size: u32, bytes: &[u8]) -> Digest {
    if !bytes.is_empty() && bytes.len() <= chunk_size as usize {
        // One chunk: its leaf (no level to build; a restore checks
        // hundreds of thousands of one-chunk references).
        return hash.leaf(bytes);
    }
    let mut level: Vec<Digest> = bytes.chunks(chunk_size as usize).map(|c| hash.leaf(c)).collect();
    while level.len() > 1 {
        level = level.chunks(2).map(|p| if let [l, r] = p { hash.node(*l, *r) } else { p[0] }).collect();
    }
    level.first().copied().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(d: Digest) -> String {
        d.to_string()
    }

    #[test]
    fn xxh3_128_known_answer() {
        // XXH3_128bits("") from the reference implementation's test vectors.
        assert_eq!(HashAlgo::Xxh3.leaf(b"").0, 0x99aa06d3014798d86001c324468d497f);
    }

    #[test]
    fn murmur3_published_vectors() {
        assert_eq!(murmur3_x64_128(b"", 0), 0);
        // MurmurHash3_x64_128("The quick brown fox jumps over the lazy dog", 0)
        // = 6c1b07bc7bbc4be347939ac4a93c437a (reference byte output).
        let d = murmur3_x64_128(b"The quick brown fox jumps over the lazy dog", 0);
        assert_eq!(hex::encode(d.to_le_bytes()), "6c1b07bc7bbc4be347939ac4a93c437a");
    }

    #[test]
    fn blake3_known_answer() {
        // BLAKE3("") = af1349b9f5f9a1a6a0404dea36dcc949 9bcb25c9...
        assert_eq!(hex(HashAlgo::Blake3.leaf(b"")), "af1349b9f5f9a1a6a0404dea36dcc949");
    }

    #[test]
    fn sha1_known_answer() {
        // FIPS 180 example: SHA-1("abc") = a9993e364706816aba3e25717850c26c 9cd0d89d
        assert_eq!(hex(HashAlgo::Sha1.leaf(b"abc")), "a9993e364706816aba3e25717850c26c");
    }

    #[test]
    fn node_domain_differs_from_leaf_domain() {
        let l = Digest(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        let r = Digest(0xfedc_ba98_7654_3210_8899_aabb_ccdd_eeff);
        let mut cat = [0u8; 32];
        cat[..16].copy_from_slice(&l.to_bytes());
        cat[16..].copy_from_slice(&r.to_bytes());
        for algo in HashAlgo::ALL {
            assert_ne!(algo.node(l, r), algo.leaf(&cat), "{algo}");
            assert_ne!(algo.node(l, r), algo.node(r, l), "{algo}");
        }
    }

    #[test]
    fn names_and_codes_round_trip() {
        for algo in HashAlgo::ALL {
            assert_eq!(algo.name().parse::<HashAlgo>().ok(), Some(algo));
            assert_eq!(HashAlgo::from_code(algo.code()), Some(algo));
        }
        assert!("md5".parse::<HashAlgo>().is_err());
        assert_eq!(HashAlgo::from_code(0), None);
    }
}
