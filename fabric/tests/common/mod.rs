//! What the provider's tests share: the provider where libfabric finds it, commands with a
//! clean `FI_*` environment, and the C programs of `tests/c` built against the system's
//! libfabric or Open MPI.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU16, Ordering};

/// A folder holding the provider under the name libfabric looks for (`lib<name>-fi.so`).
pub fn provider_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let built = [
        deps.join("libportico_fi.so"),
        deps.parent().unwrap().join("libportico_fi.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .expect("libportico_fi.so beside the test binary (cargo builds the cdylib with the crate)");
    static N: AtomicU16 = AtomicU16::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = deps
        .parent()
        .unwrap()
        .join(format!("fabric-test-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(&built, dir.join("libportico-fi.so")).unwrap();
    dir
}

pub fn fi(cmd: &str, dir: &Path) -> Command {
    let mut c = Command::new(cmd);
    c.env("FI_PROVIDER_PATH", dir).env_remove("FI_LOG_LEVEL");
    for (k, _) in std::env::vars() {
        if k.starts_with("FI_PORTICO_") {
            c.env_remove(k);
        }
    }
    c
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Builds one of the C programs in `tests/c` against the installed libfabric.
pub fn build_c(name: &str, dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let bin = dir.join(name);
    let out = Command::new("cc")
        .args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(&src)
        .arg("-lfabric")
        .output()
        .expect("cc");
    assert!(out.status.success(), "building {name}: {}", text(&out));
    bin
}

/// Builds one of the MPI programs in `tests/c` with Open MPI's `mpicc`.
pub fn build_mpi(name: &str, dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let bin = dir.join(name);
    let out = Command::new("mpicc")
        .args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("mpicc (libopenmpi-dev, scripts/install-deps.sh)");
    assert!(out.status.success(), "building {name}: {}", text(&out));
    bin
}
