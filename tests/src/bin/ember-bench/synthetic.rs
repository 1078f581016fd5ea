//! Synthetic profiles with the stack diversity of a busy service, deterministic from run to
//! run: each host draws its samples from 3000 stacks 6 to 28 frames deep through a call graph
//! of 2000 functions. The ui and fleet benchmarks fill collectors with them.
use std::collections::HashMap;

use ember_proto::pprof::{self, Function, Line, Location, Mapping, Sample, ValueType};

const FUNCTIONS: u64 = 2000;
const STACKS_PER_HOST: usize = 3000;
const SAMPLES_PER_PROFILE: usize = 300;

/// A deterministic xorshift generator: the same profiles on every run.
pub struct Random(pub u64);

impl Random {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Host `host`'s stacks, root first, as function ids (1..=FUNCTIONS; 1 is main). Each
/// function calls one of 8 others, so paths diverge as they deepen.
pub fn stacks(host: usize) -> Vec<Vec<u64>> {
    let mut random = Random(0x9e37_79b9_7f4a_7c15 ^ (host as u64 + 1) * 0x1000_0001);
    (0..STACKS_PER_HOST)
        .map(|_| {
            let depth = 6 + random.next() % 23;
            let mut stack = vec![1u64];
            for _ in 1..depth {
                let caller = *stack.last().unwrap();
                stack.push(2 + (caller * 31 + random.next() % 8 * 7919) % (FUNCTIONS - 1));
            }
            stack
        })
        .collect()
}

/// One 10 s profile of a host: SAMPLES_PER_PROFILE draws from its stacks, the first ones far
/// more often (a square skew), each 1 to 5 samples; like the agent's, it holds only the
/// functions its samples use.
pub fn profile(stacks: &[Vec<u64>], random: &mut Random) -> pprof::Profile {
    let mut samples: HashMap<usize, i64> = HashMap::new();
    for _ in 0..SAMPLES_PER_PROFILE {
        let r = (random.next() % 1000) as f64 / 1000.0;
        *samples.entry((r * r * stacks.len() as f64) as usize).or_default() += 1 + (random.next() % 5) as i64;
    }
    let mut used: Vec<u64> = samples.keys().flat_map(|&s| stacks[s].iter().copied()).collect();
    used.sort_unstable();
    used.dedup();
    let mut strings = vec![String::new(), "samples".into(), "count".into(), "/usr/bin/service".into(), "/usr/lib/libc.so.6".into()];
    let functions = used
        .iter()
        .map(|&id| {
            strings.push(if id == 1 { "main".into() } else { format!("service::module_{}::function_{id}", id % 40) });
            Function { id, name: strings.len() as i64 - 1, ..Default::default() }
        })
        .collect();
    let locations = used
        .iter()
        .map(|&id| Location { id, mapping_id: 1 + u64::from(id % 10 == 0), address: id * 16, line: vec![Line { function_id: id, line: 0, column: 0 }], ..Default::default() })
        .collect();
    pprof::Profile {
        sample_type: vec![ValueType { r#type: 1, unit: 2 }],
        sample: samples
            .into_iter()
            .map(|(stack, value)| Sample { location_id: stacks[stack].iter().rev().copied().collect(), value: vec![value], label: vec![] })
            .collect(),
        mapping: vec![Mapping { id: 1, filename: 3, ..Default::default() }, Mapping { id: 2, filename: 4, ..Default::default() }],
        location: locations,
        function: functions,
        string_table: strings,
        ..Default::default()
    }
}
