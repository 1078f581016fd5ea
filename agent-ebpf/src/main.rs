//! Ember's kernel side: capture and aggregate only. Names, paths and symbols are userspace
//! work; everything that cannot be kept is counted by reason in the set's counter array.
//!
//! Programs: `sample_cpu` (perf_event, on-CPU), `sched_switch` (off-CPU), one program per
//! network tracepoint, `process_exec` (tells userspace a process has new mappings),
//! `area_placed` (the same, when a process maps something where its code was) and
//! `process_exit` (forgets exited threads and processes).
#![no_std]
#![no_main]
// Inline assembly, for two instructions the compiler must not rewrite (`walk::search`).
#![feature(asm_experimental_arch)]

mod walk;

use agent_common::{
    attribution, block_state, counter, kind, run, stack_status, AreaLayout, FieldLayout, OffCpuStart, ProcessEvent, Rates, SampleKey,
    SampleValue, SocketOwner, SwitchLayout, TaskLayout, UserStack, COMM_LEN, IFNAMSIZ,
};
use aya_ebpf::{
    bindings::{BPF_EXIST, BPF_NOEXIST},
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_prandom_u32,
        bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes, generated::bpf_get_current_task_btf,
    },
    macros::{map, perf_event, tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf, StackTrace},
    programs::{tracing::StackIdContext, PerfEventContext, TracePointContext},
    EbpfContext,
};

// Sizes are defaults; the loader overrides them from the agent's configuration.
const MAX_KEYS: u32 = 10240;
const MAX_STACKS: u32 = 8192;
const NET_KINDS: usize = kind::COUNT - kind::FIRST_NET as usize;

// Two buffer sets: the programs write to the one ACTIVE_SET names while userspace drains and
// clears the other, so a drain never races the kernel.
#[map]
static COUNTS_A: PerCpuHashMap<SampleKey, SampleValue> = PerCpuHashMap::with_max_entries(MAX_KEYS, 0);
#[map]
static COUNTS_B: PerCpuHashMap<SampleKey, SampleValue> = PerCpuHashMap::with_max_entries(MAX_KEYS, 0);
#[map]
static STACKS_A: StackTrace = StackTrace::with_max_entries(MAX_STACKS, 0);
#[map]
static STACKS_B: StackTrace = StackTrace::with_max_entries(MAX_STACKS, 0);
#[map]
static USER_STACKS_A: HashMap<u32, UserStack> = HashMap::with_max_entries(MAX_STACKS, 0);
#[map]
static USER_STACKS_B: HashMap<u32, UserStack> = HashMap::with_max_entries(MAX_STACKS, 0);
/// Both sets' counters, set A's first. One map, not one per set: a lookup in a map the
/// verifier knows at the call site is inlined, while one in a map chosen at run time is an
/// indirect call (a retpoline here), 20-30 ns each.
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(2 * counter::COUNT, 0);
#[map]
static ACTIVE_SET: Array<u32> = Array::with_max_entries(1, 0);
/// Off-CPU and network sampling ratios, set by userspace (the overhead governor) at any time.
#[map]
static RATES: Array<Rates> = Array::with_max_entries(1, 0);

/// Processes userspace has been told about, and when (`told`); a miss sends a `ProcessEvent`.
#[map]
static KNOWN_TGIDS: LruHashMap<u32, u8> = LruHashMap::with_max_entries(16384, 0);
#[map]
static PROCESS_EVENTS: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);
/// Tgids to sample when FILTER_TGIDS is set.
#[map]
static TGID_FILTER: HashMap<u32, u8> = HashMap::with_max_entries(1024, 0);
/// Off-CPU: per thread that has blocked, where and when it last blocked (start 0 once it
/// woke). Not an LRU: a full table must refuse (and count) a new thread's block, never
/// silently evict one being measured. A thread that exits leaves it (`process_exit`), so
/// entries cannot leak.
#[map]
static OFF_CPU_START: HashMap<u32, OffCpuStart> = HashMap::with_max_entries(65536, 0);

/// Socket (struct sock address) to its last sender and send stacks.
#[map]
static SOCK_OWNER: LruHashMap<u64, SocketOwner> = LruHashMap::with_max_entries(16384, 0);

