//! ClickHouse's RowBinary format, the one way rows travel between the collector and ClickHouse
//! in both directions (inserts, bound parameters, answers): values in column order, integers
//! little-endian, strings and arrays after their LEB128 length. Data never becomes SQL text.
use anyhow::{bail, Context as _, Result};

/// Rows being written.
#[derive(Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    fn length(&mut self, mut n: usize) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                self.0.push(byte);
                return;
            }
            self.0.push(byte | 0x80);
        }
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A `Date`: days since 1970-01-01.
    pub fn date(&mut self, unix_ns: u64) -> &mut Self {
        self.0.extend_from_slice(&((unix_ns / 86_400_000_000_000) as u16).to_le_bytes());
        self
    }

    pub fn str(&mut self, s: &str) -> &mut Self {
        self.length(s.len());
        self.0.extend_from_slice(s.as_bytes());
        self
    }

    pub fn strs<'a>(&mut self, items: impl ExactSizeIterator<Item = &'a str>) -> &mut Self {
        self.length(items.len());
        for s in items {
            self.str(s);
        }
        self
    }

    pub fn i64s(&mut self, items: &[i64]) -> &mut Self {
        self.length(items.len());
        for &v in items {
            self.i64(v);
        }
        self
    }

    pub fn u64s(&mut self, items: &[u64]) -> &mut Self {
        self.length(items.len());
        for &v in items {
            self.u64(v);
        }
        self
    }
}

/// Rows being read; every read is bounds-checked (the answer is data from a server).
pub struct Reader<'a>(pub &'a [u8]);

impl<'a> Reader<'a> {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.0.len() < n {
            bail!("ClickHouse's answer ends inside a value");
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    pub fn length(&mut self) -> Result<usize> {
        let mut n = 0usize;
        for shift in (0..64).step_by(7) {
            let byte = self.take(1)?[0];
            n |= ((byte & 0x7f) as usize) << shift;
            if byte & 0x80 == 0 {
                // Every string byte or array item takes a byte at least: a longer length is
                // refused before anything is allocated for it.
                return (n <= self.0.len()).then_some(n).context("a length in ClickHouse's answer is longer than the answer");
            }
        }
        bail!("a length in ClickHouse's answer does not end")
    }

    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    pub fn f64(&mut self) -> Result<f64> {
        Ok(f64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    pub fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    pub fn str(&mut self) -> Result<String> {
        let n = self.length()?;
        String::from_utf8(self.take(n)?.to_vec()).context("a string in ClickHouse's answer is not UTF-8")
    }

    pub fn strs(&mut self) -> Result<Vec<String>> {
        (0..self.length()?).map(|_| self.str()).collect()
    }

    pub fn i64s(&mut self) -> Result<Vec<i64>> {
        (0..self.length()?).map(|_| self.i64()).collect()
    }

    pub fn u64s(&mut self) -> Result<Vec<u64>> {
        (0..self.length()?).map(|_| self.u64()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_back_as_written_and_truncation_is_an_error() {
        let mut w = Writer::default();
        w.u64(7).str("é\t\n").i64s(&[-1, 2]).strs(["a", ""].into_iter()).str(&"x".repeat(300));
        let mut r = Reader(&w.0);
        assert_eq!(r.u64().unwrap(), 7);
        assert_eq!(r.str().unwrap(), "é\t\n");
        assert_eq!(r.i64s().unwrap(), [-1, 2]);
        assert_eq!(r.strs().unwrap(), ["a", ""]);
        assert_eq!(r.str().unwrap().len(), 300);
        assert!(r.is_empty());
        assert!(Reader(&w.0[..w.0.len() - 1]).u64().is_ok());
        let mut cut = Reader(&w.0[..12]);
        assert!(cut.u64().is_ok() && cut.str().is_err());
        // A huge length in a short answer is refused, not allocated.
        assert!(Reader(&[0xff, 0xff, 0xff, 0xff, 0x0f]).strs().is_err());
    }
}
