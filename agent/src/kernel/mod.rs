//! Stage 1, the kernel side seen from userspace: checks privileges, discovers tracepoint and
//! struct layouts, loads and attaches the BPF programs, and drains their double-buffered maps
//! once per interval. Its only caller is the resolve stage (and `settings`, for validation).
mod accounting;
mod alloc_probes;
mod alloc_sampling;
mod announce;
mod aya_errors;
mod barrier;
mod batch;
mod btf;
mod drain;
mod events;
mod host_stat;
mod layouts;
mod live_allocations;
mod load;
mod probe_costs;
mod rates;
mod sampling;
mod unwind_maps;
pub mod preflight;
pub mod tracefs;

pub use accounting::ProgramCost;
pub use alloc_probes::{AllocProbe, AllocSite};
pub use announce::Announcements;
pub use drain::{Counters, RawInterval, Stack};
pub use events::{AllocSettings, Event, KernelSettings, NetEvent, OffCpuSettings};
pub use host_stat::{HostActivity, HostStat};
pub use load::Sampler;
pub use rates::{Overhead, Unseen};
pub use sampling::{Paused, SamplingRates, TickPhase};
pub use unwind_maps::UnwindMaps;
#[cfg(fuzzing)]
pub use btf::Btf;