// Load-time configuration (rewritten by the loader before the programs are verified).
#[no_mangle]
static FILTER_TGIDS: u8 = 0;
#[no_mangle]
static FILTER_CGROUP: u64 = 0;
/// Where sched_process_fork's record holds `child_pid`, and sched_process_exit's
/// `group_dead` (`FieldLayout::ABSENT` if it has none), from their format files.
#[no_mangle]
static FORK_CHILD_PID: u32 = 0;
#[no_mangle]
static EXIT_GROUP_DEAD: u32 = FieldLayout::ABSENT;
#[no_mangle]
static SWITCH_LAYOUT: SwitchLayout = SwitchLayout { prev_pid: 0, prev_state: 0, prev_state_size: 0, next_pid: 0 };
#[no_mangle]
static OFF_CPU_STATES: u32 = block_state::PREEMPTED | block_state::SLEEPING | block_state::UNINTERRUPTIBLE;
#[no_mangle]
static OFF_CPU_MIN_NS: u64 = 0;
#[no_mangle]
static OFF_CPU_MAX_NS: u64 = u64::MAX;
/// Non-zero: each program counts its runs and their time in the set's `counter::RUN_NS` counters.
#[no_mangle]
static MEASURE_RUN_TIME: u8 = 0;
#[no_mangle]
static NET_LAYOUTS: [FieldLayout; NET_KINDS] = [FieldLayout::NONE; NET_KINDS];
#[no_mangle]
static SKB_SK_OFFSET: u32 = FieldLayout::ABSENT;
#[no_mangle]
static SEND_SK_OFFSET: u32 = 0;
#[no_mangle]
static SEND_RET_OFFSET: u32 = 0;
#[no_mangle]
static TASK_LAYOUT: TaskLayout = TaskLayout { group_leader: 0, start_boottime: 0, self_exec_id: 0, comm: 0, mm: 0, start_stack: 0 };
#[no_mangle]
static AREA_LAYOUT: AreaLayout = AreaLayout { addr: 0, length: 0 };

fn config<T: Copy>(global: &T) -> T {
    // Volatile: the value is patched into the object after compilation.
    unsafe { core::ptr::read_volatile(global) }
}

/// Whether to record this event under a 1-in-`ratio` sampling: the recorded ones count
/// `ratio` times. Ratio 0 (never set) counts as 1.
#[inline(always)]
fn sampled_out(ratio: u32) -> bool {
    ratio > 1 && unsafe { bpf_get_prandom_u32() } % ratio != 0
}

#[inline(always)]
fn rates() -> Rates {
    RATES.get(0).copied().unwrap_or(Rates { off_cpu_ratio: 1, net_ratio: 1 })
}

struct BufferSet {
    generation: u32,
    index: u8,
    /// Only ever an argument of `bpf_get_stackid`, which takes the map itself: no lookup
    /// call to resolve (see `impl BufferSet`).
    stacks: &'static StackTrace,
    /// This set's first counter in COUNTERS.
    first_counter: u32,
}

/// The set's hash maps are named at a call site per set, not through a pointer chosen at run
/// time: the verifier then calls each map's own lookup directly, where it would otherwise go
/// through an indirect call (a retpoline here, 20-30 ns).
impl BufferSet {
    #[inline(always)]
    fn aggregate(&self, key: &SampleKey) -> Option<*mut SampleValue> {
        if self.index == 0 { COUNTS_A.get_ptr_mut(key) } else { COUNTS_B.get_ptr_mut(key) }
    }

    #[inline(always)]
    fn insert_aggregate(&self, key: &SampleKey, value: &SampleValue) -> Result<(), i32> {
        let flags = BPF_NOEXIST as u64;
        if self.index == 0 { COUNTS_A.insert(key, value, flags) } else { COUNTS_B.insert(key, value, flags) }
    }

    #[inline(always)]
    fn user_stack(&self, id: u32) -> Option<*const UserStack> {
        if self.index == 0 { USER_STACKS_A.get_ptr(&id) } else { USER_STACKS_B.get_ptr(&id) }
    }

