//! A process's lives: one pid runs one program until it execs another, and a pid that was
//! freed is handed to a new process. The programs tag every sample with the life it was
//! taken in (`SampleKey::process_tag`) and announce each life, so that samples of an earlier
//! life are named from that life's mappings, not from whatever holds the pid at the drain.
use std::{fs, sync::OnceLock};

/// A life, as the kernel announced it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Life {
    pub tag: u16,
    /// When the process started (its leader's `start_boottime`, ns), or 0 if the kernel
    /// could not tell (the life was announced from another task).
    pub start_ns: u64,
}

impl Life {
    /// Whether process `tgid` is still the one this life belongs to (not a new process with
    /// its pid), as far as its start time tells; true if the start is unknown.
    pub fn still_holds(&self, tgid: u32) -> bool {
        if self.start_ns == 0 {
            return true;
        }
        // /proc shows the start in clock ticks: the kernel's ns divided down.
        let ns_per_tick = 1_000_000_000 / clock_ticks_per_second();
        started_ticks(tgid).is_some_and(|ticks| ticks == self.start_ns / ns_per_tick)
    }
}

fn clock_ticks_per_second() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    // SAFETY: sysconf has no preconditions.
    *TICKS.get_or_init(|| u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok().filter(|&t| t > 0).unwrap_or(100))
}

/// Field 22 of /proc/<tgid>/stat: when the process started, in clock ticks since boot.
fn started_ticks(tgid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{tgid}/stat")).ok()?;
    parse_start(&stat)
}

/// The start time from a stat line. The command name, field 2, is in parentheses and may hold
/// spaces and parentheses itself: the fields after it are counted from the last ')'.
fn parse_start(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_start_time_past_a_name_with_spaces_and_parentheses() {
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 1 0 987654 12345678 300";
        assert_eq!(parse_start(stat), Some(987654));
        assert_eq!(parse_start("4242 (x) S 1"), None);
    }

    #[test]
    fn the_agents_own_start_is_its_kernel_start() {
        let me = std::process::id();
        let ticks = started_ticks(me).expect("reading our own stat");
        let ns_per_tick = 1_000_000_000 / clock_ticks_per_second();
        assert!(Life { tag: 0, start_ns: ticks * ns_per_tick + 1 }.still_holds(me));
        assert!(!Life { tag: 0, start_ns: (ticks + 1) * ns_per_tick }.still_holds(me));
        assert!(Life { tag: 0, start_ns: 0 }.still_holds(me));
    }
}
