//! Values and comparisons the compiler must not see through: where it would reason about a
//! value's range, it rewrites the code in ways the verifier cannot follow (a check on one copy
//! of an index and an access through another, or a branch per step of a search).

/// `value`, which the compiler can no longer see: a loop bound it cannot unroll (the
/// verifier gives up on the unrolled searches), an index or length it must check as is. One
/// move of a register to itself, whose value the verifier still knows: an empty template
/// left two lines of debug info at one instruction, which the kernel refuses.
#[inline(always)]
pub fn opaque(mut value: u64) -> u64 {
    unsafe { core::arch::asm!("{0} = {0}", inout(reg) value, options(pure, nomem, nostack)) };
    value
}

/// The sign bit of `a - b`, in assembly: from a shift of a difference whose range it knows,
/// the compiler makes a comparison, which in BPF is a branch, and the verifier would follow
/// both ways at every search step (2^steps paths in all, which it refuses).
#[inline(always)]
pub fn sign_bit(a: u64, b: u64) -> u64 {
    let mut d = a;
    unsafe { core::arch::asm!("{d} -= {b}", "{d} >>= 63", d = inout(reg) d, b = in(reg) b, options(pure, nomem, nostack)) };
    d
}
