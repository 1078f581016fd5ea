//! Network stacks: one program per net tracepoint (packets and bytes by stack and device),
//! and the socket's last sender, to whom transmits are attributed.
use agent_common::{attribution, counter, kind, run, FieldLayout, SocketOwner, IFNAMSIZ};
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes},
    macros::{map, tracepoint},
    maps::LruHashMap,
    programs::TracePointContext,
    EbpfContext,
};

use crate::{
    aggregate::record,
    buffers::{active_set, bump, kernel_stack_id, BufferSet},
    config::{config, field, passes_filters, rates, sampled_out},
    run_time::{run_ended, run_started},
    thread_cache::current_key,
    walk,
};

const NET_KINDS: usize = kind::NET_COUNT;

/// Socket (struct sock address) to its last sender and send stacks.
#[map]
static SOCK_OWNER: LruHashMap<u64, SocketOwner> = LruHashMap::with_max_entries(16384, 0);

#[no_mangle]
static NET_LAYOUTS: [FieldLayout; NET_KINDS] = [FieldLayout::NONE; NET_KINDS];
#[no_mangle]
static SKB_SK_OFFSET: u32 = FieldLayout::ABSENT;
#[no_mangle]
static SEND_SK_OFFSET: u32 = 0;
#[no_mangle]
static SEND_RET_OFFSET: u32 = 0;

/// A network event: packets and bytes by stack and device, on the current task or, for a
/// transmit, on the socket's last sender. Filters apply to whom the event is attributed to:
/// a sender's data often leaves from softirq on another task, which must not filter it out.
#[inline(always)]
fn record_net(ctx: &TracePointContext, event_kind: u8) -> u32 {
    let start = run_started();
    let set = active_set();
    let ratio = rates().net_ratio.max(1);
    let recorded = !sampled_out(ratio) && record_net_event(ctx, event_kind, &set, ratio);
    run_ended(&set, run::NET, start, recorded);
    0
}

#[inline(always)]
fn record_net_event(ctx: &TracePointContext, event_kind: u8, set: &BufferSet, ratio: u32) -> bool {
    let layouts = config(&NET_LAYOUTS);
    let Some(layout) = layouts.get((event_kind - kind::FIRST_NET) as usize) else { return false };
    let len: u32 = if layout.len != FieldLayout::ABSENT { field(ctx, layout.len) } else { 0 };
    let mut device = [0u8; IFNAMSIZ];
    if layout.name != FieldLayout::ABSENT {
        // __data_loc: low 16 bits are the string's offset in the record, high 16 its length.
        let loc: u32 = field(ctx, layout.name);
        let name = unsafe { (ctx.as_ptr() as *const u8).add((loc & 0xffff) as usize) };
        let _ = unsafe { bpf_probe_read_kernel_str_bytes(name, &mut device) };
    }
    let transmit = event_kind == kind::NET_DEV_QUEUE || event_kind == kind::NET_DEV_XMIT;
    if transmit {
        // The owner passed the filters when it sent (`sock_send_length`).
        if let Some(owner) = socket_owner(ctx, layout, set) {
            let mut attributed = owner.key;
            attributed.kind = event_kind;
            attributed.device = device;
            attributed.aux = attribution::SOCKET_OWNER;
            bump(set, counter::NET_EVENTS);
            record(set, &attributed, ratio as u64, len as u64 * ratio as u64);
            return true;
        }
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !passes_filters(tgid) {
        bump(set, counter::NET_FILTERED);
        return false;
    }
    let mut key = current_key(event_kind, set);
    key.device = device;
    if layout.reason != FieldLayout::ABSENT {
        key.aux = field(ctx, layout.reason);
    }
    bump(set, counter::NET_EVENTS);
    walk::capture(set, tgid, &mut key);
    key.kernel_stack_id = kernel_stack_id(ctx, set);
    record(set, &key, ratio as u64, len as u64 * ratio as u64);
    true
}

/// The last sender on the packet's socket, if its stacks are recent enough to be valid
/// (captured in this interval or the previous one).
#[inline(always)]
fn socket_owner(ctx: &TracePointContext, layout: &FieldLayout, set: &BufferSet) -> Option<SocketOwner> {
    let sk_offset = config(&SKB_SK_OFFSET);
    if sk_offset == FieldLayout::ABSENT || layout.skbaddr == FieldLayout::ABSENT {
        return None;
    }
    let skb: u64 = field(ctx, layout.skbaddr);
    let sk: u64 = unsafe { bpf_probe_read_kernel((skb + sk_offset as u64) as *const u64) }.ok()?;
    let owner = unsafe { *SOCK_OWNER.get_ptr(&sk)? };
    (owner.generation.wrapping_add(1) >= set.generation).then_some(owner)
}

/// Remembers who sends on each socket, with the send stacks: once per socket, thread and
/// interval, so a busy sender pays for stack capture once per interval, not per call.
#[tracepoint]
pub fn sock_send_length(ctx: TracePointContext) -> u32 {
    let start = run_started();
    let set = active_set();
    let recorded = remember_sender(&ctx, &set);
    run_ended(&set, run::NET, start, recorded);
    0
}

#[inline(always)]
fn remember_sender(ctx: &TracePointContext, set: &BufferSet) -> bool {
    let sent: i32 = field(ctx, config(&SEND_RET_OFFSET));
    if sent <= 0 {
        return false;
    }
    let sk: u64 = field(ctx, config(&SEND_SK_OFFSET));
    let pid_tgid = bpf_get_current_pid_tgid();
    if let Some(owner) = SOCK_OWNER.get_ptr(&sk) {
        let owner = unsafe { &*owner };
        if owner.generation == set.generation && owner.key.pid == pid_tgid as u32 {
            return false;
        }
    }
    if !passes_filters((pid_tgid >> 32) as u32) {
        return false;
    }
    let mut key = current_key(kind::NET_DEV_QUEUE, set);
    walk::capture(set, key.tgid, &mut key);
    key.kernel_stack_id = kernel_stack_id(ctx, set);
    let _ = SOCK_OWNER.insert(&sk, &SocketOwner { key, generation: set.generation, _pad: 0 }, 0);
    true
}

#[tracepoint]
pub fn net_dev_queue(ctx: TracePointContext) -> u32 {
    record_net(&ctx, kind::NET_DEV_QUEUE)
}

#[tracepoint]
pub fn net_dev_xmit(ctx: TracePointContext) -> u32 {
    record_net(&ctx, kind::NET_DEV_XMIT)
}

#[tracepoint]
pub fn netif_receive_skb(ctx: TracePointContext) -> u32 {
    record_net(&ctx, kind::NETIF_RECEIVE_SKB)
}

#[tracepoint]
pub fn napi_gro_receive_entry(ctx: TracePointContext) -> u32 {
    record_net(&ctx, kind::NAPI_GRO_RECEIVE_ENTRY)
}

#[tracepoint]
pub fn tcp_retransmit_skb(ctx: TracePointContext) -> u32 {
    record_net(&ctx, kind::TCP_RETRANSMIT_SKB)
}

#[tracepoint]
pub fn kfree_skb(ctx: TracePointContext) -> u32 {
    record_net(&ctx, kind::KFREE_SKB)
}
