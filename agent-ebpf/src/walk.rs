//! The user-stack walker, shared by every program that records a user stack. Each frame's
//! caller is found from its executable's unwind table (rows built by userspace from the
//! call frame information) or, where the code has no table, from its frame pointer. The walk
//! is stored under a hash of its frames in the set's user stack map, so that a sample stays
//! one map update.
use core::ffi::c_void;

use agent_common::{
    counter, python_stop, row_kind, stack_status, unwind_stop, ExeKey, ExeTemplate, ExecMapping, ProcessMappings, SampleKey, UnwindRow, UserStack, MAX_MAPPINGS,
    MAX_USER_FRAMES, PageRows, UNWIND_PAGE,
};
use aya_ebpf::{
    bindings::{pt_regs, BPF_F_MMAPABLE},
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user,
        generated::{bpf_get_current_task_btf, bpf_loop, bpf_probe_read_user as bpf_probe_read_user_raw, bpf_task_pt_regs},
    },
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};

use crate::{
    announce::announce_unmapped,
    buffers::{bump, BufferSet},
    hash::{mix, mix_frame},
    opaque::{opaque, sign_bit},
    python,
    tails::{self, Anchor, Owner},
    task::{current_code_start, current_exe},
};

/// Every loaded table's rows; userspace sizes it to the table memory budget and fills it
/// through a shared mapping.
#[map]
static UNWIND_ROWS: Array<UnwindRow> = Array::with_max_entries(1, BPF_F_MMAPABLE);
/// Every loaded table's page index (see `ExecMapping::first_page`).
#[map]
static UNWIND_PAGES: Array<PageRows> = Array::with_max_entries(1, BPF_F_MMAPABLE);
/// Every loaded process's executable mappings (with tables), sorted by address per process.
/// Searched through map lookups, not by indexing one large value: the verifier then need not
/// track every search path's index, which made it give up.
#[map]
static MAPPINGS: Array<ExecMapping> = Array::with_max_entries(1, BPF_F_MMAPABLE);
/// Per tgid, where its mappings are in MAPPINGS.
#[map]
static PROCESS_MAPPINGS: HashMap<u32, ProcessMappings> = HashMap::with_max_entries(16384, 0);
/// Per executable, the mappings a process that maps only it is pointed at at exec
/// (`ExeTemplate`), for those userspace has loaded.
#[map]
static EXE_TEMPLATES: HashMap<ExeKey, ExeTemplate> = HashMap::with_max_entries(4096, 0);
/// The stack being walked on this CPU (too large for the BPF stack).
#[map]
static WALK: PerCpuArray<UserStack> = PerCpuArray::with_max_entries(1, 0);
/// This CPU's walk memory besides the stack (see `Scratch`).
#[map]
static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// Where x86-64 user space ends (47-bit addresses).
const USER_SPACE_END: u64 = 0x8000_0000_0000;

/// Whether `addr` may be an address of user code: not in the first page, not beyond user
/// space (a frame pointer that is not one reads a word of data, often neither).
#[inline(always)]
pub fn in_user_space(addr: u64) -> bool {
    (0x1000..USER_SPACE_END).contains(&addr)
}

/// The most user stack copied at a time: a page, from the address wanted to its page's end.
/// Each copy has a fixed cost, so one serves as many frames as it can (on a pipe ping-pong
/// 1024 bytes cost 3% less than 512, and 256 8% more). It never crosses into the next page,
/// which may not be present: exec leaves up to 8 KiB untouched above a process's first
/// frames, and a copy that faults costs about a microsecond (4096 bytes copied from
/// wherever: 9,500 ns a switch instead of 2,600 in 2 runs of 4). BENCHMARKS.md, sessions
/// 26-27.
const WINDOW_BYTES: u64 = 4096;
const WINDOW_WORDS: usize = (WINDOW_BYTES / 8) as usize;