    #[inline(always)]
    fn insert_user_stack(&self, id: u32, stack: &UserStack) -> Result<(), i32> {
        let flags = BPF_NOEXIST as u64;
        if self.index == 0 { USER_STACKS_A.insert(&id, stack, flags) } else { USER_STACKS_B.insert(&id, stack, flags) }
    }
}

#[inline(always)]
fn active_set() -> BufferSet {
    let generation = ACTIVE_SET.get(0).copied().unwrap_or(0);
    if generation & 1 == 1 {
        BufferSet {
            generation,
            index: 1,
            stacks: &STACKS_B,
            first_counter: counter::COUNT,
        }
    } else {
        BufferSet {
            generation,
            index: 0,
            stacks: &STACKS_A,
            first_counter: 0,
        }
    }
}

#[inline(always)]
fn bump(set: &BufferSet, index: u32) {
    add(set, index, 1);
}

#[inline(always)]
fn add(set: &BufferSet, index: u32, n: u64) {
    if let Some(slot) = COUNTERS.get_ptr_mut(set.first_counter + index) {
        // Per-CPU slot: no other writer while this program runs on this CPU.
        unsafe { *slot += n };
    }
}

/// Run-time measurement (`MEASURE_RUN_TIME`): the start of a run, or 0 when not measuring.
#[inline(always)]
fn run_started() -> u64 {
    if config(&MEASURE_RUN_TIME) != 0 {
        unsafe { bpf_ktime_get_ns() }
    } else {
        0
    }
}

/// Counts a run of `source` and the time since `start` (from `run_started`), apart as it
/// recorded something or not.
#[inline(always)]
fn run_ended(set: &BufferSet, source: u32, start: u64, recorded: bool) {
    if start != 0 {
        let slot = if recorded { run::RECORDED_NS } else { run::SKIPPED_NS };
        let index = counter::RUN_NS + run::SLOTS * source + slot;
        add(set, index, unsafe { bpf_ktime_get_ns() }.saturating_sub(start));
        // The run count sits next to its time.
        bump(set, index + 1);
    }
}

/// Kernel stack id of the current task, or a `stack_status` marker with its loss counted.
/// (User stacks are walked by `walk`.)
#[inline(always)]
fn kernel_stack_id<C: StackIdContext>(ctx: &C, set: &BufferSet) -> i32 {
    match ctx.get_stackid(set.stacks, 0) {
        Ok(id) => id as i32,
        // -EFAULT: no kernel stack (a user-mode sample).
        Err(-14) => stack_status::NONE,
        Err(-17) => {
            bump(set, counter::KERNEL_STACK_COLLISION);
            stack_status::COLLISION
        }
        Err(_) => {
            bump(set, counter::KERNEL_STACK_ERROR);
            stack_status::ERROR
        }
    }
}

#[inline(always)]
fn passes_filters(tgid: u32) -> bool {
    if config(&FILTER_TGIDS) != 0 && unsafe { TGID_FILTER.get(&tgid) }.is_none() {
        return false;
    }
    let cgroup = config(&FILTER_CGROUP);
    cgroup == 0 || cgroup == unsafe { bpf_get_current_cgroup_id() }
}

/// What userspace has been told of a process (the values of `KNOWN_TGIDS`).
mod told {
    /// Announced at exec, perhaps before the loader mapped its libraries.
    pub const AT_EXEC: u8 = 1;
    /// Announced at its first event: its mappings are read while it runs.
    pub const RUNNING: u8 = 2;
    /// Its last thread exited. Samples the thread still takes on its way out (the tracepoint
    /// fires before its memory is torn down) must not announce it again: userspace would find
    /// no mappings, keep the dead process's, and name the next process with its pid from them.
    /// A fork clears it for the pid it hands out.
    pub const EXITED: u8 = u8::MAX;
}

