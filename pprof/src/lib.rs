//! pprof profile tools shared by the agent and the collector.
mod codec;
mod merge;
mod select;
mod strings;
mod views;

pub use codec::{decode_gzip, encode_gzip};
pub use merge::merge;
pub use select::{retain_samples, totals};
pub use strings::{string, StringIndex};
pub use views::{flamegraph, folded, unit, view, View, JIT_MAPPING, KERNEL_MAPPING};
