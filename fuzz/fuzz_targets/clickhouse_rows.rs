#![no_main]
libfuzzer_sys::fuzz_target!(init: ember_fuzz::catch_stack_overflows(), |data: &[u8]| ember_collector::fuzz::clickhouse_rows(data));
