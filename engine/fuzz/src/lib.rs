//! Fuzz harnesses for Portico, as plain functions: the fuzz targets in `fuzz_targets/` call
//! them under libFuzzer, `engine/node/tests/fuzz_regressions.rs` includes the same files by path
//! and replays the checked-in corpus and every regression input under `cargo test`, and
//! `examples/seed_corpus.rs` builds inputs for them from a capture. `docs/fuzzing.md` says
//! how to run them.

pub mod parse_roce;
pub mod rdma_node;
