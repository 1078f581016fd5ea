//! Types and names shared by Ember's BPF programs (`agent-ebpf`) and the agent, so that the
//! layout of every map key and value is defined once and the two sides cannot drift.
#![no_std]

mod counters;
mod layouts;
pub mod names;
mod network;
mod offcpu;
mod memory;
mod process;
mod python;
mod rates;
mod sample;
mod unwind;

pub use counters::{counter, run};
pub use layouts::{AreaLayout, FieldLayout, SwitchLayout, TaskLayout};
pub use network::{attribution, SocketOwner};
pub use memory::{allocator_call, memory_call, tcmalloc_span, LiveAllocation, LiveKey, RequestLayout, ALLOC_GAPS};
pub use offcpu::{block_state, OffCpuStart};
pub use process::{unmapped_region, ExeImage, ProcessEvent};
pub use python::{
    entry_kind, position_kind, python_frame, python_stop, PythonLayout, PythonProcess, MAX_PYTHON_FRAMES, MAX_PYTHON_THREADS,
};
pub use rates::Rates;
pub use sample::{kind, stack_status, SampleKey, SampleValue, COMM_LEN, IFNAMSIZ};
pub use unwind::{
    row_kind, unwind_stop, ExeKey, ExeTemplate, ExecMapping, PageRows, ProcessMappings, UnwindRow, UserStack, MAX_MAPPINGS, MAX_TABLE_ROWS, MAX_USER_FRAMES,
    UNWIND_PAGE,
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain #[repr(C)] integers and arrays without padding holes that matter.
    unsafe impl aya::Pod for super::SampleKey {}
    unsafe impl aya::Pod for super::ProcessEvent {}
    unsafe impl aya::Pod for super::SampleValue {}
    unsafe impl aya::Pod for super::OffCpuStart {}
    unsafe impl aya::Pod for super::Rates {}
    unsafe impl aya::Pod for super::FieldLayout {}
    unsafe impl aya::Pod for super::SocketOwner {}
    unsafe impl aya::Pod for super::SwitchLayout {}
    unsafe impl aya::Pod for super::TaskLayout {}
    unsafe impl aya::Pod for super::AreaLayout {}
    unsafe impl aya::Pod for super::RequestLayout {}
    unsafe impl aya::Pod for super::LiveKey {}
    unsafe impl aya::Pod for super::LiveAllocation {}
    unsafe impl aya::Pod for super::UserStack {}
    unsafe impl aya::Pod for super::UnwindRow {}
    unsafe impl aya::Pod for super::ProcessMappings {}
    unsafe impl aya::Pod for super::ExeKey {}
    unsafe impl aya::Pod for super::ExeTemplate {}
    unsafe impl aya::Pod for super::ExecMapping {}
    unsafe impl aya::Pod for super::PageRows {}
    unsafe impl aya::Pod for super::PythonProcess {}
}
