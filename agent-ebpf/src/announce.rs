//! Telling userspace about processes: when one is first seen (so that its mappings are read
//! while it runs), and when a walk meets code outside the mappings it was given.
use agent_common::{counter, ExeImage, ProcessEvent, COMM_LEN};
use aya_ebpf::{
    bindings::{BPF_EXIST, BPF_NOEXIST},
    helpers::bpf_get_current_pid_tgid,
    macros::map,
    maps::{LruHashMap, RingBuf},
};

use crate::{
    buffers::{bump, BufferSet},
    task::{current_code_start, current_comm, current_exe, current_life, current_stack_start},
};

/// Processes userspace has been told about, and when (`told`); a miss sends a `ProcessEvent`.
#[map]
pub static KNOWN_TGIDS: LruHashMap<u32, u8> = LruHashMap::with_max_entries(16384, 0);
#[map]
pub static PROCESS_EVENTS: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);

/// What userspace has been told of a process (the values of `KNOWN_TGIDS`).
pub mod told {
    /// Announced at exec, perhaps before the loader mapped its libraries.
    pub const AT_EXEC: u8 = 1;
    /// Announced at its first event: its mappings are read while it runs.
    pub const RUNNING: u8 = 2;
    /// Its last thread exited. Samples the thread still takes on its way out (the tracepoint
    /// fires before its memory is torn down) must not announce it again: userspace would find
    /// no mappings, keep the dead process's, and name the next process with its pid from them.
    /// A fork clears it for the pid it hands out.
    pub const EXITED: u8 = u8::MAX;
}

/// Tells userspace about a process at `stage` (`told`), unless it was told already. If the
/// ring buffer is full, forget the process again so that the next event retries.
#[inline(always)]
pub fn announce_process(tgid: u32, tag: u16, stage: u8, set: &BufferSet) {
    if tgid == 0 {
        return;
    }
    let flags = match unsafe { KNOWN_TGIDS.get(&tgid) } {
        Some(&known) if known >= stage => return,
        Some(_) => BPF_EXIST,
        None => BPF_NOEXIST,
    };
    let current = (bpf_get_current_pid_tgid() >> 32) as u32 == tgid;
    // Mid-exec, its new memory holds no code yet, and /proc would show a half-built image
    // under either life: the exec announces the new one once it is built.
    if current && current_code_start() == 0 {
        return;
    }
    if KNOWN_TGIDS.insert(&tgid, &stage, flags as u64).is_err() {
        return; // another CPU announced it first
    }
    // The start time can only be read from the process itself (an event may be attributed to
    // another task: a socket's last sender).
    let (current_tag, start) = current_life();
    let own = current && current_tag == tag;
    if !send(tgid, tag, stage == told::AT_EXEC, 0, own.then_some(start)) {
        let _ = KNOWN_TGIDS.remove(&tgid);
        bump(set, counter::PROCESS_EVENT_LOST);
    }
}

/// Megabytes of a process's address space (tgid << 32 | pc >> 20) where walks met code
/// outside the mappings userspace gave the walker, and the interval (set generation, low half) and
/// life (`SampleKey::process_tag`, high half) in which userspace was last told.
#[map]
static UNMAPPED_TOLD: LruHashMap<u64, u64> = LruHashMap::with_max_entries(4096, 0);

/// A walk of `tgid`'s stack, in its life `tag`, went through or ended at `pc`, outside
/// every mapping userspace gave the walker: a library loaded since they were read (dlopen),
/// JIT code, or a wrong return address (the caller checked that `pc` may be code). Tells
/// userspace, which reads the mappings again if none it knows holds `pc`: once per interval,
/// life and megabyte, so that wrong return addresses cost little, while a new library (new
/// addresses) is told at once, and so is code a new life maps where its earlier one had code
/// (an exec'd runtime's JIT at a fixed address).
#[inline(always)]
pub fn announce_unmapped(tgid: u32, tag: u16, pc: u64, set: &BufferSet) {
    let region = ((tgid as u64) << 32) | (pc >> 20);
    let told = set.generation as u64 | (tag as u64) << 32;
    if unsafe { UNMAPPED_TOLD.get(&region) } == Some(&told) {
        return;
    }
    let _ = UNMAPPED_TOLD.insert(&region, &told, 0);
    // The walk was the current task's. (Its life is the one its samples are keyed by.)
    if !send(tgid, tag, false, pc, Some(current_life().1)) {
        bump(set, counter::PROCESS_EVENT_LOST);
    }
}

/// Sends a `ProcessEvent`, written in place in the ring buffer (the programs that announce
/// have little stack to spare). `own_start`: the process's start if the current task is
/// the process, which then tells its stack, executable and name too. False if it is full.
#[inline(always)]
fn send(tgid: u32, tag: u16, at_exec: bool, pc: u64, own_start: Option<u64>) -> bool {
    let Some(mut entry) = PROCESS_EVENTS.reserve::<ProcessEvent>(0) else { return false };
    let event = entry.as_mut_ptr();
    // SAFETY: the entry is reserved for a ProcessEvent, and every field is written below.
    unsafe {
        (*event).tgid = tgid;
        (*event).tag = tag;
        (*event).at_exec = at_exec as u8;
        (*event)._pad = 0;
        (*event).pc = pc;
        match own_start {
            Some(start) => {
                (*event).start_ns = start;
                (*event).start_stack = current_stack_start();
                (*event).exe = current_exe();
                (*event).comm = current_comm();
            }
            None => {
                (*event).start_ns = 0;
                (*event).start_stack = 0;
                (*event).exe = ExeImage::default();
                (*event).comm = [0; COMM_LEN];
            }
        }
    }
    entry.submit(0);
    true
}
