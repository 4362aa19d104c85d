//! Binds libfabric's installed headers (Debian's `libfabric-dev`, 1.17) with bindgen: the
//! provider's types (`fi_provider`, `fi_info` and its attributes, every `fid_*` and ops table)
//! and the few functions of libfabric it calls (`fi_param_define`/`fi_param_get`, `fi_log`,
//! `fi_dupinfo`/`fi_freeinfo`, `fi_tostr`). If the headers are missing, one line says where
//! to get them.
use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=build.rs");
    let lib = match pkg_config::Config::new()
        .atleast_version("1.17")
        .probe("libfabric")
    {
        Ok(lib) => lib,
        Err(e) => {
            println!(
                "cargo:warning=libfabric not found ({e}); run scripts/install-deps.sh (libfabric-dev)"
            );
            panic!("libfabric (libfabric-dev, >= 1.17) not found: run scripts/install-deps.sh");
        }
    };
    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .rust_edition(bindgen::RustEdition::Edition2024)
        .layout_tests(true)
        .derive_default(true)
        .prepend_enum_name(false)
        .allowlist_type("fi_.*|fid.*")
        .allowlist_function("fi_param_define|fi_param_get|fi_log|fi_log_enabled|fi_dupinfo|fi_freeinfo|fi_allocinfo|fi_tostr|fi_version|fi_strerror")
        .allowlist_var("FI_.*")
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for path in &lib.include_paths {
        builder = builder.clang_arg(format!("-I{}", path.display()));
    }
    let bindings = builder
        .generate()
        .expect("bindgen over libfabric's headers");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("bindings.rs");
    bindings.write_to_file(out).expect("writing the bindings");
}
