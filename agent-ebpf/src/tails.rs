//! Each CPU keeps, per thread, the native frames a walk found below an anchor: a frame of code
//! whose callers stay put while it runs (the outermost run of Python's evaluation loop, below
//! which lie the interpreter's start-up and `main`), with a digest of them. A later walk of
//! the thread that reaches an anchor frame with the same CFA and return address takes them
//! instead of walking them (on Debian's python3 a dozen frames of table rows and stack reads):
//! it mixes their digest into its hashes, and the frames are copied only into a stack new to
//! the interval. The copies are `bpf_loop` steps of their own: inlined in the walk's end,
//! which every program that walks a stack inlines, their branches were paths for the verifier
//! to follow in each of those programs.
use agent_common::{UserStack, MAX_USER_FRAMES};
use aya_ebpf::{macros::map, maps::PerCpuArray};

use crate::{
    hash::{mix, mix_frame},
    opaque::opaque,
};

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
    /// The frames folded into the walk's two hashes from their seeds (`digest`): what a walk
    /// that copies them mixes in, in place of each frame.
    digest: u64,
    digest_check: u64,
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

/// Where an anchor frame was met in a walk: its CFA and return address, how many frames the
/// stack had up to it, and the walk's hashes then.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Anchor {
    pub cfa: u64,
    pub ra: u64,
    pub len: u32,
    /// 1 if this CPU keeps the thread's frames below it.
    pub kept: u32,
    pub hash: u64,
    pub check: u64,
}

/// What a stack's hashes are once it has the frames below an anchor: the hashes at the
/// anchor, with the frames' digest mixed in. The same whether the frames were walked (and
/// kept) or copied, so that a stack keeps its id; a copy need not mix every frame.
#[inline(always)]
pub fn hashes_below(anchor: Anchor, digest: u64, digest_check: u64) -> (u64, u64) {
    (mix(anchor.hash, digest), mix(anchor.check.rotate_left(23), digest_check))
}

/// The digests' seeds.
const DIGEST_SEEDS: (u64, u64) = (0x6a09_e667_f3bc_c909, 0xbb67_ae85_84ca_a73b);

/// A stack's frame, checked on an index the compiler cannot see through: it cannot then
/// check one copy of the index and address the frame with another, which the verifier
/// refuses.
#[inline(always)]
fn frame_at(frames: &mut [u64; MAX_USER_FRAMES], index: u32) -> Option<&mut u64> {
    frames.get_mut(opaque(index as u64) as usize)
}

#[inline(always)]
fn slot(owner: Owner) -> Option<&'static mut Tail> {
    let slots = TAILS.get_ptr_mut(0)?;
    unsafe { (*slots).get_mut(owner.pid_tgid as usize & (TAIL_SLOTS - 1)) }
}

/// Notes an anchor frame the walk met (`at`, its frame count so far) as its last, and
/// whether this CPU keeps the owner's frames below it: 1 to end the walk there (a `step`'s
/// return), the frames to be appended. Compared without a branch per field: the verifier
/// follows every branch of every step.
#[inline(always)]
pub fn met(owner: Owner, last: &mut Anchor, at: Anchor) -> i64 {
    let kept = slot(owner).map_or(0, |tail| {
        let differs = (tail.pid_tgid ^ owner.pid_tgid) | (tail.tag ^ owner.tag) as u64 | (tail.generation ^ owner.generation) as u64 | (tail.cfa ^ at.cfa) | (tail.ra ^ at.ra);
        // The top bit of len - 1 is set for an empty slot only.
        let empty = (tail.len as u64).wrapping_sub(1) >> 63;
        (opaque(differs | empty) == 0) as u32
    });
    *last = Anchor { kept, ..at };
    kept as i64
}

/// How many of the owner's kept frames `append` adds: as many as fit under `limit` frames;
/// and, if that is all of them, their digests.
#[inline(always)]
pub fn to_append(owner: Owner, stack: &UserStack, limit: u32) -> (u32, Option<(u64, u64)>) {
    let Some(tail) = slot(owner) else { return (0, None) };
    let kept = tail.len.min(TAIL_FRAMES as u32);
    let room = limit.saturating_sub(stack.len);
    (kept.min(room), (kept <= room).then_some((tail.digest, tail.digest_check)))
}

/// Appends the owner's kept frame `i` to the stack, mixing it into the hashes as the walk
/// would have (a `bpf_loop` step: returns 1 to stop).
#[inline(always)]
pub fn append(owner: Owner, i: u32, stack: &mut UserStack, hash: &mut u64, check: &mut u64) -> i64 {
    let Some(tail) = slot(owner) else { return 1 };
    let (Some(&frame), Some(to)) = (tail.frames.get(opaque(i as u64) as usize), frame_at(&mut stack.frames, stack.len)) else { return 1 };
    *to = frame;
    stack.len += 1;
    mix_frame(hash, check, frame);
    0
}

/// How many frames `keep` copies after the anchor of a complete walk (0: too many to keep).
/// The owner's slot is emptied meanwhile: a copy cut short must not leave another owner's
/// frames half replaced.
#[inline(always)]
pub fn to_keep(owner: Owner, anchor: Anchor, stack: &UserStack) -> u32 {
    let Some(tail) = slot(owner) else { return 0 };
    tail.len = 0;
    (tail.digest, tail.digest_check) = DIGEST_SEEDS;
    match stack.len.checked_sub(anchor.len) {
        Some(len) if len <= TAIL_FRAMES as u32 => len,
        _ => 0,
    }
}

/// Copies the stack's frame `i` after the anchor into the owner's slot, folding it into the
/// digests (a `bpf_loop` step).
#[inline(always)]
pub fn keep(owner: Owner, anchor: Anchor, i: u32, stack: &mut UserStack) -> i64 {
    let Some(tail) = slot(owner) else { return 1 };
    let (Some(&mut frame), Some(to)) = (frame_at(&mut stack.frames, anchor.len + i), tail.frames.get_mut(opaque(i as u64) as usize)) else { return 1 };
    *to = frame;
    mix_frame(&mut tail.digest, &mut tail.digest_check, frame);
    0
}

/// Marks the owner's slot as holding `len` frames below `anchor`, once they are copied; their
/// digests.
#[inline(always)]
pub fn mark_kept(owner: Owner, anchor: Anchor, len: u32) -> Option<(u64, u64)> {
    let tail = slot(owner)?;
    (tail.pid_tgid, tail.tag, tail.generation, tail.cfa, tail.ra) = (owner.pid_tgid, owner.tag, owner.generation, anchor.cfa, anchor.ra);
    tail.len = len;
    Some((tail.digest, tail.digest_check))
}