/// Tells userspace about a process at `stage` (`told`), unless it was told already. If the
/// ring buffer is full, forget the process again so that the next event retries.
#[inline(always)]
fn announce_process(tgid: u32, tag: u16, stage: u8, set: &BufferSet) {
    if tgid == 0 {
        return;
    }
    let flags = match unsafe { KNOWN_TGIDS.get(&tgid) } {
        Some(&known) if known >= stage => return,
        Some(_) => BPF_EXIST,
        None => BPF_NOEXIST,
    };
    if KNOWN_TGIDS.insert(&tgid, &stage, flags as u64).is_err() {
        return; // another CPU announced it first
    }
    // The start time can only be read from the process itself (an event may be attributed to
    // another task: a socket's last sender).
    let (current_tag, start) = current_life();
    let own = (bpf_get_current_pid_tgid() >> 32) as u32 == tgid && current_tag == tag;
    let (start_ns, start_stack) = if own { (start, current_stack_start()) } else { (0, 0) };
    if PROCESS_EVENTS.output::<ProcessEvent>(&ProcessEvent { tgid, tag, _pad: 0, pc: 0, start_ns, start_stack }, 0).is_err() {
        let _ = KNOWN_TGIDS.remove(&tgid);
        bump(set, counter::PROCESS_EVENT_LOST);
    }
}

/// Megabytes of a process's address space (tgid << 32 | pc >> 20) where walks met code
/// outside the mappings userspace gave the walker, and the interval (set generation, low half) and
/// life (`SampleKey::process_tag`, high half) in which userspace was last told.
#[map]
static UNMAPPED_TOLD: LruHashMap<u64, u64> = LruHashMap::with_max_entries(4096, 0);

/// A walk of `tgid`'s stack, in its life `tag`, went through or ended at `pc`, outside
/// every mapping userspace gave the walker: a library loaded since they were read (dlopen), JIT code, or a
/// wrong return address. Tells userspace, which reads the mappings again if none it knows
/// holds `pc`: once per interval, life and megabyte, so that wrong return addresses cost
/// little, while a new library (new addresses) is told at once, and so is code a new life
/// maps where its earlier one had code (an exec'd runtime's JIT at a fixed address).
#[inline(always)]
fn announce_unmapped(tgid: u32, tag: u16, pc: u64, set: &BufferSet) {
    // Not code: a wrong return address.
    if !walk::in_user_space(pc) {
        return;
    }
    let region = ((tgid as u64) << 32) | (pc >> 20);
    let told = set.generation as u64 | (tag as u64) << 32;
    if unsafe { UNMAPPED_TOLD.get(&region) } == Some(&told) {
        return;
    }
    let _ = UNMAPPED_TOLD.insert(&region, &told, 0);
    // The walk was the current task's. (Its life is the one its samples are keyed by.)
    let start_ns = current_life().1;
    let start_stack = current_stack_start();
    if PROCESS_EVENTS.output::<ProcessEvent>(&ProcessEvent { tgid, tag, _pad: 0, pc, start_ns, start_stack }, 0).is_err() {
        bump(set, counter::PROCESS_EVENT_LOST);
    }
}

/// Adds one event (or `count` sampled ones) to the key's aggregate.
#[inline(always)]
fn record(set: &BufferSet, key: &SampleKey, count: u64, total: u64) {
    if !add_to_existing(set, key, count, total) {
        record_new(set, key, count, total);
    }
}

/// Adds to the key's aggregate if the key has one in this interval; whether it had.
#[inline(always)]
fn add_to_existing(set: &BufferSet, key: &SampleKey, count: u64, total: u64) -> bool {
    let Some(value) = set.aggregate(key) else { return false };
    unsafe {
        (*value).count += count;
        (*value).total += total;
    }
    true
}

/// The first event of the key in this interval (as far as this CPU saw).
#[inline(always)]
fn record_new(set: &BufferSet, key: &SampleKey, count: u64, total: u64) {
    // Only here can the process be new to userspace, so the hot path (existing key) skips
    // the lookup of known processes.
    announce_process(key.tgid, key.process_tag, told::RUNNING, set);
    if set.insert_aggregate(key, &SampleValue { count, total }).is_err() {
        // Either the map is full, or another CPU inserted the key first: retry once.
        if !add_to_existing(set, key, count, total) {
            bump(set, counter::MAP_FULL);
        }
    }
}

/// Per tgid, how many times the process mapped something where its code was since its exec
/// (`area_placed`): each time starts a life of its own. Few processes do. (Preallocated, as
/// kernels before 6.1 require of maps that perf_event programs read.)
#[map]
static CODE_REPLACEMENTS: HashMap<u32, u16> = HashMap::with_max_entries(4096, 0);

