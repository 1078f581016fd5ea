//! What userspace sets: the filters and layouts fixed at load time (globals the loader
//! rewrites before the programs are verified) and the sampling ratios the governor changes
//! while they run.
use agent_common::Rates;
use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_prandom_u32},
    macros::map,
    maps::{Array, HashMap},
    programs::TracePointContext,
};

/// Off-CPU, network and faults sampling ratios, set by userspace (the overhead governor) at any time.
#[map]
pub static RATES: Array<Rates> = Array::with_max_entries(1, 0);
/// Tgids to sample when FILTER_TGIDS is set.
#[map]
pub static TGID_FILTER: HashMap<u32, u8> = HashMap::with_max_entries(1024, 0);

#[no_mangle]
pub static FILTER_TGIDS: u8 = 0;
#[no_mangle]
pub static FILTER_CGROUP: u64 = 0;

pub fn config<T: Copy>(global: &T) -> T {
    // Volatile: the value is patched into the object after compilation.
    unsafe { core::ptr::read_volatile(global) }
}

/// Whether to record this event under a 1-in-`ratio` sampling: the recorded ones count
/// `ratio` times. Ratio 0 (never set) counts as 1.
#[inline(always)]
pub fn sampled_out(ratio: u32) -> bool {
    ratio > 1 && unsafe { bpf_get_prandom_u32() } % ratio != 0
}

#[inline(always)]
pub fn rates() -> Rates {
    RATES.get(0).copied().unwrap_or(Rates { off_cpu_ratio: 1, net_ratio: 1, exec_announcements_paused: 0, fault_ratio: 1 })
}

#[inline(always)]
pub fn passes_filters(tgid: u32) -> bool {
    if config(&FILTER_TGIDS) != 0 && unsafe { TGID_FILTER.get(&tgid) }.is_none() {
        return false;
    }
    let cgroup = config(&FILTER_CGROUP);
    cgroup == 0 || cgroup == unsafe { bpf_get_current_cgroup_id() }
}

/// Reads a field of the tracepoint record at an offset fixed at load time.
#[inline(always)]
pub fn field<T: Copy + Default>(ctx: &TracePointContext, offset: u32) -> T {
    unsafe { ctx.read_at::<T>(offset as usize) }.unwrap_or_default()
}
