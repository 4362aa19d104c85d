//! Fuzz target: the whole receive path of an `RdmaNode` (see `src/rdma_node.rs` for the input
//! format and the invariants it checks).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| portico_fuzz::rdma_node::run(data));
