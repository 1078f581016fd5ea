//! The two hashes a walked stack is stored and checked under.

/// Mixes one frame into a hash (FNV-1a's step, a word at a time).
#[inline(always)]
pub fn mix(hash: u64, value: u64) -> u64 {
    (hash ^ value).wrapping_mul(0x0000_0100_0000_01b3)
}

/// Mixes one frame into both of a stack's hashes: the id's, and the check's (rotated first, so
/// that the two differ for the same frames).
#[inline(always)]
pub fn mix_frame(hash: &mut u64, check: &mut u64, frame: u64) {
    *hash = mix(*hash, frame);
    *check = mix(check.rotate_left(23), frame);
}
