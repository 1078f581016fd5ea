//! pprof profile tools shared by the agent and the collector.
mod by_id;
mod codec;
mod held;
mod merge;
mod select;
mod strings;
mod views;

pub use by_id::ById;
pub use codec::{decode, decode_gzip, encode_gzip};
pub use held::{average_held, held_values, is_held, kind_holds};
pub use merge::merge;
pub use select::{retain_samples, totals};
pub use strings::{string, StringIndex};
pub use views::{flamegraph, folded, unit, view, View, JIT_MAPPING, KERNEL_MAPPING, PYTHON_MAPPING};

/// Maps keyed by ids, strings and stacks of profiles: a fast hash (foldhash, seeded per
/// process) rather than SipHash, which took a fifth of a merge's or a tree's time.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