/// Which life of its pid the current process is in (`SampleKey::process_tag`), and when it
/// started (ns since boot).
#[inline(always)]
fn current_life() -> (u16, u64) {
    let layout = config(&TASK_LAYOUT);
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let replaced = unsafe { CODE_REPLACEMENTS.get(&tgid) }.copied().unwrap_or(0);
    // Typed (BTF) pointers: plain loads, which the verifier checks against the kernel's
    // types (the offsets are constants to it), with no helper call.
    unsafe {
        let task = bpf_get_current_task_btf() as *const u8;
        let leader = *(task.add(layout.group_leader as usize) as *const *const u8);
        let start = *(leader.add(layout.start_boottime as usize) as *const u64);
        let execs = *(task.add(layout.self_exec_id as usize) as *const u64);
        (process_tag(start, execs, replaced), start)
    }
}

/// Where the current process's stack starts (0 for a kernel thread, which has no memory of
/// its own: the load of a null typed pointer reads 0).
#[inline(always)]
fn current_stack_start() -> u64 {
    let layout = config(&TASK_LAYOUT);
    unsafe {
        let task = bpf_get_current_task_btf() as *const u8;
        let mm = *(task.add(layout.mm as usize) as *const *const u8);
        *(mm.add(layout.start_stack as usize) as *const u64)
    }
}

/// The 16 bits that tell a process's lives apart: its start time mixed, and its count of
/// execs and of code replacements. Each exec adds 1 and each replacement 257: any 256 lives
/// in a row differ. A new process with a reused pid differs but for 1 in 65,536.
#[inline(always)]
fn process_tag(start_ns: u64, exec_id: u64, replaced: u16) -> u16 {
    ((start_ns.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 48) as u16) ^ (exec_id as u16).wrapping_add(replaced.wrapping_mul(257))
}

/// What the key says of the thread besides its ids, as last read on this CPU.
#[repr(C)]
#[derive(Clone, Copy)]
struct ThreadFields {
    /// Which thread: its ids, its start time (for a later thread with its pid) and its exec
    /// count (an exec starts a new life).
    pid_tgid: u64,
    start_ns: u64,
    exec_id: u64,
    /// `FIELDS_EPOCH` when the cgroup and the life were read.
    epoch: u64,
    cgroup_id: u64,
    process_tag: u16,
    _pad: [u16; 3],
}

/// Threads whose fields each CPU keeps, by pid: the two ends of a pipe, taking turns on a
/// CPU, keep theirs.
const THREAD_SLOTS: usize = 8;

/// Per CPU, the fields of the last threads seen here. Read from the task, they cost about a
/// twentieth of a sample: the cgroup's id is four pointers away and the life's start time
/// two, and after the workload had the CPU to itself each is a cold line.
#[map]
static THREAD_FIELDS: PerCpuArray<[ThreadFields; THREAD_SLOTS]> = PerCpuArray::with_max_entries(1, 0);

/// Counts moves of tasks between cgroups (`cgroup_moved`) and code replacements
/// (`area_placed`): kept fields of an earlier count are read again.
#[map]
static FIELDS_EPOCH: Array<u64> = Array::with_max_entries(1, 0);

/// Some thread's kept fields may no longer hold.
#[inline(always)]
fn bump_fields_epoch() {
    if let Some(epoch) = FIELDS_EPOCH.get_ptr_mut(0) {
        // An atomic add (core has no atomic read-modify-write for BPF): two moves at once on
        // two CPUs must count twice.
        unsafe { core::arch::asm!("lock *(u64 *)({p} + 0) += {one}", p = in(reg) epoch, one = in(reg) 1u64, options(nostack)) };
    }
}

