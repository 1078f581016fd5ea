//! Stage 4, encode: what each profile kind measures (`kinds`), the pprof profile of an
//! interval (`pprof`), the unit that leaves the agent, and its OTLP form (`otlp`). Called by
//! the pipeline, and by the OTLP sink.
mod kinds;
pub mod otlp;
pub mod pprof;

pub use kinds::ProfileKind;
