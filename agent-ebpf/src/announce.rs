//! Telling userspace about processes: when one is first seen (so that its mappings are read
//! while it runs), and when a walk meets code outside the mappings it was given.
use agent_common::{counter, unmapped_region, ExeImage, ProcessEvent, COMM_LEN};
use aya_ebpf::{
    bindings::{BPF_EXIST, BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
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
pub static PROCESS_EVENTS: RingBuf = RingBuf::with_byte_size(PROCESS_EVENT_BYTES, 0);
const PROCESS_EVENT_BYTES: u32 = 64 * 1024;

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

/// Tells userspace about a process at `stage` (`told`), unless it was told already; whether
/// it was told now. If the ring buffer is full, forget the process again so that the next
/// event retries. `from_template`: the walker has the process's mappings from its
/// executable's template, so userspace need not be woken for it (`ProcessEvent`).
#[inline(always)]
pub fn announce_process(tgid: u32, tag: u16, stage: u8, from_template: bool, set: &BufferSet) -> bool {
    if tgid == 0 {
        return false;
    }
    let flags = match unsafe { KNOWN_TGIDS.get(&tgid) } {
        Some(&known) if known >= stage => return false,
        Some(_) => BPF_EXIST,
        None => BPF_NOEXIST,
    };
    let current = (bpf_get_current_pid_tgid() >> 32) as u32 == tgid;
    // Mid-exec, its new memory holds no code yet, and /proc would show a half-built image
    // under either life: the exec announces the new one once it is built.
    if current && current_code_start() == 0 {
        return false;
    }
    if KNOWN_TGIDS.insert(&tgid, &stage, flags as u64).is_err() {
        return false; // another CPU announced it first
    }
    // The start time can only be read from the process itself (an event may be attributed to
    // another task: a socket's last sender).
    let (current_tag, start) = current_life();
    let own = current && current_tag == tag;
    let event = Event { tgid, tag, at_exec: stage == told::AT_EXEC, from_template, pc: 0 };
    if !send(event, own.then_some(start)) {
        let _ = KNOWN_TGIDS.remove(&tgid);
        bump(set, counter::PROCESS_EVENT_LOST);
        return false;
    }
    true
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
    let region = unmapped_region(tgid, pc);
    let told = set.generation as u64 | (tag as u64) << 32;
    if unsafe { UNMAPPED_TOLD.get(&region) } == Some(&told) {
        return;
    }
    let _ = UNMAPPED_TOLD.insert(&region, &told, 0);
    // The walk was the current task's. (Its life is the one its samples are keyed by.)
    if !send(Event { tgid, tag, at_exec: false, from_template: false, pc }, Some(current_life().1)) {
        bump(set, counter::PROCESS_EVENT_LOST);
    }
}

/// What a `ProcessEvent` says besides what the process itself tells.
struct Event {
    tgid: u32,
    tag: u16,
    at_exec: bool,
    from_template: bool,
    pc: u64,
}

/// Waiting events that make userspace take them even if none asks to wake it: a quarter of
/// the ring, so that a burst of processes started fills it no further while userspace runs.
const WAKE_AT_BYTES: u64 = PROCESS_EVENT_BYTES as u64 / 4;

/// Sends a `ProcessEvent`, written in place in the ring buffer (the programs that announce
/// have little stack to spare). `own_start`: the process's start if the current task is
/// the process, which then tells its stack, executable and name too. False if it is full.
/// Userspace is woken at once unless the walker needs nothing from it for this event: that
/// one waits for the next that does, for the drain, or for the ring to fill.
#[inline(always)]
fn send(what: Event, own_start: Option<u64>) -> bool {
    let Some(mut entry) = PROCESS_EVENTS.reserve::<ProcessEvent>(0) else { return false };
    let event = entry.as_mut_ptr();
    // SAFETY: the entry is reserved for a ProcessEvent, and every field is written below.
    unsafe {
        (*event).tgid = what.tgid;
        (*event).tag = what.tag;
        (*event).at_exec = what.at_exec as u8;
        (*event).from_template = what.from_template as u8;
        (*event).pc = what.pc;
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
    // Waking always when asked to: an adaptive wake-up (flags 0) is skipped while events
    // that did not wake userspace wait unread.
    let wake = !what.from_template || PROCESS_EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= WAKE_AT_BYTES;
    entry.submit(if wake { BPF_RB_FORCE_WAKEUP } else { BPF_RB_NO_WAKEUP } as u64);
    true
}
