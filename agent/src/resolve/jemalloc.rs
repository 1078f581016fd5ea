//! jemalloc's own sampling (its heap profiling, on where a process starts with
//! `MALLOC_CONF` holding `prof:true`). Ember cannot use it: Debian's build exports no function
//! of its sampled path (the only call out of it is to libgcc's `_Unwind_Backtrace`, which
//! carries neither size nor address), so every allocator call is probed there as elsewhere,
//! and the log says why.
use std::io::Read as _;

use super::untrusted::open_nonblocking;

/// The most of a process's environment read: a process chooses its length.
const MAX_ENVIRON: u64 = 256 << 10;

/// Whether process `pid` started with jemalloc's profiling on, as its environment says.
pub fn profiling_on(pid: u32) -> bool {
    let mut environ = Vec::new();
    let read = open_nonblocking(format!("/proc/{pid}/environ").as_ref()).and_then(|file| file.take(MAX_ENVIRON).read_to_end(&mut environ));
    read.is_ok() && profiling_in(&environ)
}

/// Whether an environment (NUL-separated `NAME=value`s) sets `MALLOC_CONF` with `prof:true`.
pub(crate) fn profiling_in(environ: &[u8]) -> bool {
    let conf = environ.split(|&b| b == 0).find_map(|entry| entry.strip_prefix(b"MALLOC_CONF="));
    conf.is_some_and(|conf| conf.split(|&b| b == b',').any(|option| option == b"prof:true"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiling_is_on_where_malloc_conf_says_prof_true() {
        assert!(profiling_in(b"PATH=/bin\0MALLOC_CONF=lg_prof_sample:19,prof:true\0HOME=/"));
        assert!(!profiling_in(b"MALLOC_CONF=prof:false\0"));
        assert!(!profiling_in(b"X_MALLOC_CONF=prof:true\0MALLOC_CONFIG=prof:true"));
        assert!(!profiling_in(b""));
    }
}