/// What a walk keeps in map memory rather than in `Walk`: the verifier follows the values of
/// the walk's own fields from frame to frame, and a remembered row there made it explore
/// past its limit. Values in map memory it does not follow.
#[repr(C)]
pub struct Scratch {
    /// A copy of the part of the user stack being walked: one read of user memory serves
    /// the frames it holds, instead of one read per frame. One word more than the window:
    /// a pair read at its last word stays inside the value.
    window: [u64; WINDOW_WORDS + 1],
    /// Where a row found in a table is kept for the walks that follow on this CPU, by pc.
    /// Samples of a thread repeat most of its callers, and a search costs the cold memory it
    /// touches (the page index, the rows, the mappings: 150-200 ns a frame at 999 Hz), where
    /// a kept row costs one line.
    rows: [KeptRow; KEPT_ROWS],
    /// The last mapping found (empty at first). In `Walk`, next to the kept rows, it made the
    /// verifier process 657,000 instructions for `sched_switch` instead of 242,000.
    mapping: ExecMapping,
    /// The frame-pointer rule, staged here for the walk to load (see `table_row`).
    frame_pointer: UnwindRow,
    /// `unwind_stop::FRAME_POINTERS_ONLY` if the process has no mappings loaded, else 0. Kept
    /// as a local to the walk's end, it made the verifier follow every program on from the
    /// lookup twice (427,000 instructions for `sched_switch` instead of 245,000).
    unloaded: u32,
    /// The last frame's pc that no mapping of the process holds (0: none), walked through by
    /// frame pointers: JIT code, or code mapped since userspace read the process. Told at
    /// the walk's end, so that userspace reads the mappings while the process still lives.
    outside: u64,
    /// Code whose frames are anchors (`tails`): empty where the process has none, or its
    /// tables are not loaded. (In `Walk`, with the owner, the BPF stack of `sched_switch`
    /// overflowed.)
    anchor_start: u64,
    anchor_end: u64,
    /// Whose tails the walk may use and keep.
    owner: Owner,
    /// The last anchor frame met, or the one whose tail this CPU keeps.
    anchor: Anchor,
    /// The frame being walked (`step` moves them to its caller's), the digests of the frames
    /// so far, and the user addresses the window holds (empty at first). On the BPF stack
    /// the verifier followed their values from frame to frame and found no two steps alike:
    /// it went through the step 475 times for `sample_cpu` (262,000 of its 302,000
    /// instructions).
    regs: FrameRegs,
    /// The process's mappings; empty when userspace has not loaded it yet: frame pointers
    /// only. (Loaded from here, not kept from the lookup, so that the walk is one path
    /// whether or not the process is loaded.)
    mappings: ProcessMappings,
    hash: u64,
    check: u64,
    window_start: u64,
    window_end: u64,
}

#[derive(Clone, Copy)]
struct FrameRegs {
    pc: u64,
    sp: u64,
    bp: u64,
}

/// A row found for `pc` in the tables of a process's mappings (`generation`): it holds for
/// that pc as long as those mappings do.
#[repr(C)]
#[derive(Clone, Copy)]
struct KeptRow {
    /// The pc with `KEPT` set: an empty entry (0) matches no pc.
    pc: u64,
    generation: u32,
    cfa_offset: u16,
    kind: u8,
    rbp_offset: i8,
}

/// Set in `KeptRow::pc` (user pcs are below 2^47).
const KEPT: u64 = 1 << 63;
/// Kept rows per CPU (16 bytes each): a process's hot code has a few hundred frames' pcs.
const KEPT_ROWS: usize = 512;

impl KeptRow {
    #[inline(always)]
    fn slot(pc: u64) -> usize {
        (pc.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 55) as usize & (KEPT_ROWS - 1)
    }

    #[inline(always)]
    fn holds(&self, pc: u64, generation: u32) -> bool {
        self.pc == pc | KEPT && self.generation == generation
    }

    #[inline(always)]
    fn row(&self) -> UnwindRow {
        UnwindRow { pc: 0, cfa_offset: self.cfa_offset, kind: self.kind, rbp_offset: self.rbp_offset }
    }
}

