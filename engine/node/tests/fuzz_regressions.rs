//! Replays the fuzz targets' inputs without libFuzzer: every regression input
//! (`engine/fuzz/regressions/<target>/`: inputs that once made a target fail) and the seed
//! corpus (`engine/fuzz/corpus/<target>/`) go through the same harness functions the fuzz
//! targets call, included here by path, so a fixed crash stays fixed under `cargo test`.
//! `docs/fuzzing.md` describes the harnesses and how the fuzzing is run. It is a test of the
//! pure crates, like the harnesses: it runs without DPDK.

// The harnesses name the node crate `node`, as the fuzz crate's manifest does.
extern crate portico_node as node;

#[allow(dead_code)] // The seed-corpus tool's half of the harness is not used here.
#[path = "../../fuzz/src/rdma_node.rs"]
mod rdma_node;

#[path = "../../fuzz/src/parse_roce.rs"]
mod parse_roce;

use std::path::{Path, PathBuf};

/// The inputs in `dir` (sorted; README files are not inputs). A missing directory holds none.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("a readable directory entry").path())
        .filter(|p| p.is_file() && p.file_name().is_none_or(|n| n != "README.md"))
        .collect();
    files.sort();
    files
}

/// Runs every input of `target` through `run`; a failure names the file. Returns how many
/// corpus and regression inputs ran.
fn replay(target: &str, run: fn(&[u8])) -> (usize, usize) {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let corpus = inputs(&fuzz.join("corpus").join(target));
    let regressions = inputs(&fuzz.join("regressions").join(target));
    for path in corpus.iter().chain(&regressions) {
        let data = std::fs::read(path).expect("a readable input");
        if let Err(panic) = std::panic::catch_unwind(|| run(&data)) {
            eprintln!("{target}: {} fails", path.display());
            std::panic::resume_unwind(panic);
        }
    }
    (corpus.len(), regressions.len())
}

#[test]
fn rdma_node_corpus_and_regressions_replay() {
    let (corpus, regressions) = replay("rdma_node", rdma_node::run);
    eprintln!("rdma_node: {corpus} corpus and {regressions} regression inputs");
    assert!(
        corpus >= 10,
        "the seed corpus is checked in ({corpus} inputs)"
    );
}

#[test]
fn parse_roce_corpus_and_regressions_replay() {
    let (corpus, regressions) = replay("parse_roce", parse_roce::run);
    eprintln!("parse_roce: {corpus} corpus and {regressions} regression inputs");
    assert!(
        corpus >= 5,
        "the seed corpus is checked in ({corpus} inputs)"
    );
}

/// An empty input and a few cut-off records are valid inputs too (every byte string is).
#[test]
fn short_and_truncated_inputs_run() {
    for input in [
        &[][..],
        &[0x00],
        &[0x05, 0xff, 0xff, 1, 2, 3],
        &[0xc4],
        &[0xc3, 0xff],
    ] {
        rdma_node::run(input);
        parse_roce::run(input);
    }
}
