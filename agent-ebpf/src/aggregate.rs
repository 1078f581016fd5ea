//! Adding an event to its key's aggregate in the active set.
use agent_common::{counter, SampleKey, SampleValue};

use crate::{
    announce::{announce_process, told},
    buffers::{bump, BufferSet},
};

/// Adds one event (or `count` sampled ones) to the key's aggregate.
#[inline(always)]
pub fn record(set: &BufferSet, key: &SampleKey, count: u64, total: u64) {
    if !add_to_existing(set, key, count, total) {
        record_new(set, key, count, total);
    }
}

/// Adds to the key's aggregate if the key has one in this interval; whether it had.
#[inline(always)]
pub fn add_to_existing(set: &BufferSet, key: &SampleKey, count: u64, total: u64) -> bool {
    let Some(value) = set.aggregate(key) else { return false };
    unsafe {
        (*value).count += count;
        (*value).total += total;
    }
    true
}

/// The first event of the key in this interval (as far as this CPU saw).
#[inline(always)]
pub fn record_new(set: &BufferSet, key: &SampleKey, count: u64, total: u64) {
    // Only here can the process be new to userspace, so the hot path (existing key) skips
    // the lookup of known processes.
    announce_process(key.tgid, key.process_tag, told::RUNNING, false, set);
    if set.insert_aggregate(key, &SampleValue { count, total }).is_err() {
        // Either the map is full, or another CPU inserted the key first: retry once.
        if !add_to_existing(set, key, count, total) {
            bump(set, counter::MAP_FULL);
        }
    }
}
