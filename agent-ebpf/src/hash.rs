//! The two hashes a walked stack is stored and checked under.

/// Mixes one frame into a hash (FNV-1a's step, a word at a time).
#[inline(always)]
pub fn mix(hash: u64, value: u64) -> u64 {
    (hash ^ value).wrapping_mul(0x0000_0100_0000_01b3)
}
