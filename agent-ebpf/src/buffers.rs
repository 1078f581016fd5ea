//! The two buffer sets the programs aggregate into, and their counters: the programs write
//! to the set `ACTIVE_SET` names while userspace drains and clears the other, so a drain
//! never races the kernel.
use agent_common::{counter, stack_status, SampleKey, SampleValue, UserStack};
use aya_ebpf::{
    bindings::BPF_NOEXIST,
    macros::map,
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap, StackTrace},
    programs::tracing::StackIdContext,
};

// Sizes are defaults; the loader overrides them from the agent's configuration.
const MAX_KEYS: u32 = 10240;
const MAX_STACKS: u32 = 8192;

#[map]
pub static COUNTS_A: PerCpuHashMap<SampleKey, SampleValue> = PerCpuHashMap::with_max_entries(MAX_KEYS, 0);
#[map]
pub static COUNTS_B: PerCpuHashMap<SampleKey, SampleValue> = PerCpuHashMap::with_max_entries(MAX_KEYS, 0);
#[map]
pub static STACKS_A: StackTrace = StackTrace::with_max_entries(MAX_STACKS, 0);
#[map]
pub static STACKS_B: StackTrace = StackTrace::with_max_entries(MAX_STACKS, 0);
#[map]
pub static USER_STACKS_A: HashMap<u32, UserStack> = HashMap::with_max_entries(MAX_STACKS, 0);
#[map]
pub static USER_STACKS_B: HashMap<u32, UserStack> = HashMap::with_max_entries(MAX_STACKS, 0);
/// Both sets' counters, set A's first. One map, not one per set: a lookup in a map the
/// verifier knows at the call site is inlined, while one in a map chosen at run time is an
/// indirect call (a retpoline here), 20-30 ns each.
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(2 * counter::COUNT, 0);
#[map]
pub static ACTIVE_SET: Array<u32> = Array::with_max_entries(1, 0);

pub struct BufferSet {
    pub generation: u32,
    pub index: u8,
    /// Only ever an argument of `bpf_get_stackid`, which takes the map itself: no lookup
    /// call to resolve (see `impl BufferSet`).
    pub stacks: &'static StackTrace,
    /// This set's first counter in COUNTERS.
    pub first_counter: u32,
}

/// The set's hash maps are named at a call site per set, not through a pointer chosen at run
/// time: the verifier then calls each map's own lookup directly, where it would otherwise go
/// through an indirect call (a retpoline here, 20-30 ns).
impl BufferSet {
    #[inline(always)]
    pub fn aggregate(&self, key: &SampleKey) -> Option<*mut SampleValue> {
        if self.index == 0 { COUNTS_A.get_ptr_mut(key) } else { COUNTS_B.get_ptr_mut(key) }
    }

    #[inline(always)]
    pub fn insert_aggregate(&self, key: &SampleKey, value: &SampleValue) -> Result<(), i32> {
        let flags = BPF_NOEXIST as u64;
        if self.index == 0 { COUNTS_A.insert(key, value, flags) } else { COUNTS_B.insert(key, value, flags) }
    }

    #[inline(always)]
    pub fn user_stack(&self, id: u32) -> Option<*const UserStack> {
        if self.index == 0 { USER_STACKS_A.get_ptr(&id) } else { USER_STACKS_B.get_ptr(&id) }
    }

    #[inline(always)]
    pub fn insert_user_stack(&self, id: u32, stack: &UserStack) -> Result<(), i32> {
        let flags = BPF_NOEXIST as u64;
        if self.index == 0 { USER_STACKS_A.insert(&id, stack, flags) } else { USER_STACKS_B.insert(&id, stack, flags) }
    }
}

#[inline(always)]
pub fn active_set() -> BufferSet {
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
pub fn bump(set: &BufferSet, index: u32) {
    add(set, index, 1);
}

#[inline(always)]
pub fn add(set: &BufferSet, index: u32, n: u64) {
    if let Some(slot) = COUNTERS.get_ptr_mut(set.first_counter + index) {
        // Per-CPU slot: no other writer while this program runs on this CPU.
        unsafe { *slot += n };
    }
}

/// Kernel stack id of the current task, or a `stack_status` marker with its loss counted.
/// (User stacks are walked by `walk`.)
#[inline(always)]
pub fn kernel_stack_id<C: StackIdContext>(ctx: &C, set: &BufferSet) -> i32 {
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