/// Steps of the binary searches: enough for a process's mappings, and for the most rows a
/// page can have (one per byte of code, and the one that covers its first byte). The
/// verifier follows every step, so more than needed only costs it.
const MAPPING_STEPS: u32 = 11;
const ROW_STEPS: u32 = 10;
const _: () = assert!(1 << MAPPING_STEPS >= MAX_MAPPINGS && 1 << ROW_STEPS > UNWIND_PAGE);

/// What `step` is handed: the walk's state between frames is in `scratch`.
struct Walk {
    stack: *mut UserStack,
    scratch: *mut Scratch,
}

/// A user stack walked into this CPU's walk buffer, to be stored (`store`) before the next
/// walk on this CPU.
#[derive(Clone, Copy)]
pub struct Walked {
    id: u32,
    check: u64,
    /// Frames kept below an anchor that the stack has but the buffer does not hold yet:
    /// `store` copies them in if the stack is new.
    pending: u32,
}

impl Walked {
    /// Names the stack in the key as `store` would, without storing it: for a key that may
    /// exist already, whose stack then is stored already.
    #[inline(always)]
    pub fn name_in(self, key: &mut SampleKey) {
        key.user_stack_id = self.id as i32;
        key.user_stack_check = self.check;
    }

    /// Whether the key names this stack (as `name_in` would).
    #[inline(always)]
    pub fn is_named_in(self, key: &SampleKey) -> bool {
        key.user_stack_id == self.id as i32 && key.user_stack_check == self.check
    }
}

/// Walks and stores the user stack of the current task, and names it in the key.
#[inline(always)]
pub fn capture(set: &BufferSet, tgid: u32, key: &mut SampleKey) {
    match walk(set, tgid, key.process_tag, None) {
        Ok(walked) => store(set, walked, key),
        Err(status) => key.user_stack_id = status,
    }
}