#[inline(always)]
fn thread_fields(pid_tgid: u64) -> ThreadFields {
    // Read before the cgroup: a move after this read counts after it.
    let epoch = FIELDS_EPOCH.get_ptr(0).map_or(0, |epoch| unsafe { core::ptr::read_volatile(epoch) });
    let layout = config(&TASK_LAYOUT);
    let (start_ns, exec_id) = unsafe {
        let task = bpf_get_current_task_btf() as *const u8;
        (*(task.add(layout.start_boottime as usize) as *const u64), *(task.add(layout.self_exec_id as usize) as *const u64))
    };
    let read = || ThreadFields {
        pid_tgid,
        start_ns,
        exec_id,
        epoch,
        process_tag: current_life().0,
        _pad: [0; 3],
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
    };
    let Some(kept) = THREAD_FIELDS.get_ptr_mut(0).and_then(|slots| unsafe { (*slots).get_mut(pid_tgid as usize & (THREAD_SLOTS - 1)) })
    else {
        return read();
    };
    if kept.pid_tgid != pid_tgid || kept.start_ns != start_ns || kept.exec_id != exec_id || kept.epoch != epoch {
        *kept = read();
    }
    // Loaded from the map either way: the verifier then follows one path on from here (with
    // the fields just read on the stack, it followed both, twice the instructions).
    unsafe { core::ptr::read_volatile(kept) }
}

/// The current task's name: loaded from the task (the verifier knows its type), which costs
/// less than the helper's copy.
#[inline(always)]
fn current_comm() -> [u8; COMM_LEN] {
    unsafe {
        let comm = (bpf_get_current_task_btf() as *const u8).add(config(&TASK_LAYOUT).comm as usize) as *const u64;
        let words = [*comm, *comm.add(1)];
        core::mem::transmute::<[u64; 2], [u8; COMM_LEN]>(words)
    }
}

/// A task moved to another cgroup: threads' kept cgroups are read again.
#[tracepoint]
pub fn cgroup_moved(_ctx: TracePointContext) -> u32 {
    bump_fields_epoch();
    0
}

/// Key of an event on the current task (stacks filled in by the caller).
#[inline(always)]
fn current_key(event_kind: u8, set: &BufferSet) -> SampleKey {
    let pid_tgid = bpf_get_current_pid_tgid();
    let thread = thread_fields(pid_tgid);
    SampleKey {
        tgid: (pid_tgid >> 32) as u32,
        pid: pid_tgid as u32,
        cgroup_id: thread.cgroup_id,
        user_stack_id: stack_status::NONE,
        kernel_stack_id: stack_status::NONE,
        comm: current_comm(),
        device: [0; IFNAMSIZ],
        kind: event_kind,
        stack_set: set.index,
        process_tag: thread.process_tag,
        aux: 0,
        user_stack_check: 0,
    }
}

#[perf_event]
pub fn sample_cpu(ctx: PerfEventContext) -> u32 {
    let start = run_started();
    let set = active_set();
    let recorded = sample(&ctx, &set);
    run_ended(&set, run::ON_CPU, start, recorded);
    0
}

#[inline(always)]
fn sample(ctx: &PerfEventContext, set: &BufferSet) -> bool {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, pid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if pid == 0 {
        bump(set, counter::IDLE);
        return false;
    }
    if !passes_filters(tgid) {
        bump(set, counter::FILTERED);
        return false;
    }
    bump(set, counter::SAMPLES);
    let mut key = current_key(kind::ON_CPU, set);
    // A sample taken in user mode has the user registers at hand, and no kernel stack (the
    // kernel would walk nothing and return -EFAULT): skip that helper call.
    let regs = unsafe { &(*ctx.ctx).regs };
    let user_mode = walk::in_user_mode(regs);
    let walked = walk::walk(set, tgid, key.process_tag, user_mode.then_some(regs));
    match walked {
        Ok(walked) => walked.name_in(&mut key),
        Err(status) => key.user_stack_id = status,
    }
    if !user_mode {
        key.kernel_stack_id = kernel_stack_id(ctx, set);
    }
    // The period is the time the sample stands for (ns, for the clock events): on-CPU time
    // stays exact whatever frequency the governor sets.
    let period = unsafe { (*ctx.ctx).sample_period };
    // Most samples repeat a key of this interval, whose user stack is stored already (the
    // key names it by id and check): they are one map update.
    if add_to_existing(set, &key, 1, period) {
        return true;
    }
    if let Ok(walked) = walked {
        walk::store(set, walked, &mut key);
    }
    record_new(set, &key, 1, period);
    true
}

/// Reads a field of the tracepoint record at an offset fixed at load time.
#[inline(always)]
fn field<T: Copy + Default>(ctx: &TracePointContext, offset: u32) -> T {
    unsafe { ctx.read_at::<T>(offset as usize) }.unwrap_or_default()
}

