//! Where the kernel keeps the fields the programs read, discovered at start-up rather than
//! hard-coded: tracepoint field offsets from tracefs format files, and `sk_buff.sk` and
//! `task_struct`'s fields from kernel BTF. The loader passes them to the programs as globals.
use agent_common::{kind, AreaLayout, FieldLayout, RequestLayout, SwitchLayout, TaskLayout};
use anyhow::Result;

use super::{btf::Btf, events::NetEvent, tracefs::Format};

pub(super) fn switch_layout() -> Result<SwitchLayout> {
    let format = Format::read("sched", "sched_switch")?;
    let (prev_state, prev_state_size) = format.field("prev_state")?;
    if prev_state_size != 4 && prev_state_size != 8 {
        anyhow::bail!("sched:sched_switch prev_state is {prev_state_size} bytes: expected 4 or 8");
    }
    Ok(SwitchLayout {
        prev_pid: format.offset("prev_pid")?,
        prev_state,
        prev_state_size,
        next_pid: format.offset("next_pid")?,
    })
}

/// Where a task keeps what tells its process's lives apart (`SampleKey::process_tag`), and its
/// name.
pub(super) fn task_layout(btf: &Btf) -> Result<TaskLayout> {
    Ok(TaskLayout {
        group_leader: btf.member_offset("task_struct", "group_leader")?,
        start_boottime: btf.member_offset("task_struct", "start_boottime")?,
        self_exec_id: btf.member_offset("task_struct", "self_exec_id")?,
        comm: btf.member_offset("task_struct", "comm")?,
        mm: btf.member_offset("task_struct", "mm")?,
        start_stack: btf.member_offset("mm_struct", "start_stack")?,
        fsbase: btf.member_offset("task_struct", "thread")? + btf.member_offset("thread_struct", "fsbase")?,
        start_code: btf.member_offset("mm_struct", "start_code")?,
        end_code: btf.member_offset("mm_struct", "end_code")?,
        exe_file: btf.member_offset("mm_struct", "exe_file")?,
        f_inode: btf.member_offset("file", "f_inode")?,
        i_ino: btf.member_offset("inode", "i_ino")?,
        i_sb: btf.member_offset("inode", "i_sb")?,
        s_dev: btf.member_offset("super_block", "s_dev")?,
        brk: btf.member_offset("mm_struct", "brk")?,
        sum_exec_runtime: btf.member_offset("task_struct", "se")? + btf.member_offset("sched_entity", "sum_exec_runtime")?,
    })
}

/// Where the brk and mmap syscall tracepoints keep what a call asked for.
pub(super) fn request_layout() -> Result<RequestLayout> {
    let (brk, mmap) = (Format::read("syscalls", "sys_enter_brk")?, Format::read("syscalls", "sys_enter_mmap")?);
    Ok(RequestLayout { brk: brk.offset("brk")?, mmap_len: mmap.offset("len")?, mmap_flags: mmap.offset("flags")? })
}

/// Where sched_process_fork's record holds the new task's pid (its comms are `__data_loc`
/// on recent kernels, inline before).
pub(super) fn fork_child_pid() -> Result<u32> {
    Format::read("sched", "sched_process_fork")?.offset("child_pid")
}

/// Where sched_process_exit's record says whether the process's last thread exits
/// (`group_dead`, since 6.16), or `FieldLayout::ABSENT`.
pub(super) fn exit_group_dead() -> Result<u32> {
    Ok(Format::read("sched", "sched_process_exit")?.optional("group_dead").unwrap_or(FieldLayout::ABSENT))
}

/// Where mmap:vm_unmapped_area's record holds the address found for a new mapping and its
/// length, or None (with a warning) on a kernel without that tracepoint: code replaced in
/// place is then not noticed.
pub(super) fn area_layout() -> Option<AreaLayout> {
    let layout = Format::read("mmap", "vm_unmapped_area").and_then(|f| Ok(AreaLayout { addr: f.offset("addr")?, length: f.offset("length")? }));
    layout
        .inspect_err(|e| tracing::warn!("{e:#}: a library loaded where another was unloaded keeps the old one's names and unwind tables"))
        .ok()
}

/// Field offsets of every enabled network tracepoint; `NONE` for the others.
pub(super) fn net_layouts(events: &[NetEvent]) -> Result<[FieldLayout; 6]> {
    let mut layouts = [FieldLayout::NONE; 6];
    for event in events {
        let (category, name) = event.tracepoint();
        let format = Format::read(category, name)?;
        let absent = FieldLayout::ABSENT;
        layouts[event.0] = FieldLayout {
            len: format.optional("len").unwrap_or(absent),
            name: format.optional("name").unwrap_or(absent),
            reason: format.optional("reason").unwrap_or(absent),
            skbaddr: format.optional("skbaddr").unwrap_or(absent),
        };
    }
    Ok(layouts)
}

/// Offsets that attribute transmits to the socket's last sender: sk_buff.sk from kernel BTF
/// and sock:sock_send_length's fields. None when no transmit event is recorded; without BTF
/// or that tracepoint, transmits are attributed to the current task (with a warning).
pub(super) fn transmit_attribution(events: &[NetEvent], btf: &Btf) -> Result<Option<(u32, u32, u32)>> {
    if !events.iter().any(|e| e.kind() == kind::NET_DEV_QUEUE || e.kind() == kind::NET_DEV_XMIT) {
        return Ok(None);
    }
    let offsets = (|| -> Result<(u32, u32, u32)> {
        let skb_sk = btf.member_offset("sk_buff", "sk")?;
        let send = Format::read("sock", "sock_send_length")?;
        Ok((skb_sk, send.offset("sk")?, send.offset("ret")?))
    })();
    match offsets {
        Ok(offsets) => Ok(Some(offsets)),
        Err(e) => {
            tracing::warn!("transmits will be attributed to the current task, not the socket's sender: {e:#}");
            Ok(None)
        }
    }
}