/// Walks the user stack of the current task (of process `tgid`, in its life `tag`) into this
/// CPU's walk buffer, or returns a negative `stack_status` (counted). `regs`: the task's user
/// registers if the caller has them at hand (a sample taken in user mode), else they are
/// read from the task.
#[inline(always)]
pub fn walk(set: &BufferSet, tgid: u32, tag: u16, regs: Option<&pt_regs>) -> Result<Walked, i32> {
    // Mid-exec, the registers are still the old program's and the memory the new one's: there
    // is no stack to walk, and no address of either program to name.
    if current_code_start() == 0 {
        return Err(stack_status::NONE);
    }
    let (pc, sp, bp) = match regs {
        Some(regs) => (regs.rip, regs.rsp, regs.rbp),
        None => task_user_regs().ok_or(stack_status::NONE)?,
    };
    let (Some(stack), Some(scratch)) = (WALK.get_ptr_mut(0), SCRATCH.get_ptr_mut(0)) else { return Err(stack_status::ERROR) };
    let (mappings, unloaded) = match unsafe { PROCESS_MAPPINGS.get(&tgid) } {
        Some(mappings) => (*mappings, 0),
        None => {
            bump(set, counter::UNWIND_NO_PROCESS);
            (ProcessMappings::default(), unwind_stop::FRAME_POINTERS_ONLY)
        }
    };
    unsafe {
        (*stack).len = 0;
        (*stack).stop = unwind_stop::DEPTH;
        (*scratch).mapping = ExecMapping::default();
        (*scratch).unloaded = unloaded;
        (*scratch).outside = 0;
        (*scratch).regs = FrameRegs { pc, sp, bp };
        (*scratch).mappings = mappings;
        ((*scratch).window_start, (*scratch).window_end) = (0, 0);
        (*scratch).anchor = Anchor::default();
        // Runs of the evaluation loop anchor the tails: below the outermost one, the
        // interpreter's start-up does not change while it runs.
        ((*scratch).anchor_start, (*scratch).anchor_end) = (0, 0);
        (*scratch).owner = Owner { pid_tgid: bpf_get_current_pid_tgid(), tag: tag as u32, generation: mappings.generation };
    }
    let (mut hash, mut check) = (0xcbf2_9ce4_8422_2325, 0x9e37_79b9_7f4a_7c15);
    // Python frames first, from the end of the frames: the native walk then stops short of
    // them. (Each is one word where a deep native stack would have had a frame.)
    let python = python::walk(tgid, stack, &mut hash, &mut check);
    let python_frames = python.as_ref().map_or(0, |p| p.frames);
    unsafe {
        (*stack).python = python_frames;
        (*stack).python_stop = python.as_ref().map_or(0, |p| p.stop);
    }
    if let Some(python) = &python {
        bump(set, counter::PYTHON_STOPS + python.stop.min(python_stop::COUNT - 1));
    }
    if let Some(python) = &python {
        if mappings.count > 0 {
            let slid = |pc: u64| pc.wrapping_sub(mappings.slide);
            unsafe { ((*scratch).anchor_start, (*scratch).anchor_end) = (slid(python.eval_start), slid(python.eval_end)) };
        }
    }
    unsafe { ((*scratch).hash, (*scratch).check) = (hash, check) };
    let mut walk = Walk { stack, scratch };
    let walked = unsafe { bpf_loop(native_frames(&*stack), step as *mut c_void, &mut walk as *mut Walk as *mut c_void, 0) };
    if walked < 0 {
        bump(set, counter::USER_STACK_ERROR);
        return Err(stack_status::ERROR);
    }
    let stack = unsafe { &mut *stack };
    let state = unsafe { &mut *scratch };
    // Frames the walk went through outside every mapping were noted where the search for
    // their mapping failed; where it ended is checked here (one more branch in the loop was
    // too many paths for the verifier). The last frame's row may have been a kept one, found
    // in a mapping other than the last one searched.
    let mappings = state.mappings;
    if mappings.count > 0 {
        let pc = state.regs.pc.wrapping_sub(mappings.slide);
        let looked_up = looked_up(pc, (stack.len as u64).saturating_sub(1));
        let kept = &state.rows[KeptRow::slot(looked_up)];
        if !state.mapping.covers(pc) && !kept.holds(looked_up, mappings.generation) {
            state.outside = pc;
        }
        // Loaded from the map either way: one path on from here for the verifier.
        let outside = unsafe { core::ptr::read_volatile(&(*scratch).outside) };
        // Not code: a wrong return address.
        let unslid = outside.wrapping_add(mappings.slide);
        if outside != 0 && in_user_space(unslid) {
            announce_unmapped(tgid, tag, unslid, set);
        }
    }
    let (anchor, owner) = unsafe { (core::ptr::read_volatile(&(*scratch).anchor), (*scratch).owner) };
    let mut pending = 0;
    if anchor.kept == 1 {
        let limit = native_frames(stack);
        match tails::to_append(owner, stack, limit) {
            // The frames' digests stand for them: they are copied only into a new stack.
            (frames, Some((digest, digest_check))) => {
                (state.hash, state.check) = tails::hashes_below(anchor, digest, digest_check);
                (pending, stack.stop) = (frames, unwind_stop::END);
            }
            // More than the stack has room for (a deep native stack above): copied and mixed
            // one by one, as far as they fit.
            (frames, None) => {
                unsafe { bpf_loop(frames, append_step as *mut c_void, &mut walk as *mut Walk as *mut c_void, 0) };
                stack.stop = unwind_stop::DEPTH;
            }
        }
        bump(set, counter::UNWIND_TAILS_KEPT);
    } else if anchor.len > 0 && stack.stop == unwind_stop::END {
        let frames = tails::to_keep(owner, anchor, stack);
        if frames > 0 && unsafe { bpf_loop(frames, keep_step as *mut c_void, &mut walk as *mut Walk as *mut c_void, 0) } == frames as i64 {
            if let Some((digest, digest_check)) = tails::mark_kept(owner, anchor, frames) {
                (state.hash, state.check) = tails::hashes_below(anchor, digest, digest_check);
            }
        }
    }
    bump(set, counter::UNWIND_STOPS + stack.stop.min(unwind_stop::COUNT - 1));
    stack.stop |= unsafe { core::ptr::read_volatile(&(*scratch).unloaded) };
    let hash = mix(state.hash, ((stack.stop as u64) << 32) | (stack.len + pending) as u64);
    stack.check = mix(state.check, hash);
    Ok(Walked { id: ((hash ^ (hash >> 32)) & 0x7fff_ffff) as u32, check: stack.check, pending })
}

