//! What an allocator probe's hit costs on this host, measured once by `alloc_probes` and kept
//! by the sampler for the governor to price the probes' hits.

/// The cost (ns) of a trap, and of the step the kernel adds where it does not emulate the
/// probed instruction.
#[derive(Clone, Copy, Debug)]
pub struct TrapCosts {
    pub trap_ns: f64,
    pub step_ns: f64,
}