/// Which `block_state` a sched_switch prev_state means (0: not tracked, e.g. exiting,
/// stopped, idle kernel threads). Preemption is reported as TASK_RUNNING (0) or with the
/// TASK_REPORT_MAX bit, above every state bit.
#[inline(always)]
fn block_class(prev_state: u64) -> u32 {
    match prev_state {
        0 => block_state::PREEMPTED,
        1 => block_state::SLEEPING,
        2 => block_state::UNINTERRUPTIBLE,
        s if s >= 0x100 => block_state::PREEMPTED,
        _ => 0,
    }
}

/// Off-CPU: at switch-out, remember where the thread blocked (its stacks, captured now, in
/// its own context); at switch-in, add the time it was away to that place.
#[tracepoint]
pub fn sched_switch(ctx: TracePointContext) -> u32 {
    let layout = config(&SWITCH_LAYOUT);
    let now = unsafe { bpf_ktime_get_ns() };
    let set = active_set();
    let prev_pid: u32 = field(&ctx, layout.prev_pid);
    let next_pid: u32 = field(&ctx, layout.next_pid);
    let mut recorded = false;
    if prev_pid != 0 {
        let state: u64 = if layout.prev_state_size == 8 {
            field(&ctx, layout.prev_state)
        } else {
            field::<u32>(&ctx, layout.prev_state) as u64
        };
        recorded = switch_out(&ctx, &set, state, now);
    }
    if next_pid != 0 {
        recorded |= switch_in(&set, next_pid, now);
    }
    // `now` is this run's start.
    if config(&MEASURE_RUN_TIME) != 0 {
        run_ended(&set, run::OFF_CPU, now, recorded);
    }
    0
}

#[inline(always)]
/// Returns whether it captured the block's stacks.
fn switch_out(ctx: &TracePointContext, set: &BufferSet, state: u64, now: u64) -> bool {
    let class = block_class(state);
    if class & config(&OFF_CPU_STATES) == 0 {
        return false;
    }
    // Sampled out first: on a switch-heavy host most switches should cost next to nothing.
    let ratio = rates().off_cpu_ratio.max(1);
    if sampled_out(ratio) {
        return false;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !passes_filters(tgid) {
        return false;
    }
    let mut key = current_key(kind::OFF_CPU, set);
    key.aux = class;
    let last = OFF_CPU_START.get_ptr_mut(&key.pid);
    match walk::walk(set, tgid, key.process_tag, None) {
        // Most blocks repeat the thread's last one: if that was in this interval, its user
        // stack is stored already.
        Ok(walked) if last.is_some_and(|last| unsafe { (*last).generation == set.generation && walked.is_named_in(&(*last).key) }) => {
            walked.name_in(&mut key)
        }
        Ok(walked) => walk::store(set, walked, &mut key),
        Err(status) => key.user_stack_id = status,
    }
    key.kernel_stack_id = kernel_stack_id(ctx, set);
    let start = OffCpuStart { key, start_ns: now, weight: ratio, generation: set.generation };
    // A thread that blocked before keeps its entry, emptied when it woke: it is rewritten in
    // place, which costs less than the map's delete at switch-in and insert here. (Only this
    // thread's exit deletes it.)
    match last {
        Some(entry) => unsafe { *entry = start },
        None => {
            if OFF_CPU_START.insert(&key.pid, &start, BPF_NOEXIST as u64).is_err() {
                bump(set, counter::OFF_CPU_TABLE_FULL);
            }
        }
    }
    true
}

/// Returns whether it found (and counted) a block of this thread.
#[inline(always)]
fn switch_in(set: &BufferSet, pid: u32, now: u64) -> bool {
    let Some(entry) = OFF_CPU_START.get_ptr_mut(&pid) else { return false };
    let start = unsafe { *entry };
    if start.start_ns == 0 {
        return false; // not blocked since it last woke
    }
    unsafe { (*entry).start_ns = 0 };
    let blocked = now.saturating_sub(start.start_ns);
    if blocked < config(&OFF_CPU_MIN_NS) || blocked > config(&OFF_CPU_MAX_NS) {
        bump(set, counter::OFF_CPU_OUT_OF_RANGE);
        return true;
    }
    let weight = start.weight.max(1) as u64;
    bump(set, counter::OFF_CPU_BLOCKS);
    record(set, &start.key, weight, blocked * weight);
    true
}

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

/// A thread exits: its off-CPU entry goes. When the process's last thread exits (the
/// record's `group_dead`, since 6.16, where the tracepoint fires before the memory is torn
/// down), its mappings are forgotten and it is marked exited (`told::EXITED`). Without
/// `group_dead`, the process is forgotten at its main thread's exit, as before; threads that
/// run on announce it again.
#[tracepoint]
pub fn process_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, pid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    let _ = OFF_CPU_START.remove(&pid);
    let group_dead = config(&EXIT_GROUP_DEAD);
    if group_dead != FieldLayout::ABSENT {
        if field::<u8>(&ctx, group_dead) != 0 {
            let _ = KNOWN_TGIDS.insert(&tgid, &told::EXITED, 0);
            forget_code(tgid);
        }
    } else if tgid == pid {
        forget(tgid);
    }
    0
}