/// How many native frames the stack has room for after its Python frames. Loaded from the
/// map: the same unknown count on every path that reaches the walk, so that the verifier
/// checks the step for one of them, not for each (with Python frames or without).
#[inline(always)]
fn native_frames(stack: &UserStack) -> u32 {
    (MAX_USER_FRAMES as u32).saturating_sub(unsafe { core::ptr::read_volatile(&stack.python) })
}

/// Whether the walks know code of `tgid` in the range `range()` gives (start, end): read only
/// for a process whose mappings are loaded.
#[inline(always)]
pub fn maps_code_in(tgid: u32, range: impl FnOnce() -> (u64, u64)) -> bool {
    let Some(mappings) = (unsafe { PROCESS_MAPPINGS.get(&tgid) }) else { return false };
    let (start, end) = range();
    if end <= start {
        return false;
    }
    let (start, end) = (start.wrapping_sub(mappings.slide), end.wrapping_sub(mappings.slide));
    // The mappings are sorted and apart: of those that start before `end`, only the last can
    // reach past `start`.
    let Some(last) = search(mappings.count, MAPPING_STEPS, |i| Some(MAPPINGS.get(mappings.first + i)?.start), end - 1) else {
        return false;
    };
    MAPPINGS.get(mappings.first + last).is_some_and(|m| m.start < end && start < m.end)
}

/// Points the current process (`tgid`, just exec'd) at its executable's template, slid to
/// where its code is, if userspace left one; whether it did.
#[inline(always)]
pub fn load_from_template(tgid: u32) -> bool {
    let exe = current_exe();
    let Some(template) = EXE_TEMPLATES.get_ptr(&exe.key()) else { return false };
    let template = unsafe { &*template };
    let slide = exe.code_start.wrapping_sub(template.code_start);
    let mappings = ProcessMappings { slide, ..template.mappings };
    if PROCESS_MAPPINGS.insert(&tgid, &mappings, 0).is_err() {
        return false;
    }
    // A process left without its interpreter is userspace's to load.
    if template.has_python != 0 && !python::load_from_template(tgid, &template.python, slide) {
        forget_process(tgid);
        return false;
    }
    true
}

/// The process exited or exec'd, or code of it was replaced: its mappings no longer hold.
#[inline(always)]
pub fn forget_process(tgid: u32) {
    let _ = PROCESS_MAPPINGS.remove(&tgid);
}

/// Stores the stack `walked` (this CPU's walk buffer) under its id, unless the same stack is
/// there already, and names it in the key; a stack that cannot be stored is named by its
/// status (counted).
#[inline(always)]
pub fn store(set: &BufferSet, walked: Walked, key: &mut SampleKey) {
    let (Some(stack), Some(scratch)) = (WALK.get_ptr_mut(0), SCRATCH.get_ptr_mut(0)) else { return key.user_stack_id = stack_status::ERROR };
    let id = walked.id;
    let len = unsafe { (*stack).len } + walked.pending;
    let same = |existing: *const UserStack| unsafe { (*existing).check == (*stack).check && (*existing).len == len };
    let existing = set.user_stack(id);
    if existing.is_none() {
        // New: its kept frames are copied in now (the hashes they go into are final already).
        let mut walk = Walk { stack, scratch };
        unsafe { bpf_loop(walked.pending, append_step as *mut c_void, &mut walk as *mut Walk as *mut c_void, 0) };
    }
    let stack = unsafe { &*stack };
    let status = if let Some(existing) = existing {
        if same(existing) {
            return walked.name_in(key);
        }
        stack_status::COLLISION
    } else if set.insert_user_stack(id, stack).is_ok() {
        return walked.name_in(key);
    } else if let Some(existing) = set.user_stack(id) {
        // Another CPU stored a stack under this id first: the same one, or a collision.
        if same(existing) {
            return walked.name_in(key);
        }
        stack_status::COLLISION
    } else {
        stack_status::ERROR // the map is full
    };
    bump(set, if status == stack_status::COLLISION { counter::USER_STACK_COLLISION } else { counter::USER_STACK_ERROR });
    key.user_stack_id = status;
    key.user_stack_check = 0;
}

