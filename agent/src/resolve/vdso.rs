//! The vDSO: code the kernel maps into every process (clock_gettime, gettimeofday, getcpu),
//! one image for every 64-bit process on the host. It has no file: the agent copies its own
//! into a memfd once, so that the vDSO unwinds (from its .eh_frame) and symbolizes as a file.
use std::{
    fs::File,
    io::{self, Write as _},
    os::fd::FromRawFd,
    sync::OnceLock,
};

use crate::maps_line::MapsLine;

/// The copy, and its length.
static IMAGE: OnceLock<Option<(File, u64)>> = OnceLock::new();

/// A file holding the vDSO, for a process whose vDSO mapping is `len` bytes (another length is
/// another image: a 32-bit process's).
pub fn image(len: u64) -> Option<File> {
    let image = IMAGE.get_or_init(|| copy().inspect_err(|e| tracing::warn!("vDSO frames stay unnamed: copying the vDSO failed: {e}")).ok());
    let (image, copied) = image.as_ref()?;
    (*copied == len).then(|| image.try_clone().ok()).flatten()
}

fn copy() -> io::Result<(File, u64)> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let vdso = maps.lines().filter_map(MapsLine::parse).find(|l| l.path == "[vdso]").ok_or(io::ErrorKind::NotFound)?;
    // SAFETY: the vDSO stays mapped, readable, in this process for its whole life.
    let bytes = unsafe { std::slice::from_raw_parts(vdso.start as *const u8, (vdso.end - vdso.start) as usize) };
    Ok((memory_file(c"ember-vdso", bytes)?, bytes.len() as u64))
}

/// A file in memory (memfd) holding `bytes`: for readers that take a file.
pub fn memory_file(name: &std::ffi::CStr, bytes: &[u8]) -> io::Result<File> {
    // SAFETY: memfd_create with a NUL-terminated name; the fd it returns is owned by nothing else.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor.
    let mut file = unsafe { File::from_raw_fd(fd) };
    file.write_all(bytes)?;
    Ok(file)
}
