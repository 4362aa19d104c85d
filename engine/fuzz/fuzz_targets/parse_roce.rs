//! Fuzz target: the RoCEv2 wire parsers (see `src/parse_roce.rs` for what it checks).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| portico_fuzz::parse_roce::run(data));
