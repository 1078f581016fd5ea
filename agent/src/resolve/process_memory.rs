//! Reading another process's memory with `process_vm_readv(2)`.
//!
//! Everything read here belongs to the target process and is hostile input: addresses may be
//! unmapped, freed, or reused, and any length found in the target must be bounded by the caller
//! before it sizes a buffer. A read that returns fewer bytes than asked for is a [`Fault`], never
//! a partial result.

/// A read of the target's memory that did not return every byte asked for: unmapped or
/// paged-out memory, a process that has exited, a lack of permission, or an address range that
/// wraps around.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("could not read {len} bytes at {addr:#x} in process {pid} (errno {errno})")]
pub struct Fault {
    pub pid: i32,
    pub addr: u64,
    pub len: usize,
    /// `errno` of a failed call; 0 for a short read or a range that cannot be expressed.
    pub errno: i32,
}

/// The memory of one process, by pid. Holds no file descriptor or other resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessMemory {
    pid: i32,
}

impl ProcessMemory {
    pub fn new(pid: i32) -> Self {
        Self { pid }
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Fills `buf` from `addr` in the target. All of it or a [`Fault`]: a short read is a fault.
    /// An empty `buf` reads nothing and succeeds.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        let len = buf.len();
        let fault = |errno: i32| Fault {
            pid: self.pid,
            addr,
            len,
            errno,
        };
        if len == 0 {
            return Ok(());
        }
        // The kernel refuses ranges that wrap or exceed isize::MAX; refuse them here first, and
        // on a 64-bit target every u64 address fits the iovec's pointer.
        if isize::try_from(len).is_err() || addr.checked_add(len as u64).is_none() {
            return Err(fault(0));
        }
        let Ok(remote_base) = usize::try_from(addr) else {
            return Err(fault(0));
        };
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: len,
        };
        let remote = libc::iovec {
            iov_base: remote_base as *mut libc::c_void,
            iov_len: len,
        };
        // SAFETY: `local` describes exactly `buf`, which is writable and lives across the call;
        // the remote iovec is only read by the kernel, which checks it against the target's
        // address space.
        let n = unsafe { libc::process_vm_readv(self.pid, &local, 1, &remote, 1, 0) };
        if n < 0 {
            return Err(fault(
                std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
            ));
        }
        if n as usize != len {
            return Err(fault(0));
        }
        Ok(())
    }

    pub fn read_i64(&self, addr: u64) -> Result<i64, Fault> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(i64::from_le_bytes(b))
    }

    /// Reads `len` bytes into a new vector, refusing (without allocating) a `len` over `max`.
    /// `len` usually comes from the target: this is where it gets its bound.
    pub fn read_vec(&self, addr: u64, len: usize, max: usize) -> Result<Vec<u8>, Fault> {
        if len > max {
            return Err(Fault {
                pid: self.pid,
                addr,
                len,
                errno: 0,
            });
        }
        let mut v = vec![0u8; len];
        self.read(addr, &mut v)?;
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_memory() {
        let mem = ProcessMemory::new(std::process::id() as i32);
        let data: [u8; 16] = *b"\x01\x02\x03\x04\x05\x06\x07\x08\xff\xff\xff\xffhij\0";
        let base = data.as_ptr() as u64;
        assert_eq!(mem.read_i64(base).unwrap(), 0x0807_0605_0403_0201);
        assert_eq!(
            mem.read_i64(base + 4).unwrap(),
            i64::from_le_bytes([5, 6, 7, 8, 0xff, 0xff, 0xff, 0xff])
        );
        let mut buf = [0u8; 3];
        mem.read(base + 12, &mut buf).unwrap();
        assert_eq!(&buf, b"hij");
        assert_eq!(mem.read_vec(base + 12, 4, 4).unwrap(), b"hij\0");
        mem.read(0, &mut []).unwrap();
    }

    #[test]
    fn faults() {
        let mem = ProcessMemory::new(std::process::id() as i32);
        assert!(mem.read_i64(0).is_err());
        assert!(mem.read_i64(8).is_err());
        assert!(mem.read_i64(u64::MAX - 3).is_err());
        assert!(mem.read_vec(0xffff_ffff_ffff_f000, 1, 1).is_err());
        // A huge length is refused before anything is allocated.
        let e = mem.read_vec(0x1000, usize::MAX, 1 << 20).unwrap_err();
        assert_eq!(e.len, usize::MAX);
        // A read straddling the end of a mapping is short: a fault, not a partial result.
        let page = 4096usize;
        // SAFETY: plain anonymous mapping of two pages, the second one unmapped right away.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: unmaps the second page of the mapping made above.
        unsafe { libc::munmap((p as *mut u8).add(page).cast(), page) };
        let end = p as u64 + page as u64;
        assert!(mem.read_i64(end - 8).is_ok());
        let mut buf = [0u8; 16];
        assert!(mem.read(end - 8, &mut buf).is_err());
        // SAFETY: unmaps the first page, still mapped.
        unsafe { libc::munmap(p, page) };
        // A process that does not exist.
        assert!(ProcessMemory::new(i32::MAX).read_vec(end, 1, 1).is_err());
    }
}