/// Where the current task was when it last left user mode (pc, sp, bp), or None for a
/// kernel thread. The verifier knows the pointer's type: its fields are loaded directly,
/// with no helper call copying all the registers.
#[inline(always)]
fn task_user_regs() -> Option<(u64, u64, u64)> {
    let regs = unsafe { &*(bpf_task_pt_regs(bpf_get_current_task_btf()) as *const pt_regs) };
    in_user_mode(regs).then(|| (regs.rip, regs.rsp, regs.rbp))
}

/// Whether registers are user mode's: the code segment's privilege level is 3.
#[inline(always)]
pub fn in_user_mode(regs: &pt_regs) -> bool {
    regs.cs & 3 == 3
}

/// One frame: records the pc, then finds the caller's pc, sp and bp. Returns 1 to end the
/// walk (with the reason in the stack), 0 to go on.
extern "C" fn step(index: u64, context: *mut c_void) -> i64 {
    let walk = unsafe { &mut *(context as *mut Walk) };
    let stack = unsafe { &mut *walk.stack };
    let state = unsafe { &mut *walk.scratch };
    let Some(slot) = stack.frames.get_mut(stack.len as usize) else { return 1 };
    let frame = state.regs;
    *slot = frame.pc;
    stack.len += 1;
    mix_frame(&mut state.hash, &mut state.check, frame.pc);
    // Mappings, rows kept and anchors are in the mappings' addresses.
    let pc = looked_up(frame.pc, index).wrapping_sub(state.mappings.slide);
    match caller(walk, frame, pc) {
        Ok(regs) => {
            let scratch = unsafe { &mut *walk.scratch };
            scratch.regs = regs;
            // An anchor frame: one compare of the range, one branch for the verifier to follow.
            if pc.wrapping_sub(scratch.anchor_start) < scratch.anchor_end.wrapping_sub(scratch.anchor_start) {
                return tails::met(scratch.owner, &mut scratch.anchor, Anchor { cfa: regs.sp, ra: regs.pc, len: stack.len, kept: 0, hash: scratch.hash, check: scratch.check });
            }
            0
        }
        Err(stop) => {
            stack.stop = stop;
            1
        }
    }
}

/// One frame kept below an anchor, appended (`tails::append`).
extern "C" fn append_step(index: u64, context: *mut c_void) -> i64 {
    let walk = unsafe { &mut *(context as *mut Walk) };
    let state = unsafe { &mut *walk.scratch };
    tails::append(state.owner, index as u32, unsafe { &mut *walk.stack }, &mut state.hash, &mut state.check)
}

/// One frame below an anchor, kept (`tails::keep`).
extern "C" fn keep_step(index: u64, context: *mut c_void) -> i64 {
    let walk = unsafe { &mut *(context as *mut Walk) };
    let (owner, anchor) = unsafe { ((*walk.scratch).owner, (*walk.scratch).anchor) };
    tails::keep(owner, anchor, index as u32, unsafe { &mut *walk.stack })
}

/// The address whose row holds for frame `index` at `pc`. A return address (every frame but
/// the leaf) points after its call, which may be the last instruction of the function: its
/// rule is the one of the address before.
#[inline(always)]
fn looked_up(pc: u64, index: u64) -> u64 {
    if index == 0 { pc } else { pc.wrapping_sub(1) }
}

