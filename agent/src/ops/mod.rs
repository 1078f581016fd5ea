//! Operations: what the agent tells about itself. Prometheus metrics that every stage adds to,
//! the status server (health, readiness, metrics), and the per-interval loss report. It
//! depends on no stage, so any stage may use it.
pub mod losses;
pub mod memory;
pub mod metrics;
pub mod status;
