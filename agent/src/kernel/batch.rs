//! Reading hash maps in batches (`BPF_MAP_LOOKUP_BATCH` and friends, Linux 5.6): the drain
//! reads thousands of entries an interval, and at one syscall to find each key, one to read it
//! and one to delete it, the syscalls alone were a third of the agent's steady CPU.
use std::{
    cell::RefCell,
    io,
    os::fd::{AsFd as _, AsRawFd as _},
};

use aya::{maps::MapData, Pod};

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_LOOKUP_AND_DELETE_BATCH: libc::c_long = 25;
const BPF_MAP_DELETE_BATCH: libc::c_long = 27;

/// Entries a call may return: big enough that a map of thousands takes a few calls, small
/// enough that its buffer stays small (user stacks are about 1 KiB each).
const CHUNK: usize = 256;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

thread_local! {
    /// What batch calls write entries into, kept from one read to the next. Allocated for each
    /// call (up to 260 KiB for user stacks), it was where the heap sorted what the last
    /// interval freed: a sixth of the agent's CPU in a profile of it at the governor's floor.
    static BUFFER: RefCell<Vec<u64>> = RefCell::default();
}

/// Reads every entry of a hash map, `values_per_key` values to a key (the number of possible
/// CPUs for a per-CPU map, else 1), and deletes what it read if `delete`. Entries that
/// programs add meanwhile may or may not be read.
pub fn read<K: Pod, V: Pod>(map: &MapData, values_per_key: usize, delete: bool, mut each: impl FnMut(K, &[V])) -> io::Result<()> {
    // Keys and values are laid out in a buffer of u64: their alignment must not be more.
    const { assert!(align_of::<K>() <= 8 && align_of::<V>() <= 8) };
    // The kernel's cursor in the map, opaque here (a bucket index for hash maps).
    let (mut cursor_in, mut cursor_out) = (0u64, 0u64);
    let mut chunk = CHUNK;
    let mut first = true;
    BUFFER.with_borrow_mut(|buffer| loop {
        let keys_bytes = (chunk * size_of::<K>()).next_multiple_of(8);
        buffer.resize(buffer.len().max((keys_bytes + chunk * values_per_key * size_of::<V>()).div_ceil(8)), 0);
        let keys = buffer.as_mut_ptr().cast::<K>();
        // SAFETY: within the buffer, which holds `keys_bytes` and the values after them.
        let values = unsafe { buffer.as_mut_ptr().byte_add(keys_bytes) }.cast::<V>();
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { &raw mut cursor_in as u64 },
            out_batch: &raw mut cursor_out as u64,
            keys: keys as u64,
            values: values as u64,
            count: chunk as u32,
            map_fd: map.fd().as_fd().as_raw_fd() as u32,
            ..Default::default()
        };
        let command = if delete { BPF_MAP_LOOKUP_AND_DELETE_BATCH } else { BPF_MAP_LOOKUP_BATCH };
        let done = match bpf(command, &mut attr) {
            Ok(()) => false,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
            // One bucket holds more than a chunk: nothing was read; try again with room.
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                chunk *= 2;
                continue;
            }
            Err(e) => return Err(e),
        };
        for i in 0..(attr.count as usize).min(chunk) {
            // SAFETY: the kernel wrote `count` keys and `count * values_per_key` values there,
            // aligned (the sizes of Pod types are multiples of their alignment), and any bytes
            // are a valid K and V (Pod).
            let (key, values) = unsafe { (keys.add(i).read(), std::slice::from_raw_parts(values.add(i * values_per_key), values_per_key)) };
            each(key, values);
        }
        if done {
            return Ok(());
        }
        cursor_in = cursor_out;
        first = false;
    })
}

/// Deletes `keys` from a map in one call per chunk. A key that is not there ends the call
/// early with ENOENT: the rest of its chunk is deleted one by one.
pub fn delete<K: Pod>(map: &MapData, keys: &[K]) -> io::Result<()> {
    for chunk in keys.chunks(CHUNK) {
        let mut attr = BatchAttr {
            keys: chunk.as_ptr() as u64,
            count: chunk.len() as u32,
            map_fd: map.fd().as_fd().as_raw_fd() as u32,
            ..Default::default()
        };
        match bpf(BPF_MAP_DELETE_BATCH, &mut attr) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                let deleted = attr.count as usize;
                // The one not found is skipped; the others after it are tried again.
                delete(map, chunk.get(deleted + 1..).unwrap_or_default())?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn bpf(command: libc::c_long, attr: &mut BatchAttr) -> io::Result<()> {
    // SAFETY: `attr` is a valid `bpf_attr` prefix for the batch commands, of the size given,
    // and the buffers it points to outlive the call.
    let result = unsafe { libc::syscall(libc::SYS_bpf, command, attr as *mut BatchAttr, size_of::<BatchAttr>()) };
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}