/// The caller's registers of `frame`, whose row holds at `pc`, or why there is none.
#[inline(always)]
fn caller(walk: &mut Walk, frame: FrameRegs, pc: u64) -> Result<FrameRegs, u32> {
    let (cfa, saved_bp) = caller_frame(walk, frame, pc)?;
    // The caller's frame lies above the callee's: anything else is not a stack.
    if cfa <= frame.sp {
        return Err(unwind_stop::BAD_FRAME);
    }
    let (ra, bp) = match saved_bp {
        // The usual frame (push rbp right after the call): one read for both.
        Some(at) if at == cfa - 16 => {
            let [bp, ra] = read_pair(walk, cfa - 16)?;
            (ra, bp)
        }
        Some(at) => (read_pair(walk, cfa - 8)?[0], read_pair(walk, at)?[0]),
        None => (read_pair(walk, cfa - 8)?[0], frame.bp),
    };
    if ra == 0 {
        return Err(unwind_stop::END); // a thread's first frame has no return address
    }
    // No code's address: not a frame to show.
    if !in_user_space(ra) {
        return Err(unwind_stop::BAD_FRAME);
    }
    Ok(FrameRegs { pc: ra, sp: cfa, bp })
}

/// The two words of user memory at `at`, from the window, which is moved to `at` first if it
/// does not hold them. Where a window cannot be read (a page not present), where the pair
/// crosses a page, or where `at` is not word aligned, the words are read on their own.
#[inline(always)]
fn read_pair(walk: &mut Walk, at: u64) -> Result<[u64; 2], u32> {
    let state = unsafe { &mut *walk.scratch };
    let held = |state: &Scratch| at & 7 == 0 && state.window_start <= at && at + 16 <= state.window_end;
    if at & 7 == 0 && !held(state) {
        let len = WINDOW_BYTES - (at & (WINDOW_BYTES - 1));
        let copied = unsafe { bpf_probe_read_user_raw(state.window.as_mut_ptr() as *mut c_void, len as u32, at as *const c_void) };
        (state.window_start, state.window_end) = if copied == 0 { (at, at + len) } else { (0, 0) };
    }
    if held(state) {
        let index = ((at - state.window_start) / 8) as usize & (WINDOW_WORDS - 1);
        let words = &state.window;
        return Ok([*words.get(index).ok_or(unwind_stop::READ_FAULT)?, *words.get(index + 1).ok_or(unwind_stop::READ_FAULT)?]);
    }
    unsafe { bpf_probe_read_user(at as *const [u64; 2]) }.map_err(|_| unwind_stop::READ_FAULT)
}

/// The caller's CFA, and where the caller's rbp is saved (None: rbp is unchanged), from the
/// row that covers `pc`.
#[inline(always)]
fn caller_frame(walk: &mut Walk, frame: FrameRegs, pc: u64) -> Result<(u64, Option<u64>), u32> {
    let kept = unsafe { &mut (*walk.scratch).rows[KeptRow::slot(pc)] };
    let generation = unsafe { (*walk.scratch).mappings.generation };
    let row = if kept.holds(pc, generation) {
        kept.row()
    } else {
        table_row(walk, frame.bp, pc, kept)?
    };
    let cfa = match row.kind {
        row_kind::CFA_RSP => frame.sp + row.cfa_offset as u64,
        row_kind::CFA_RBP => frame.bp + row.cfa_offset as u64,
        // Only ever a leaf (a stub calls nothing), so `pc` is the exact instruction.
        row_kind::PLT => frame.sp + if pc & 15 >= row.cfa_offset as u64 { 16 } else { 8 },
        row_kind::OUTERMOST => return Err(unwind_stop::END),
        row_kind::SIGNAL => return Err(unwind_stop::SIGNAL),
        row_kind::NO_INFO => return Err(unwind_stop::NO_INFO),
        _ => return Err(unwind_stop::UNSUPPORTED),
    };
    let saved_bp = (row.rbp_offset != 0).then(|| cfa.wrapping_add((row.rbp_offset as i64 * 8) as u64));
    Ok((cfa, saved_bp))
}

/// The frame-pointer rule as a row: CFA = rbp + 16, the caller's rbp saved at rbp.
const FRAME_POINTER: UnwindRow = UnwindRow { pc: 0, cfa_offset: 16, kind: row_kind::CFA_RBP, rbp_offset: -2 };

