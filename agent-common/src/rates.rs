//! The sampling ratios the governor sets while the programs run.
/// Sampling ratios the governor sets while the programs run: one event in `ratio` is
/// recorded, and counted `ratio` times, so totals stay unbiased.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rates {
    pub off_cpu_ratio: u32,
    pub net_ratio: u32,
}
