//! A process that persists and is then killed with SIGKILL leaves its persisted data in the
//! file. Each test re-executes this test binary as a child that runs only that test; the child
//! maps the file, writes, persists some of it and kills itself. The parent checks that the child
//! died by SIGKILL and reads the file back with std::fs.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

use common::{TempDir, pattern};
use pmem::{MapOptions, Mapping};

/// Set in the child: the file to map.
const CHILD_FILE: &str = "PMEM_CRASH_CHILD_FILE";

const LEN: usize = 4 * 4096;
/// Persisted with `persist`: lines [0, 192).
const A: (usize, usize) = (0, 150);
/// One byte persisted with `persist_ranges`, together with the rest of B's page run: its whole
/// line [4096, 4160) is persisted, including bytes written before it.
const B_LINE: usize = 4096;
/// Written and never persisted.
const C: (usize, usize) = (8192 + 100, 300);

fn child(path: &Path, simulate: bool) -> ! {
    let m = MapOptions::new()
        .simulate_power_loss(simulate)
        .create_file(path, LEN)
        .unwrap();
    m.write(A.0, &pattern(0xA, A.1)).unwrap();
    m.persist(A.0, A.1).unwrap();
    m.write(B_LINE, &pattern(0xB, 64)).unwrap();
    m.persist_ranges(&[(B_LINE + 63, 1)]).unwrap();
    m.write(C.0, &pattern(0xC, C.1)).unwrap();
    // SAFETY: kill(2) with our own pid only sends a signal; SIGKILL ends the process here,
    // without unwinding, unmapping or closing anything.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    unreachable!("SIGKILL did not kill the child");
}

/// Runs `test_name` in a child process over a fresh file and returns the file's bytes.
fn run_child(test_name: &str, simulate: bool) -> Vec<u8> {
    if let Some(path) = std::env::var_os(CHILD_FILE) {
        child(Path::new(&path), simulate);
    }
    let dir = TempDir::new(test_name);
    let path = dir.path().join("region");
    let status = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test_name, "--nocapture", "--test-threads=1"])
        .env(CHILD_FILE, &path)
        .status()
        .unwrap();
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "the child did not die by SIGKILL: {status}"
    );
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len(), LEN);
    bytes
}

fn assert_persisted_lines_survived(file: &[u8]) {
    assert_eq!(
        &file[A.0..A.0 + A.1],
        pattern(0xA, A.1).as_slice(),
        "A was persisted"
    );
    assert_eq!(
        &file[B_LINE..B_LINE + 64],
        pattern(0xB, 64).as_slice(),
        "B's line was persisted"
    );
}

#[test]
fn killed_child_leaves_persisted_data_in_a_shared_file() {
    let file = run_child("killed_child_leaves_persisted_data_in_a_shared_file", false);
    assert_persisted_lines_survived(&file);
    // C was stored through a shared mapping: it sits in the page cache and may be in the file
    // too. Only the simulator can say it is not.
}

#[test]
fn killed_child_leaves_only_persisted_lines_in_a_simulated_file() {
    let file = run_child(
        "killed_child_leaves_only_persisted_lines_in_a_simulated_file",
        true,
    );
    assert_persisted_lines_survived(&file);
    // Everything else, C included, is as create_file left it: zero.
    let mut expected = vec![0u8; LEN];
    expected[A.0..A.0 + A.1].copy_from_slice(&pattern(0xA, A.1));
    expected[B_LINE..B_LINE + 64].copy_from_slice(&pattern(0xB, 64));
    assert_eq!(
        &file[C.0..C.0 + C.1],
        vec![0u8; C.1].as_slice(),
        "unpersisted C reached the file"
    );
    assert_eq!(file, expected);
}

#[test]
fn a_real_mapping_cannot_crash() {
    let m = Mapping::anonymous(4096).unwrap();
    assert!(matches!(m.crash(), Err(pmem::Error::NotSimulated)));
}
