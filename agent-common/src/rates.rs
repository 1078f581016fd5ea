//! The sampling ratios the governor sets while the programs run.
/// What the governor sets while the programs run: one event in `ratio` is recorded, and
/// counted `ratio` times, so totals stay unbiased; and whether a process is announced at
/// its exec (0) or only at its first event (1: the budget's pause of exec captures).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rates {
    pub off_cpu_ratio: u32,
    pub net_ratio: u32,
    pub exec_announcements_paused: u32,
    /// Of the `faults` group's brk and mmap calls. (Its page-fault event's period is
    /// lengthened by as much: there the program's runs are the cost.)
    pub fault_ratio: u32,
}