/// Neither the process nor its mappings are known any more: its next event announces it.
#[inline(always)]
fn forget(tgid: u32) {
    let _ = KNOWN_TGIDS.remove(&tgid);
    forget_code(tgid);
}

/// The process's code is not what it was: its mappings go, and so does its count of code
/// replacements (its lives from here on are told apart by its start time and exec count).
#[inline(always)]
fn forget_code(tgid: u32) {
    walk::forget_process(tgid);
    let _ = CODE_REPLACEMENTS.remove(&tgid);
}

/// A new process or thread: its pid may have been a dead process's, whose mark and
/// mappings go, so that the new one's first event announces it (and it is not symbolized
/// with the dead one's mappings).
#[tracepoint]
pub fn process_fork(ctx: TracePointContext) -> u32 {
    forget(field(&ctx, config(&FORK_CHILD_PID)));
    0
}

/// After exec a process has new mappings: forget its old ones, and announce it at once, so
/// that the tables of its binary are loaded before its first sample: on a busy host a
/// short-lived process may be sampled once or twice in all, and a walk made before its tables
/// are loaded stops at the first frame without a frame pointer. Its first event announces it
/// again, to read the libraries the loader has mapped since.
#[tracepoint]
pub fn process_exec(ctx: TracePointContext) -> u32 {
    let tgid = ctx.tgid();
    forget(tgid);
    if passes_filters(tgid) {
        announce_process(tgid, current_life().0, told::AT_EXEC, &active_set());
    }
    0
}

/// The kernel found room for a new mapping (mmap:vm_unmapped_area). Room over code that the
/// walks know of the process means that code was unmapped and something else goes there
/// (dlclose, then dlopen of another library): the old tables and names do not hold for it.
/// The process starts a new life, so that its samples from here on are told apart from those
/// its old mappings name; the walks forget its mappings (frame pointers, marked, until they
/// are loaded again); and it is announced, so that userspace reads them again. The mapping
/// is not made yet: userspace's read of the maps waits for it.
#[tracepoint]
pub fn area_placed(ctx: TracePointContext) -> u32 {
    let tgid = ctx.tgid();
    let area = || {
        let layout = config(&AREA_LAYOUT);
        let (start, length): (u64, u64) = (field(&ctx, layout.addr), field(&ctx, layout.length));
        // A failure is an error number, which is no page's address: an empty range.
        (start, if start & 0xfff == 0 { start.saturating_add(length) } else { start })
    };
    if !walk::maps_code_in(tgid, area) {
        return 0;
    }
    // Not `forget`, which drops the count: the new one is in place before the mappings go.
    let replaced = unsafe { CODE_REPLACEMENTS.get(&tgid) }.copied().unwrap_or(0).wrapping_add(1);
    let _ = CODE_REPLACEMENTS.insert(&tgid, &replaced, 0);
    bump_fields_epoch();
    let _ = KNOWN_TGIDS.remove(&tgid);
    walk::forget_process(tgid);
    let set = active_set();
    bump(&set, counter::CODE_REPLACED);
    if passes_filters(tgid) {
        announce_process(tgid, current_life().0, told::RUNNING, &set);
    }
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