/// The row that covers `pc`, from its mapping's table (kept in `kept` for later walks), or
/// the frame-pointer rule where the code has no table.
#[inline(always)]
fn table_row(walk: &mut Walk, bp: u64, pc: u64, kept: &mut KeptRow) -> Result<UnwindRow, u32> {
    // Neighbouring frames are often in one file: try the last frame's mapping first.
    let last = unsafe { &mut (*walk.scratch).mapping };
    if !last.covers(pc) {
        match find_mapping(unsafe { &(*walk.scratch).mappings }, pc) {
            Some(mapping) => *last = mapping,
            None => unsafe { (*walk.scratch).outside = pc },
        }
    }
    let mapping = *last;
    if !mapping.covers(pc) || mapping.rows == 0 {
        return frame_pointer_row(walk, bp);
    }
    let relative = pc.wrapping_sub(mapping.bias);
    if relative > u32::MAX as u64 {
        return Err(unwind_stop::NO_INFO);
    }
    let row = find_row(&mapping, relative as u32).ok_or(unwind_stop::NO_INFO)?;
    *kept = KeptRow { pc: pc | KEPT, generation: unsafe { (*walk.scratch).mappings.generation }, cfa_offset: row.cfa_offset, kind: row.kind, rbp_offset: row.rbp_offset };
    Ok(row)
}

/// The frame-pointer rule, for code without a table (JIT code, a binary left out of the
/// budget, a process not loaded yet): a zero rbp marks the outermost frame.
#[inline(always)]
fn frame_pointer_row(walk: &mut Walk, bp: u64) -> Result<UnwindRow, u32> {
    if bp == 0 {
        return Err(unwind_stop::END);
    }
    // Through map memory, not kept (a recursion's last frame must still see its zero rbp). A
    // constant row would be followed by the verifier as a path of its own (600,000
    // instructions to verify instead of 400,000); one loaded from a map joins the others.
    Ok(unsafe {
        (*walk.scratch).frame_pointer = FRAME_POINTER;
        core::ptr::read_volatile(&(*walk.scratch).frame_pointer)
    })
}

/// The process's mapping that contains `pc`.
#[inline(always)]
fn find_mapping(mappings: &ProcessMappings, pc: u64) -> Option<ExecMapping> {
    let last = search(mappings.count, MAPPING_STEPS, |i| {
        Some(MAPPINGS.get(mappings.first + i)?.start)
    }, pc)?;
    let mapping = *MAPPINGS.get(mappings.first + last)?;
    mapping.covers(pc).then_some(mapping)
}

/// The last of a table's rows that starts at or before `pc`, searched for among the rows of
/// its page.
#[inline(always)]
fn find_row(mapping: &ExecMapping, pc: u32) -> Option<UnwindRow> {
    let page = (pc as u64 / UNWIND_PAGE) as u32;
    if page >= mapping.pages {
        return None; // beyond the table's last row, which is a no-info end
    }
    let rows = *UNWIND_PAGES.get(mapping.first_page + page)?;
    let first = mapping.first_row + rows.first;
    let last = search(rows.end.saturating_sub(rows.first), ROW_STEPS, |i| Some(UNWIND_ROWS.get(first + i)?.pc as u64), pc as u64)?;
    let row = *UNWIND_ROWS.get(first + last)?;
    (row.pc <= pc).then_some(row)
}

/// Binary search of `len` sorted keys (`key(i)`, below 2^63) for the last one at or before
/// `target`; its index (if any key is at or before it, which the caller checks). The step
/// is computed, not branched on: the verifier then follows one path per step, not two per
/// step (2^steps in all, which it refuses).
#[inline(always)]
fn search(len: u32, steps: u32, key: impl Fn(u32) -> Option<u64>, target: u64) -> Option<u32> {
    // 64-bit locals: 32-bit ones cost two shifts each time they are widened.
    let (mut base, mut left) = (0u64, len as u64);
    for _ in 0..opaque(steps as u64) {
        if left <= 1 {
            break;
        }
        let half = left / 2;
        // 1 when the key is after the target, else 0 (keys and target are below 2^63).
        let after = sign_bit(target, key((base + half) as u32)?);
        base += half & after.wrapping_sub(1);
        left -= half;
    }
    (len > 0).then_some(base as u32)
}
