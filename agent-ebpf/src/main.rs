//! Ember's kernel side: capture and aggregate only. Names, paths and symbols are userspace
//! work; everything that cannot be kept is counted by reason in the set's counter array.
//!
//! Programs, a file each: `oncpu` (perf_event), `faults` (perf_event on page faults),
//! `memory_requests` (brk and anonymous mmap calls), `allocations` (uprobes on a process's
//! allocator), `tcmalloc` (uprobes on gperftools tcmalloc's own sampled path), `offcpu` (sched_switch), `network` (one
//! program per net tracepoint, and the socket's last sender), `process_life` (fork, exec,
//! exit, code replaced in place, cgroup moves). What they share: `buffers` (the A/B sets and
//! their counters), `aggregate` (adding to a key), `perf_sample` (a perf event's sample),
//! `walk` (user stacks) with `python` (Python frames), `tails` (the frames kept below an
//! anchor) and `hash`, `announce` (telling
//! userspace of a process), `task` and `thread_cache` (what a key says of the current task),
//! `config` (filters, layouts and rates set by userspace), `run_time` (measuring themselves),
//! `opaque` (what the compiler must not see through, for the verifier).
#![no_std]
#![no_main]
// Inline assembly, for two instructions the compiler must not rewrite (`walk::search`).
#![feature(asm_experimental_arch)]

mod aggregate;
mod allocations;
mod announce;
mod buffers;
mod config;
mod faults;
mod hash;
mod memory_requests;
mod network;
mod offcpu;
mod oncpu;
mod opaque;
mod perf_sample;
mod process_life;
mod python;
mod run_time;
mod tails;
mod task;
mod tcmalloc;
mod thread_cache;
mod walk;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
