//! The Python walk: the frames of the CPython interpreter the sampled thread runs, read from
//! its memory (its thread state, then frame by frame to the first), each recorded as its
//! code object and position. Userspace names them, and puts each run of the evaluation loop
//! where its native `_PyEval_EvalFrameDefault` frame is.
use core::ffi::c_void;

use agent_common::{
    entry_kind, position_kind, python_frame, python_stop, PythonLayout, PythonProcess, UserStack, MAX_PYTHON_FRAMES, MAX_PYTHON_THREADS,
    MAX_USER_FRAMES,
};
use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user,
        generated::{bpf_loop, bpf_probe_read_user as bpf_probe_read_user_raw},
    },
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray},
};

use crate::{hash::mix_frame, opaque::opaque, task::current_thread_pointer};

/// Per tgid, its interpreter (written by userspace when it finds CPython in the process).
#[map]
static PYTHON_PROCESSES: HashMap<u32, PythonProcess> = HashMap::with_max_entries(4096, 0);
/// Per thread (pid), its thread state as last found: checked before use (the state may be
/// freed and its memory another thread's), searched for again if it no longer holds.
#[map]
static PYTHON_THREADS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(16384, 0);
/// This CPU's Python walk (kept off the BPF stack, which the native walk's callers fill).
#[map]
static PYTHON_WALK: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);

/// Bytes of a frame read at once: every field the walk reads lies in them, in every version
/// (the farthest: 3.6's `f_lasti`, at 120).
const FRAME_BYTES: usize = 128;
/// Bytes read at once where a thread's frames lie one after another, callers below (3.11+):
/// one read then serves the frame and the callers below it in its page. A read's cost is
/// nearly all fixed: 1024 bytes a frame cost the walk about what 128 did.
const WINDOW_BYTES: usize = 1024;
/// Never read across: the page below a frame's may not be mapped.
const PAGE: u64 = 4096;

/// A Python walk's result: frames recorded, why it ended, and where the process's
/// evaluation loop is.
pub struct PythonWalked {
    pub frames: u32,
    pub stop: u32,
    pub eval_start: u64,
    pub eval_end: u64,
}

/// Walks the Python frames of the current thread (of process `tgid`) into the end of
/// `stack.frames`, mixing each into the walk's `hash` and `check`, or returns None if the
/// process runs no interpreter userspace told of.
#[inline(always)]
pub fn walk(tgid: u32, stack: *mut UserStack, hash: &mut u64, check: &mut u64) -> Option<PythonWalked> {
    let process = PYTHON_PROCESSES.get_ptr(&tgid)?;
    let pid = bpf_get_current_pid_tgid() as u32;
    let state = PYTHON_WALK.get_ptr_mut(0)?;
    let walk = unsafe { &mut *state };
    copy_words(unsafe { &(*process).layout }, &mut walk.layout);
    (walk.count, walk.stop, walk.hash, walk.check) = (0, python_stop::DEPTH, *hash, *check);
    (walk.window_start, walk.window_end) = (0, 0);
    let (eval_start, eval_end) = unsafe { ((*process).eval_start, (*process).eval_end) };
    let walked = |frames, stop| Some(PythonWalked { frames, stop, eval_start, eval_end });
    let frame = match thread_frame(pid, unsafe { (*process).interp_head }, state) {
        Ok(frame) => frame,
        Err(stop) => return walked(0, stop),
    };
    let first = match walk.layout.cframe_frame {
        PythonLayout::ABSENT => Some(frame),
        cframe_frame if frame != 0 => read(frame + cframe_frame as u64),
        _ => Some(0),
    };
    let Some(frame) = first else { return walked(0, python_stop::READ_FAULT) };
    walk.frame = frame;
    let mut context = Context { walk: state, stack };
    unsafe { bpf_loop(MAX_PYTHON_FRAMES, step as *mut c_void, &mut context as *mut Context as *mut c_void, 0) };
    let walk = unsafe { &mut *state };
    walk.mix_last(stack);
    (*hash, *check) = (walk.hash, walk.check);
    walked(walk.count, walk.stop)
}

/// What the steps of a walk or a search are handed (on the BPF stack, as `bpf_loop`
/// requires; pointers cannot be kept in map memory).
struct Context {
    walk: *mut Walk,
    stack: *mut UserStack,
}

/// Tells the walk of the interpreter of a process just pointed at its executable's template
/// (`walk::load_from_template`): the template's, slid to where the process's code went.
/// False if there is no room.
#[inline(always)]
pub fn load_from_template(tgid: u32, template: &PythonProcess, slide: u64) -> bool {
    let mut process = PythonProcess::default();
    copy_words(template, &mut process);
    process.interp_head = process.interp_head.wrapping_add(slide);
    process.eval_start = process.eval_start.wrapping_add(slide);
    process.eval_end = process.eval_end.wrapping_add(slide);
    PYTHON_PROCESSES.insert(&tgid, &process, 0).is_ok()
}

