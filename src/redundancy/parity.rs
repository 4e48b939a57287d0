//! XOR parity of a group (SCR's XOR scheme): each of the group's `k`
//! members cuts its bundle (zero-padded to the longest) into `k − 1`
//! segments and gives one to each other member; member `j` stores the XOR
//! of the segments it was given. A lost member's segment `s` is then the
//! parity of the member holding it XOR the other survivors' segments for
//! that holder: one lost member per group is rebuilt from the others,
//! and each member stores `1/(k − 1)` of a bundle.
//!
//! ```text
//! dckpt-parity 1 <hex BLAKE3-256 of everything after this line>
//! {"version":7,"holder":5,"members":[1,3,5,7],"lens":[…],"digests":["<BLAKE3 hex of each bundle>",…],"segment_len":…}
//! <the parity segment>
//! ```

use super::envelope;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

const TAG: &str = "dckpt-parity";

/// What a parity file says about its group's version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParityHeader {
    /// The version.
    pub version: u64,
    /// The member holding this segment.
    pub holder: u32,
    /// The group, sorted.
    pub members: Vec<u32>,
    /// Each member's bundle length, in `members` order.
    pub lens: Vec<u64>,
    /// Each member's bundle digest (BLAKE3 hex), in `members` order.
    pub digests: Vec<String>,
    /// Bytes of a segment.
    pub segment_len: u64,
}

/// Bytes of a segment for bundles of at most `longest` bytes in a group of
/// `members` (at least one).
pub fn segment_len(longest: u64, members: usize) -> u64 {
    longest.div_ceil(members.saturating_sub(1).max(1) as u64).max(1)
}

/// Which of member `from`'s segments goes to member `holder` (positions in
/// the group, `from ≠ holder`).
pub fn slot(from: usize, holder: usize) -> usize {
    if holder < from { holder } else { holder - 1 }
}

/// Segment `slot` of `bundle`, zero-padded to `len` bytes.
pub fn segment(bundle: &[u8], slot: usize, len: u64) -> Vec<u8> {
    let len = len as usize;
    let mut out = vec![0u8; len];
    let start = (slot * len).min(bundle.len());
    let end = (start + len).min(bundle.len());
    out[..end - start].copy_from_slice(&bundle[start..end]);
    out
}

/// `dst ^= src` over their common length.
pub fn xor_into(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= s;
    }
}

/// The parity file of `header` and its segment.
pub fn encode(header: &ParityHeader, segment: &[u8]) -> Vec<u8> {
    envelope::encode(TAG, header, &[segment])
}

/// Parses and checks a parity file (`path` names it in errors).
pub fn decode(bytes: &[u8], path: &Path) -> Result<(ParityHeader, Vec<u8>)> {
    let corrupt = |r: &str| Error::corrupt(path, format!("parity: {r}"));
    let (h, seg): (ParityHeader, &[u8]) = envelope::decode(bytes, path, TAG, "parity file")?;
    let consistent = h.members.len() >= 2
        && h.members.windows(2).all(|w| w[0] < w[1])
        && h.members.contains(&h.holder)
        && h.lens.len() == h.members.len()
        && h.digests.len() == h.members.len()
        && seg.len() as u64 == h.segment_len
        && h.segment_len == segment_len(h.lens.iter().copied().max().unwrap_or(0), h.members.len());
    if !consistent {
        return Err(corrupt("its group, lengths or segment do not agree"));
    }
    Ok((h, seg.to_vec()))
}

/// Every member's parity segment of `bundles` (one per member, in group
/// order): what the exchange computes, in one process.
pub fn parity_segments(bundles: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let k = bundles.len();
    let len = segment_len(bundles.iter().map(|b| b.len() as u64).max().unwrap_or(0), k);
    (0..k)
        .map(|j| {
            let mut p = vec![0u8; len as usize];
            for (i, b) in bundles.iter().enumerate().filter(|&(i, _)| i != j) {
                xor_into(&mut p, &segment(b, slot(i, j), len));
            }
            p
        })
        .collect()
}

/// Survivor `holder`'s piece of the lost member `lost`'s bundle: its parity
/// XOR the segments the other survivors gave it (`given`: each other
/// survivor's segment for `holder`).
pub fn piece(parity: &[u8], given: &[Vec<u8>]) -> Vec<u8> {
    let mut p = parity.to_vec();
    for g in given {
        xor_into(&mut p, g);
    }
    p
}

/// The lost member's bundle from every survivor's piece, by survivor
/// position (the lost position's entry unused), cut to `len` bytes.
pub fn assemble(lost: usize, pieces: &[Vec<u8>], len: u64) -> Vec<u8> {
    let mut out: Vec<u8> = pieces.iter().enumerate().filter(|&(j, _)| j != lost).flat_map(|(_, p)| p.clone()).collect();
    out.truncate(len as usize);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundles(k: usize, seed: u64) -> Vec<Vec<u8>> {
        (0..k)
            .map(|i| {
                let len = 1 + ((seed * 7919 + i as u64 * 104_729) % 5000) as usize;
                (0..len).map(|b| ((b as u64 * 31 + i as u64 * 17 + seed) % 251) as u8).collect()
            })
            .collect()
    }

    /// Any one member of groups of 2 to 9 is rebuilt byte-exactly from the
    /// others' bundles and parity.
    #[test]
    fn any_one_lost_member_is_rebuilt_from_the_survivors() {
        for k in 2..=9 {
            for seed in 0..4 {
                let b = bundles(k, seed);
                let par = parity_segments(&b);
                let len = segment_len(b.iter().map(|x| x.len() as u64).max().unwrap(), k);
                for lost in 0..k {
                    let pieces: Vec<Vec<u8>> = (0..k)
                        .map(|j| match j == lost {
                            true => Vec::new(),
                            false => {
                                let given: Vec<Vec<u8>> = (0..k)
                                    .filter(|&i| i != j && i != lost)
                                    .map(|i| segment(&b[i], slot(i, j), len))
                                    .collect();
                                piece(&par[j], &given)
                            }
                        })
                        .collect();
                    assert_eq!(assemble(lost, &pieces, b[lost].len() as u64), b[lost], "k {k} seed {seed} lost {lost}");
                }
            }
        }
    }

    #[test]
    fn a_damaged_parity_file_is_refused() {
        let b = bundles(3, 1);
        let len = segment_len(b.iter().map(|x| x.len() as u64).max().unwrap(), 3);
        let h = ParityHeader {
            version: 7,
            holder: 4,
            members: vec![0, 4, 8],
            lens: b.iter().map(|x| x.len() as u64).collect(),
            digests: b.iter().map(|x| blake3::hash(x).to_hex().to_string()).collect(),
            segment_len: len,
        };
        let seg = parity_segments(&b)[1].clone();
        let file = encode(&h, &seg);
        assert_eq!(decode(&file, Path::new("p")).unwrap(), (h, seg));
        for at in [3, file.len() / 2, file.len() - 1] {
            let mut f = file.clone();
            f[at] ^= 0x10;
            assert!(decode(&f, Path::new("p")).is_err(), "flip at {at}");
        }
    }
}
