//! Each CPU keeps, per thread, the native frames a walk found below an anchor: a frame of code
//! whose callers stay put while it runs (the outermost run of Python's evaluation loop, below
//! which lie the interpreter's start-up and `main`). A later walk of the thread that reaches
//! an anchor frame with the same CFA and return address copies those frames instead of
//! walking them: on Debian's python3 they are a dozen frames of table rows and stack reads.
use agent_common::{UserStack, MAX_USER_FRAMES};
use aya_ebpf::{macros::map, maps::PerCpuArray};

use crate::{hash::mix, opaque::opaque};

/// Frames kept below an anchor at most (python3.11's own are 13): a longer tail is walked
/// each time.
pub const TAIL_FRAMES: usize = 32;
/// Threads whose tails each CPU keeps, by pid.
const TAIL_SLOTS: usize = 8;

/// The frames below one thread's anchor, as last walked on this CPU.
#[repr(C)]
pub struct Tail {
    pid_tgid: u64,
    /// The process's life and its mappings' generation when walked: an exec, or a change
    /// of its code, walks them again.
    tag: u32,
    generation: u32,
    /// The anchor frame's CFA and return address.
    cfa: u64,
    ra: u64,
    /// Frames kept (0: none), the anchor's caller first.
    len: u32,
    _pad: u32,
    frames: [u64; TAIL_FRAMES],
}

#[map]
static TAILS: PerCpuArray<[Tail; TAIL_SLOTS]> = PerCpuArray::with_max_entries(1, 0);

/// Whose tail a walk may use or keep: the thread, its process's life and mappings.
#[derive(Clone, Copy)]
pub struct Owner {
    pub pid_tgid: u64,
    pub tag: u32,
    pub generation: u32,
}

/// Where an anchor frame was met in a walk: its CFA and return address, and how many frames
/// the stack had up to it.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Anchor {
    pub cfa: u64,
    pub ra: u64,
    pub len: u32,
    /// 1 if this CPU keeps the thread's frames below it.
    pub kept: u32,
}

/// A stack's frame, checked on an index the compiler cannot see through: it cannot then
/// check one copy of the index and address the frame with another, which the verifier
/// refuses.
#[inline(always)]
fn frame_at(frames: &mut [u64; MAX_USER_FRAMES], index: usize) -> Option<&mut u64> {
    frames.get_mut(opaque(index as u64) as usize)
}

#[inline(always)]
fn slot(owner: Owner) -> Option<&'static mut Tail> {
    let slots = TAILS.get_ptr_mut(0)?;
    unsafe { (*slots).get_mut(owner.pid_tgid as usize & (TAIL_SLOTS - 1)) }
}

/// Whether this CPU keeps the frames below an anchor frame of the owner's at `cfa` that
/// returns to `ra`.
#[inline(always)]
pub fn kept(owner: Owner, cfa: u64, ra: u64) -> bool {
    slot(owner).is_some_and(|tail| {
        tail.len > 0 && tail.pid_tgid == owner.pid_tgid && tail.tag == owner.tag && tail.generation == owner.generation && tail.cfa == cfa && tail.ra == ra
    })
}

/// Appends the kept frames to the stack, up to `limit` frames in all, mixing each into the
/// hashes as the walk would have; whether all of them fit.
#[inline(always)]
pub fn append(owner: Owner, stack: &mut UserStack, limit: u32, hash: &mut u64, check: &mut u64) -> bool {
    let Some(tail) = slot(owner) else { return false };
    let len = tail.len as usize;
    for i in 0..TAIL_FRAMES {
        if i >= len {
            return true;
        }
        if stack.len >= limit {
            return false;
        }
        let (Some(&frame), Some(to)) = (tail.frames.get(i), frame_at(&mut stack.frames, stack.len as usize)) else { return false };
        *to = frame;
        stack.len += 1;
        *hash = mix(*hash, frame);
        *check = mix(check.rotate_left(23), frame);
    }
    true
}

/// Keeps the stack's frames after the anchor's (a complete walk's) for the owner's later
/// walks on this CPU.
#[inline(always)]
pub fn keep(owner: Owner, anchor: Anchor, stack: &mut UserStack) {
    let Some(tail) = slot(owner) else { return };
    let Some(len) = stack.len.checked_sub(anchor.len).filter(|&len| len as usize <= TAIL_FRAMES) else { return };
    // Emptied first: a copy cut short must not leave another owner's frames half replaced.
    tail.len = 0;
    for i in 0..TAIL_FRAMES {
        if i >= len as usize {
            break;
        }
        let (Some(&mut frame), Some(to)) = (frame_at(&mut stack.frames, anchor.len as usize + i), tail.frames.get_mut(i)) else { return };
        *to = frame;
    }
    (tail.pid_tgid, tail.tag, tail.generation, tail.cfa, tail.ra) = (owner.pid_tgid, owner.tag, owner.generation, anchor.cfa, anchor.ra);
    tail.len = len;
}