/// Copies `from` to `to` word by word: a plain copy is a call to a byte loop the verifier
/// cannot bound. (`T`'s size is a multiple of 8.)
#[inline(always)]
fn copy_words<T>(from: &T, to: &mut T) {
    let (from, to) = (from as *const T as *const u64, to as *mut T as *mut u64);
    for word in 0..size_of::<T>() / 8 {
        unsafe { *to.add(word) = core::ptr::read_volatile(from.add(word)) };
    }
}

/// The process exited or exec'd: its interpreter is gone.
#[inline(always)]
pub fn forget_process(tgid: u32) {
    let _ = PYTHON_PROCESSES.remove(&tgid);
}

#[inline(always)]
fn read(addr: u64) -> Option<u64> {
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}

/// The current frame field (`tstate_frame`) of the current thread's `PyThreadState`: the one
/// kept for it if it still holds, else the one among its interpreter's threads whose thread
/// id is this thread's pointer.
#[inline(always)]
fn thread_frame(pid: u32, interp_head: u64, state: *mut Walk) -> Result<u64, u32> {
    let walk = unsafe { &mut *state };
    walk.search = ThreadSearch { tstate: 0, thread: current_thread_pointer(), found: 0 };
    let kept = unsafe { PYTHON_THREADS.get(&pid) }.map_or(0, |kept| *kept);
    if kept == 0 || !walk.read_thread(kept) {
        walk.search.tstate = read(interp_head).and_then(|interp| read(interp + walk.layout.interp_threads as u64)).ok_or(python_stop::NO_THREAD)?;
        let mut context = Context { walk: state, stack: core::ptr::null_mut() };
        unsafe { bpf_loop(MAX_PYTHON_THREADS, search_step as *mut c_void, &mut context as *mut Context as *mut c_void, 0) };
        let walk = unsafe { &mut *state };
        let found = walk.search.found;
        if found == 0 {
            return Err(python_stop::NO_THREAD);
        }
        let _ = PYTHON_THREADS.insert(&pid, &found, 0);
        if !walk.read_thread(found) {
            return Err(python_stop::READ_FAULT);
        }
    }
    let walk = unsafe { &mut *state };
    walk.thread_field(walk.layout.tstate_frame).ok_or(python_stop::READ_FAULT)
}

/// A search of an interpreter's threads for the one whose thread id is `thread`.
#[repr(C)]
struct ThreadSearch {
    tstate: u64,
    thread: u64,
    found: u64,
}

extern "C" fn search_step(_index: u64, context: *mut c_void) -> i64 {
    let walk = unsafe { &mut *(*(context as *const Context)).walk };
    let (next, thread_id) = (walk.layout.tstate_next as u64, walk.layout.tstate_thread_id as u64);
    let search = &mut walk.search;
    if search.tstate == 0 {
        return 1;
    }
    if read(search.tstate + thread_id) == Some(search.thread) {
        search.found = search.tstate;
        return 1;
    }
    match read(search.tstate + next) {
        Some(next) => {
            search.tstate = next;
            0
        }
        None => 1,
    }
}

#[repr(C)]
pub struct Walk {
    layout: PythonLayout,
    /// The frame to read next (0: none).
    frame: u64,
    count: u32,
    stop: u32,
    hash: u64,
    check: u64,
    search: ThreadSearch,
    /// User memory from `window_start` to `window_end`, the frame being read at `base`.
    window: [u8; WINDOW_BYTES],
    window_start: u64,
    window_end: u64,
    base: u64,
}

impl Walk {
    /// Reads the thread state at `tstate` into the window (its thread id and its frame at
    /// once); whether it is the state of the thread searched for.
    #[inline(always)]
    fn read_thread(&mut self, tstate: u64) -> bool {
        let (id_at, frame_at) = (self.layout.tstate_thread_id as u64, self.layout.tstate_frame as u64);
        let first = id_at.min(frame_at);
        self.read_window(tstate + first, id_at.max(frame_at) + 8 - first) && self.thread_field(self.layout.tstate_thread_id) == Some(self.search.thread)
    }

    /// The word at `offset` of the thread state read last.
    #[inline(always)]
    fn thread_field(&self, offset: u16) -> Option<u64> {
        let first = self.layout.tstate_thread_id.min(self.layout.tstate_frame);
        self.word_at(offset.wrapping_sub(first) as u64)
    }

    /// Reads `len` bytes of user memory at `start` into the window; false if they cannot be
    /// read.
    #[inline(always)]
    fn read_window(&mut self, start: u64, len: u64) -> bool {
        // Opaque, so that the compiler cannot drop the check the verifier needs.
        let len = opaque(len);
        if len > WINDOW_BYTES as u64 {
            return false;
        }
        let copied = unsafe { bpf_probe_read_user_raw(self.window.as_mut_ptr() as *mut c_void, len as u32, start as *const c_void) };
        (self.window_start, self.window_end) = if copied == 0 { (start, start + len) } else { (0, 0) };
        copied == 0
    }

