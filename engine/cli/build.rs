//! Exports the process's own `munmap` (`dataplane::unmap_guard`) from the binaries, so that the
//! PMDs EAL loads with `dlopen` (memif among them) bind to it instead of libc's: their unmaps
//! then wait for the workers inside a burst. Without the export, a dlopened library would
//! resolve `munmap` in libc, past the executable.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    for kind in ["bins", "tests"] {
        println!("cargo:rustc-link-arg-{kind}=-Wl,--export-dynamic-symbol=munmap");
    }
}
