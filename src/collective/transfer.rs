//! Byte strings between ranks over MPI, in rounds that keep every count and
//! displacement within MPI's `int` (the copies of the node-local tier and
//! a restart's fetches move whole diff files).

use crate::error::{Error, Result};
use ::mpi::datatype::{Partition, PartitionMut};
use ::mpi::traits::*;

/// The most bytes one rank receives in one round, all senders together.
const ROUND_BYTES: usize = 1 << 30;

/// Sends `outgoing[r]` to rank `r` (empty: nothing) and returns what each
/// rank sent here, by rank. Collective; every rank gives one entry per rank.
pub(crate) fn exchange<C: Communicator>(comm: &C, outgoing: &[Vec<u8>]) -> Result<Vec<Vec<u8>>> {
    let p = comm.size() as usize;
    if outgoing.len() != p {
        return Err(Error::Internal(format!("an exchange over {p} ranks was given {} buffers", outgoing.len())));
    }
    let lens: Vec<u64> = outgoing.iter().map(|b| b.len() as u64).collect();
    let mut incoming_lens = vec![0u64; p];
    comm.all_to_all_into(&lens[..], &mut incoming_lens[..]);
    let mut incoming: Vec<Vec<u8>> = incoming_lens.iter().map(|&l| Vec::with_capacity(l as usize)).collect();
    // Every round's counts and displacements stay within MPI's `int`.
    let per_peer = (ROUND_BYTES / p).max(1);
    let mut sent = vec![0usize; p];
    loop {
        // Whether any rank has bytes left to send (every rank loops alike).
        let left = u64::from(outgoing.iter().zip(&sent).any(|(b, &s)| s < b.len()));
        let mut any = 0u64;
        comm.all_reduce_into(&left, &mut any, ::mpi::collective::SystemOperation::max());
        if any == 0 {
            break;
        }
        let (mut send, mut counts, mut displs) = (Vec::new(), Vec::with_capacity(p), Vec::with_capacity(p));
        for (b, s) in outgoing.iter().zip(sent.iter_mut()) {
            let n = (b.len() - *s).min(per_peer);
            displs.push(send.len() as i32);
            counts.push(n as i32);
            send.extend_from_slice(&b[*s..*s + n]);
            *s += n;
        }
        let (mut rcounts, mut rdispls, mut total) = (Vec::with_capacity(p), Vec::with_capacity(p), 0usize);
        for (r, want) in incoming_lens.iter().enumerate() {
            let n = (*want as usize - incoming[r].len()).min(per_peer);
            rdispls.push(total as i32);
            rcounts.push(n as i32);
            total += n;
        }
        // Never an empty buffer: its dangling pointer (1) is Open MPI's
        // MPI_IN_PLACE. The extra byte is outside every count.
        send.push(0);
        let mut recv = vec![0u8; total + 1];
        {
            let sendp = Partition::new(&send[..], &counts[..], &displs[..]);
            let mut recvp = PartitionMut::new(&mut recv[..], &rcounts[..], &rdispls[..]);
            comm.all_to_all_varcount_into(&sendp, &mut recvp);
        }
        for (r, inc) in incoming.iter_mut().enumerate() {
            let (at, n) = (rdispls[r] as usize, rcounts[r] as usize);
            inc.extend_from_slice(&recv[at..at + n]);
        }
    }
    Ok(incoming)
}

/// Every rank's `mine`, by rank (an `MPI_Allgatherv`; at most 1 GiB in all,
/// else an error on every rank). Collective.
pub(crate) fn gather<C: Communicator>(comm: &C, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
    let p = comm.size() as usize;
    let mut lens = vec![0u64; p];
    comm.all_gather_into(&(mine.len() as u64), &mut lens[..]);
    let total: u64 = lens.iter().sum();
    if total > ROUND_BYTES as u64 {
        return Err(Error::ResourcesExhausted {
            what: "the files every rank gathers".into(),
            reason: format!("{total} bytes, more than one gather carries ({ROUND_BYTES})"),
        });
    }
    let counts: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
    let displs: Vec<i32> = lens.iter().scan(0i32, |at, &l| Some(std::mem::replace(at, *at + l as i32))).collect();
    // Never an empty buffer (see `exchange`); the extra byte is outside every count.
    let mut send = mine.to_vec();
    send.push(0);
    let mut recv = vec![0u8; total as usize + 1];
    {
        let mut part = PartitionMut::new(&mut recv[..], &counts[..], &displs[..]);
        // An empty slice of a buffer of one byte points into it, not at 1.
        comm.all_gather_varcount_into(&send[..mine.len()], &mut part);
    }
    Ok(lens.iter().zip(&displs).map(|(&l, &d)| recv[d as usize..d as usize + l as usize].to_vec()).collect())
}

/// Files as one byte string: for each, its name's length (u32 LE), the
/// name, its length (u64 LE), its bytes.
pub(crate) fn pack(files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, bytes) in files {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out
}

/// The files [`pack`] made, or an error naming `from`.
pub(crate) fn unpack(mut bytes: &[u8], from: &str) -> Result<Vec<(String, Vec<u8>)>> {
    let bad = || Error::Collective(format!("malformed file list from {from}"));
    let take = |n: usize, b: &mut &[u8]| -> Result<Vec<u8>> {
        if b.len() < n {
            return Err(bad());
        }
        let (head, tail) = b.split_at(n);
        *b = tail;
        Ok(head.to_vec())
    };
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let n = u32::from_le_bytes(take(4, &mut bytes)?.try_into().map_err(|_| bad())?) as usize;
        let name = String::from_utf8(take(n, &mut bytes)?).map_err(|_| bad())?;
        let len = u64::from_le_bytes(take(8, &mut bytes)?.try_into().map_err(|_| bad())?);
        let body = take(usize::try_from(len).map_err(|_| bad())?, &mut bytes)?;
        out.push((name, body));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_files_unpack_as_they_were_and_a_cut_list_is_refused() {
        let files = vec![("a".to_string(), vec![1, 2, 3]), ("rank-00001/MANIFEST".to_string(), Vec::new())];
        let bytes = pack(&files);
        assert_eq!(unpack(&bytes, "rank 1").unwrap(), files);
        assert!(unpack(&bytes[..bytes.len() - 1], "rank 1").is_err());
        assert!(unpack(&[], "rank 1").unwrap().is_empty());
    }
}