    /// Reads the frame at `frame` into the window, unless it holds it already; false if its
    /// memory cannot be read.
    #[inline(always)]
    fn read_frame(&mut self) -> bool {
        let (frame, end) = (self.frame, self.frame.wrapping_add(FRAME_BYTES as u64));
        let held = self.window_start <= frame && frame < end && end <= self.window_end;
        if !held {
            let start = if self.layout.stacked_frames != 0 { end.saturating_sub(WINDOW_BYTES as u64).max(frame & !(PAGE - 1)) } else { frame };
            if !self.read_window(start, end.wrapping_sub(start)) {
                return false;
            }
        }
        self.base = frame - self.window_start;
        true
    }

    /// The `N` bytes `at` bytes into the window, or None past what it holds.
    #[inline(always)]
    fn bytes<const N: usize>(&self, at: u64) -> Option<[u8; N]> {
        let at = opaque(at);
        if at > (WINDOW_BYTES - N) as u64 || at + N as u64 > self.window_end.wrapping_sub(self.window_start) {
            return None;
        }
        Some(unsafe { core::ptr::read_unaligned(self.window.as_ptr().add(at as usize) as *const [u8; N]) })
    }

    #[inline(always)]
    fn word_at(&self, at: u64) -> Option<u64> {
        self.bytes::<8>(at).map(u64::from_le_bytes)
    }

    /// The `N` bytes at `offset` of the frame read last, or None past its end.
    #[inline(always)]
    fn field<const N: usize>(&self, offset: u16) -> Option<[u8; N]> {
        if offset as usize > FRAME_BYTES - N {
            return None;
        }
        self.bytes(self.base + offset as u64)
    }

    #[inline(always)]
    fn word(&self, offset: u16) -> Option<u64> {
        self.field::<8>(offset).map(u64::from_le_bytes)
    }

    /// Mixes the last frame recorded into the hashes, once it is final (a shim after it marks
    /// it as the last of its run).
    #[inline(always)]
    fn mix_last(&mut self, stack: *mut UserStack) {
        let Some(n) = self.count.checked_sub(1) else { return };
        let Some(word) = slot(stack, n).map(|w| *w) else { return };
        mix_frame(&mut self.hash, &mut self.check, word);
    }
}

/// Slot of the `n`th Python frame in the stack's frames (from the end backwards).
#[inline(always)]
fn slot<'s>(stack: *mut UserStack, n: u32) -> Option<&'s mut u64> {
    if n >= MAX_PYTHON_FRAMES {
        return None;
    }
    // Masked as well, on a value the compiler must load and so cannot know the range of (it
    // drops a mask it knows to change nothing): the verifier then knows the index's range.
    const _: () = assert!(MAX_PYTHON_FRAMES.is_power_of_two() && (MAX_PYTHON_FRAMES as usize) < MAX_USER_FRAMES);
    let n = unsafe { core::ptr::read_volatile(&n) };
    let index = MAX_USER_FRAMES - 1 - (n & (MAX_PYTHON_FRAMES - 1)) as usize;
    unsafe { (*stack).frames.get_mut(index) }
}

/// One Python frame: records it (a shim, only marks the frame before it), then moves to its
/// caller. Returns 1 to end the walk.
extern "C" fn step(_index: u64, context: *mut c_void) -> i64 {
    let context = unsafe { &*(context as *const Context) };
    let walk = unsafe { &mut *context.walk };
    match record_frame(walk, context.stack) {
        Ok(()) => 0,
        Err(stop) => {
            walk.stop = stop;
            1
        }
    }
}

#[inline(always)]
fn record_frame(walk: &mut Walk, stack: *mut UserStack) -> Result<(), u32> {
    if walk.frame == 0 {
        return Err(python_stop::END);
    }
    if walk.count >= MAX_PYTHON_FRAMES {
        return Err(python_stop::DEPTH);
    }
    if !walk.read_frame() {
        return Err(python_stop::READ_FAULT);
    }
    let layout = walk.layout;
    let fault = python_stop::READ_FAULT;
    let back = walk.word(layout.frame_back).ok_or(fault)?;
    let entry_byte = walk.field::<1>(layout.frame_entry).map_or(0, |b| b[0]);
    if layout.entry_kind == entry_kind::BEFORE_SHIM && entry_byte == entry_kind::OWNED_BY_CSTACK {
        if let Some(last) = walk.count.checked_sub(1).and_then(|n| slot(stack, n)) {
            *last = python_frame::with_entry(*last);
        }
        walk.frame = back;
        return Ok(());
    }
    let code = walk.word(layout.frame_code).ok_or(fault)?;
    let position = if layout.position_kind == position_kind::LASTI {
        i32::from_le_bytes(walk.field::<4>(layout.frame_position).ok_or(fault)?) as i64
    } else {
        let start = code.wrapping_add(layout.code_bytecode as u64);
        let at = walk.word(layout.frame_position).ok_or(fault)?;
        if at >= start { ((at - start) / 2) as i64 } else { -1 }
    };
    let entry = match layout.entry_kind {
        entry_kind::EVERY_FRAME => true,
        entry_kind::FLAG => entry_byte != 0,
        _ => false,
    };
    walk.mix_last(stack);
    *slot(stack, walk.count).ok_or(python_stop::DEPTH)? = python_frame::encode(code, position, entry);
    walk.count += 1;
    walk.frame = back;
    Ok(())
}
