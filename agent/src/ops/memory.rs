//! Giving memory back between intervals. Symbolizing an interval touches heap and file pages
//! that the next one may not need: the heap's free pages go back to the kernel, and the pages
//! of the files mapped for reading (binaries and debug files that blazesym and the symbol
//! indexes read) are unmapped from the agent. Those stay in the page cache, shared and
//! reclaimable; reading them again costs a minor fault. Tables sized by the processes of the
//! host give their room back as the processes go (`fit`).
use std::{collections::HashMap, fs, hash::Hash};

use crate::maps_line::MapsLine;

/// Called by the pipeline thread after each interval.
pub fn give_back() {
    // SAFETY: no preconditions; it only returns free heap pages to the kernel.
    unsafe { libc::malloc_trim(0) };
    release_file_pages();
}

/// Shrinks a table to the most it held since the last call (`peak`), when that is less than
/// half its room. Hash tables only grow: one that follows the processes of the host would
/// otherwise keep, for good, the doubled room of a moment when their count crossed a doubling
/// point (some 0.7 MiB for the process table at 1,800 processes). Sized by the peak, not by
/// what is left after a sweep: a table that fills between sweeps would otherwise shrink at
/// every sweep and grow back before the next, a rehash and a large block freed and taken
/// again each interval.
pub fn fit<K: Eq + Hash, V>(table: &mut HashMap<K, V>, peak: usize) {
    let peak = peak.max(table.len());
    if table.capacity() > 2 * peak + 64 {
        table.shrink_to(peak);
    }
}

fn release_file_pages() {
    let Ok(maps) = fs::read_to_string("/proc/self/maps") else { return };
    for (start, end) in maps.lines().filter_map(read_only_file_mapping) {
        // SAFETY: the range is a whole mapping of a file, shared and read-only: dropping its
        // pages loses nothing, and a later read faults them in again from the page cache.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
    }
}

/// (start, end) of a `/proc/self/maps` line that maps a regular file shared and read-only: how
/// blazesym and the symbol indexes map what they read. Code and the agent's own data are
/// private mappings; BPF maps and perf buffers map anonymous inodes, whose pages must stay.
fn read_only_file_mapping(line: &str) -> Option<(usize, usize)> {
    let line = MapsLine::parse(line)?;
    let path = line.path;
    if line.perms != "r--s" || !path.starts_with('/') || path.starts_with("/memfd:") || path.ends_with("(deleted)") {
        return None;
    }
    Some((usize::try_from(line.start).ok()?, usize::try_from(line.end).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_gives_back_only_the_room_its_peak_did_not_use() {
        let mut table: HashMap<u32, [u8; 100]> = (0..2000).map(|i| (i, [0; 100])).collect();
        let room = table.capacity();
        table.retain(|&i, _| i < 500);
        // Emptied by a sweep after a peak of 2,000: the room stays for the next peak.
        // (Removals leave tombstones, which may take a slot or two of the room shown.)
        let kept = |table: &HashMap<u32, [u8; 100]>| table.capacity() * 10 >= room * 9;
        fit(&mut table, 2000);
        assert!(kept(&table), "the room of a peak that comes back is kept: {} of {room}", table.capacity());
        // A peak of 1,800 still uses more than half of it.
        fit(&mut table, 1800);
        assert!(kept(&table), "{} of {room} kept for a peak of 1,800", table.capacity());
        // The host calmed down: peaks of 500 give the room back.
        fit(&mut table, 500);
        assert!(table.capacity() < room / 2 && table.len() == 500, "{} of {room} kept for 500", table.capacity());
    }

    #[test]
    fn only_shared_read_only_mappings_of_regular_files_are_released() {
        let lines = [
            ("7ff4a9400000-7ff4a97fa000 r--s 00000000 fe:00 257061  /usr/lib/debug/.build-id/93/ac61.debug", Some((0x7ff4a9400000, 0x7ff4a97fa000))),
            ("561cc5775000-561cc63be000 r-xp 004f9000 fe:00 5319435  /work/target/release/ember-agent", None),
            ("561cc527b000-561cc5775000 r--p 00000000 fe:00 5319435  /work/target/release/ember-agent", None),
            ("7ff4a9b23000-7ff4a9b44000 r--s 00001000 00:10 1038  anon_inode:bpf-map", None),
            ("7ff4a9923000-7ff4a9b23000 rw-p 00000000 00:00 0", None),
            ("7ff4a9b23000-7ff4a9b44000 r--s 00000000 00:01 77  /memfd:spool (deleted)", None),
        ];
        for (line, expected) in lines {
            assert_eq!(read_only_file_mapping(line), expected, "{line}");
        }
    }

    #[test]
    fn released_pages_of_a_mapped_file_read_back_the_same() {
        let path = std::env::temp_dir().join(format!("ember-memory-test-{}", std::process::id()));
        let content: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        fs::write(&path, &content).unwrap();
        let file = fs::File::open(&path).unwrap();
        // SAFETY: the file is ours and not written while mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let resident = || rss_of(&path);
        assert_eq!(&map[..], &content[..]);
        assert!(resident() >= 1 << 20, "the mapping is resident after a read: {} bytes", resident());
        release_file_pages();
        assert!(resident() < 1 << 20, "the mapping's pages are released: {} bytes resident", resident());
        assert_eq!(&map[..], &content[..]);
        drop(map);
        fs::remove_file(&path).unwrap();
    }

    /// Resident bytes of this process's mappings of `path`, from /proc/self/smaps.
    fn rss_of(path: &std::path::Path) -> usize {
        let smaps = fs::read_to_string("/proc/self/smaps").unwrap();
        let mut in_file = false;
        let mut total = 0;
        for line in smaps.lines() {
            let header = line.split_whitespace().next().is_some_and(|t| t.contains('-') && t.chars().all(|c| c.is_ascii_hexdigit() || c == '-'));
            if header {
                in_file = line.ends_with(path.to_str().unwrap());
            } else if in_file && line.starts_with("Rss:") {
                total += line.split_whitespace().nth(1).unwrap().parse::<usize>().unwrap() * 1024;
            }
        }
        total
    }
}
