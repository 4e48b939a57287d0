//! The runtime's one contact with raw application memory: the regions an
//! application protects by address and length (what C and Fortran pass, and
//! what a Rust simulation's long-lived arrays are), and the slices the
//! runtime reads and writes through them during a checkpoint or restart
//! call. The contract is `Runtime::protect`'s.
#![allow(unsafe_code)]

use crate::error::{Error, Result};
use crate::memory::{DeviceRegion, Protected, ProtectedMut};
use std::collections::BTreeMap;

/// Memory the application protects, by address and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Region {
    /// Host memory.
    Host {
        /// Its first byte.
        ptr: *mut u8,
        /// Its length in bytes.
        len: usize,
    },
    /// Device memory (a `CUdeviceptr` on the runtime's GPU).
    Device {
        /// Its device address.
        ptr: u64,
        /// Its length in bytes.
        len: usize,
    },
}

impl Region {
    /// A host region over `bytes` (its address and length; the borrow ends
    /// here, the contract of `Runtime::protect` takes over).
    pub fn host(bytes: &mut [u8]) -> Region {
        Region::Host { ptr: bytes.as_mut_ptr(), len: bytes.len() }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Region::Host { len, .. } | Region::Device { len, .. } => *len,
        }
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether it is device memory.
    pub fn is_device(&self) -> bool {
        matches!(self, Region::Device { .. })
    }
}

/// Checks a region the application protects as `id`: a null address or
/// an empty region is refused (`Runtime::protect`).
pub(super) fn check(id: u32, region: &Region) -> Result<()> {
    let null = match *region {
        Region::Host { ptr, .. } => ptr.is_null(),
        Region::Device { ptr, .. } => ptr == 0,
    };
    if null || region.is_empty() {
        return Err(Error::InvalidOption(format!("region {id}: a null address or an empty region")));
    }
    Ok(())
}

/// The bytes of a host region (empty for a device region).
pub(super) fn host(r: &Region) -> &[u8] {
    match *r {
        // SAFETY: `protect`'s contract: the region is allocated and readable,
        // and nothing else writes it during this call.
        Region::Host { ptr, len } => unsafe { std::slice::from_raw_parts(ptr, len) },
        Region::Device { .. } => &[],
    }
}

/// The bytes of a host region, to restore into (empty for a device region).
#[allow(clippy::mut_from_ref)] // the application lent the memory for the call (protect's contract)
pub(super) fn host_mut(r: &Region) -> &mut [u8] {
    match *r {
        // SAFETY: `protect`'s contract: the region is allocated and
        // writable, and nothing else reads or writes it during this call;
        // the runtime makes one slice of it at a time.
        Region::Host { ptr, len } => unsafe { std::slice::from_raw_parts_mut(ptr, len) },
        Region::Device { .. } => &mut [],
    }
}

/// Copies the host regions into `buf`, in id order (1 MiB pieces in parallel).
pub(super) fn gather_host(regions: &BTreeMap<u32, Region>, buf: &mut [u8]) {
    let mut at = 0;
    for r in regions.values() {
        let bytes = host(r);
        crate::memory::parallel_copy(&mut buf[at..at + bytes.len()], bytes);
        at += bytes.len();
    }
}

/// Copies `buf` back into the host regions, in id order (1 MiB pieces in
/// parallel: a restart's first touch of the application's pages).
pub(super) fn scatter_host(regions: &BTreeMap<u32, Region>, buf: &[u8]) {
    let mut at = 0;
    for r in regions.values() {
        let len = r.len();
        crate::memory::parallel_copy(host_mut(r), &buf[at..at + len]);
        at += len;
    }
}

/// Every region with its offset in the gathered buffer (ids in order).
pub(super) fn pieces(regions: &BTreeMap<u32, Region>) -> Vec<(usize, Protected<'_>)> {
    placed(regions, |r| match *r {
        Region::Host { .. } => Protected::Host(host(r)),
        // SAFETY: `protect`'s contract (allocated device memory of this GPU,
        // not written during the call); the staging copy checks it lies
        // inside one allocation of the device.
        Region::Device { ptr, len } => Protected::Device(unsafe { DeviceRegion::from_raw(ptr, len) }),
    })
}

/// [`pieces`], to restore into.
pub(super) fn pieces_mut(regions: &BTreeMap<u32, Region>) -> Vec<(usize, ProtectedMut<'_>)> {
    placed(regions, |r| match *r {
        Region::Host { .. } => ProtectedMut::Host(host_mut(r)),
        // SAFETY: as in `pieces`; nothing else reads or writes the region
        // during the call.
        Region::Device { ptr, len } => ProtectedMut::Device(unsafe { DeviceRegion::from_raw(ptr, len) }),
    })
}

/// `piece(region)` for every region, with its offset in the gathered buffer.
fn placed<'a, T>(regions: &'a BTreeMap<u32, Region>, piece: impl Fn(&'a Region) -> T) -> Vec<(usize, T)> {
    let mut at = 0;
    regions
        .values()
        .map(|r| {
            let placed = (at, piece(r));
            at += r.len();
            placed
        })
        .collect()
}
