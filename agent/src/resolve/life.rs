//! A process's lives: one pid runs one program until it execs another, and a pid that was
//! freed is handed to a new process. The programs tag every sample with the life it was
//! taken in (`SampleKey::process_tag`) and announce each life, so that samples of an earlier
//! life are named from that life's mappings, not from whatever holds the pid at the drain.
use std::sync::OnceLock;

/// A life, as the kernel announced it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Life {
    pub tag: u16,
    /// When the process started (its leader's `start_boottime`, ns), or 0 if the kernel
    /// could not tell (the life was announced from another task).
    pub start_ns: u64,
    /// Where its stack started (`mm->start_stack`), or 0 if the kernel could not tell.
    pub start_stack: u64,
}

impl Life {
    /// A life whose start the kernel could not tell: it holds while the process does.
    pub fn unknown(tag: u16) -> Life {
        Life { tag, start_ns: 0, start_stack: 0 }
    }

    /// Whether process `tgid` is still in this life, as far as /proc tells: not a new process
    /// with its pid (its start time), nor the same process after an exec (where its stack
    /// starts: an exec maps a new one, at a random place unless randomization is off). What
    /// the kernel could not tell, or /proc does not show (a process whose main thread has
    /// exited shows no memory), is not checked. Called after reading its mappings: if it
    /// still holds then, they were this life's.
    pub fn still_holds(&self, tgid: u32) -> bool {
        if self.start_ns == 0 {
            return true;
        }
        let Some(stat) = super::untrusted::read_proc(std::path::Path::new(&format!("/proc/{tgid}/stat")), 4096).ok().and_then(|stat| parse_stat(&stat)) else { return false };
        // /proc shows the start in clock ticks: the kernel's ns divided down.
        let ns_per_tick = 1_000_000_000 / clock_ticks_per_second();
        let stack_holds = self.start_stack == 0 || stat.start_stack == 0 || stat.start_stack == self.start_stack;
        stat.start_ticks == self.start_ns / ns_per_tick && stack_holds
    }
}

fn clock_ticks_per_second() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    // SAFETY: sysconf has no preconditions.
    *TICKS.get_or_init(|| u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok().filter(|&t| t > 0).unwrap_or(100))
}

/// What /proc/<tgid>/stat tells of a life.
pub(crate) struct Stat {
    /// Field 22: when the process started, in clock ticks since boot.
    start_ticks: u64,
    /// Field 28: where its stack starts (0 when its memory is not shown).
    start_stack: u64,
}

/// The fields of a stat line. The command name, field 2, is in parentheses and may hold
/// spaces and parentheses itself: the fields after it are counted from the last ')'.
pub(crate) fn parse_stat(stat: &str) -> Option<Stat> {
    let mut after_name = stat[stat.rfind(')')? + 1..].split_whitespace();
    let start_ticks = after_name.nth(19)?.parse().ok()?;
    let start_stack = after_name.nth(5)?.parse().ok()?;
    Some(Stat { start_ticks, start_stack })
}

#[cfg(test)]
mod tests {
    use std::{
        io::Write as _,
        process::{Command, Stdio},
        time::{Duration, Instant},
    };

    use super::*;
    use crate::kernel::{Announcements, KernelSettings, Sampler};

    #[test]
    fn reads_the_start_and_the_stack_past_a_name_with_spaces_and_parentheses() {
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 1 0 987654 12345678 300 18446744073709551615 1 2 140730000000000 0";
        let parsed = parse_stat(stat).expect("a stat line");
        assert_eq!((parsed.start_ticks, parsed.start_stack), (987654, 140730000000000));
        assert!(parse_stat("4242 (x) S 1").is_none());
    }

    #[test]
    fn the_agents_own_start_is_its_kernel_start() {
        let me = std::process::id();
        let stat = parse_stat(&std::fs::read_to_string("/proc/self/stat").unwrap()).expect("our own stat");
        let ns_per_tick = 1_000_000_000 / clock_ticks_per_second();
        let life = |start_ns, start_stack| Life { tag: 0, start_ns, start_stack };
        assert!(life(stat.start_ticks * ns_per_tick + 1, stat.start_stack).still_holds(me));
        assert!(!life((stat.start_ticks + 1) * ns_per_tick, stat.start_stack).still_holds(me));
        assert!(!life(stat.start_ticks * ns_per_tick, stat.start_stack + 4096).still_holds(me), "another stack: another program");
        assert!(life(stat.start_ticks * ns_per_tick, 0).still_holds(me));
        assert!(Life::unknown(0).still_holds(me));
    }

    /// The announcement of `pid` that `announcements` hold or get within two seconds.
    fn announced(announcements: &mut Announcements, pid: u32, not: Option<u16>) -> Life {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let found = announcements.take().into_iter().find(|e| e.tgid == pid && e.pc == 0 && Some(e.tag) != not);
            if let Some(event) = found {
                return Life { tag: event.tag, start_ns: event.start_ns, start_stack: event.start_stack };
            }
            assert!(Instant::now() < deadline, "process {pid} was not announced");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The real programs (needs root): a shell announced at its exec, which then execs
    /// `sleep`. The life the kernel announced holds until the exec, and not after it (its
    /// start time is the same): mappings read after it would be another program's.
    #[test]
    fn a_life_does_not_hold_once_its_process_has_exec_d() {
        assert_eq!(unsafe { libc::geteuid() }, 0, "this test loads BPF programs: run it as root");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _entered = runtime.enter();
        let (_sampler, mut announcements, _unwind_maps) = Sampler::start(&KernelSettings::for_tests()).expect("starting the sampler");
        let mut shell = Command::new("sh").args(["-c", "read line; exec sleep 5"]).stdin(Stdio::piped()).spawn().unwrap();
        let pid = shell.id();
        let first = announced(&mut announcements, pid, None);
        assert!(first.start_ns != 0 && first.start_stack != 0, "announced at its exec, from its own context: {first:?}");
        assert!(first.still_holds(pid), "the shell's life, while it runs");
        shell.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let second = announced(&mut announcements, pid, Some(first.tag));
        assert_eq!(second.start_ns, first.start_ns);
        assert!(second.still_holds(pid), "sleep's life");
        assert!(!first.still_holds(pid), "the shell's life after the exec: {first:?}, now {second:?}");
        shell.kill().ok();
        shell.wait().ok();
    }
}
