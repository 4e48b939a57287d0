//! Little-endian encoding helpers with bounds-checked reads.

/// Appends little-endian values to a byte vector.
pub trait PutLe {
    /// Appends a `u8`.
    fn put_u8(&mut self, v: u8);
    /// Appends a `u16`.
    fn put_u16(&mut self, v: u16);
    /// Appends a `u32`.
    fn put_u32(&mut self, v: u32);
    /// Appends a `u64`.
    fn put_u64(&mut self, v: u64);
}

impl PutLe for Vec<u8> {
    fn put_u8(&mut self, v: u8) {
        self.push(v);
    }
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
}

/// Reads little-endian values from a slice; every read is bounds-checked and
/// fails with a description instead of panicking.
pub struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, at: 0 }
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        if self.remaining() < n {
            return Err(format!("truncated {what}: need {n} bytes at offset {}, {} left", self.at, self.remaining()));
        }
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    /// A `u8`.
    pub fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.array::<1>(what)?[0])
    }
    /// A `u16`.
    pub fn u16(&mut self, what: &str) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    /// A `u32`.
    pub fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    /// A `u64`.
    pub fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    /// 16 bytes.
    pub fn bytes16(&mut self, what: &str) -> Result<[u8; 16], String> {
        self.array(what)
    }
    /// 32 bytes.
    pub fn bytes32(&mut self, what: &str) -> Result<[u8; 32], String> {
        self.array(what)
    }
}

/// `count × size` as a byte length, refusing overflow and lengths above `limit`.
pub fn table_len(count: u64, size: u64, limit: u64, what: &str) -> Result<u64, String> {
    count
        .checked_mul(size)
        .filter(|&n| n <= limit)
        .ok_or_else(|| format!("{what}: {count} entries of {size} bytes exceed the file ({limit} bytes)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_was_written_and_refuses_to_overrun() {
        let mut v = Vec::new();
        v.put_u8(1);
        v.put_u16(2);
        v.put_u32(3);
        v.put_u64(4);
        let mut c = Cursor::new(&v);
        assert_eq!(c.u8("a"), Ok(1));
        assert_eq!(c.u16("b"), Ok(2));
        assert_eq!(c.u32("c"), Ok(3));
        assert_eq!(c.u64("d"), Ok(4));
        assert!(c.u8("e").is_err());
        assert!(table_len(u64::MAX, 16, 100, "t").is_err());
        assert_eq!(table_len(3, 16, 100, "t"), Ok(48));
    }
}
