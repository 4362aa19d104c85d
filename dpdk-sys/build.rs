//! Finds the system DPDK with pkg-config, compiles the C shim with DPDK's own `-march`/`-m`
//! flags, and runs bindgen over the same headers with the same flags (a mismatch makes the
//! shim fail to inline DPDK's AVX helpers, or bindgen disagree with the compiled layout).
//!
//! It also decides how `rx_burst`/`tx_burst` reach the PMD (see `src/lib.rs`): inline through
//! `rte_eth_fp_ops` (cfg `portico_fp_inline`) only on the DPDK release whose `rte_eth_burst`
//! code that Rust copy was audited against, and only when that DPDK was built without the
//! fast-path debug checks and trace points the copy leaves out; otherwise through the C shim.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const MIN_VERSION: &str = "22.11";
/// The DPDK release whose inline `rte_eth_rx_burst`/`rte_eth_tx_burst` the Rust copy in
/// `src/lib.rs` follows (`rte_ethdev.h`, `rte_ethdev_core.h`). Any other release uses the shim
/// until someone re-reads those two functions and the `rte_eth_fp_ops` layout for it.
const FP_OPS_RELEASE: &str = "22.11";
const INSTALL_HINT: &str =
    "run scripts/install-deps.sh (Debian: libdpdk-dev dpdk clang libclang-dev pkg-config)";

fn fail(msg: &str) -> ! {
    // One line, shown by cargo as `error: ...`.
    println!("cargo::error={msg}");
    std::process::exit(0);
}

fn pkg_config(args: &[&str]) -> Option<String> {
    let out = Command::new("pkg-config").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    println!("cargo::rerun-if-changed=csrc/portico_shim.c");
    println!("cargo::rerun-if-changed=csrc/portico_shim.h");
    println!("cargo::rerun-if-changed=csrc/fp_probe.c");
    println!("cargo::rustc-check-cfg=cfg(portico_fp_inline)");
    println!("cargo::rustc-check-cfg=cfg(portico_rxtx_callbacks)");
    println!("cargo::rerun-if-env-changed=PKG_CONFIG_PATH");

    if pkg_config(&["--version"]).is_none() {
        fail(&format!("pkg-config is not installed: {INSTALL_HINT}"));
    }
    let lib = match pkg_config::Config::new()
        .atleast_version(MIN_VERSION)
        .cargo_metadata(false)
        .probe("libdpdk")
    {
        Ok(lib) => lib,
        Err(_) => fail(&format!(
            "DPDK >= {MIN_VERSION} (pkg-config libdpdk) not found: {INSTALL_HINT}"
        )),
    };

    // -I, -include, -march, -m*, -D exactly as DPDK was built; shared by cc and bindgen.
    let cflags: Vec<String> = pkg_config(&["--cflags", "libdpdk"])
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let mut compile_flags: Vec<String> = Vec::new();
    let mut it = cflags.iter();
    while let Some(flag) = it.next() {
        if flag == "-include" {
            if let Some(file) = it.next() {
                compile_flags.push(flag.clone());
                compile_flags.push(file.clone());
            }
        } else if flag.starts_with("-I") || flag.starts_with("-D") || flag.starts_with("-m") {
            compile_flags.push(flag.clone());
        }
    }

    let mut shim = cc::Build::new();
    shim.file("csrc/portico_shim.c")
        .opt_level(3)
        .warnings(false);
    for f in &compile_flags {
        shim.flag(f);
    }
    shim.compile("portico_shim");

    // The build options of this DPDK that change what the inline burst functions do.
    let mut probe = cc::Build::new();
    probe.file("csrc/fp_probe.c").warnings(false);
    for f in &compile_flags {
        probe.flag(f);
    }
    let expanded = probe
        .try_expand()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_else(|e| {
            fail(&format!(
                "preprocessing csrc/fp_probe.c failed ({e}): {INSTALL_HINT}"
            ))
        });
    let has = |marker: &str| expanded.lines().any(|l| l.trim() == marker);
    let callbacks = has("portico_probe_rxtx_callbacks");
    let release = lib.version.split('.').take(2).collect::<Vec<_>>().join(".");
    let shim_reason = if release != FP_OPS_RELEASE {
        format!(
            "DPDK {} is not {FP_OPS_RELEASE}, the release the inline copy follows",
            lib.version
        )
    } else if let Some(opt) = [
        ("portico_probe_debug_rx", "RTE_ETHDEV_DEBUG_RX"),
        ("portico_probe_debug_tx", "RTE_ETHDEV_DEBUG_TX"),
        ("portico_probe_trace_fp", "RTE_ENABLE_TRACE_FP"),
    ]
    .iter()
    .find(|(marker, _)| has(marker))
    {
        format!(
            "DPDK was built with {}, which the inline copy leaves out",
            opt.1
        )
    } else {
        String::new()
    };
    if shim_reason.is_empty() {
        println!("cargo::rustc-cfg=portico_fp_inline");
    }
    if callbacks {
        println!("cargo::rustc-cfg=portico_rxtx_callbacks");
    }

    for path in &lib.link_paths {
        println!("cargo::rustc-link-search=native={}", path.display());
    }
    for l in &lib.libs {
        println!("cargo::rustc-link-lib=dylib={l}");
    }
    // rte_eth_from_rings() lives in the ring PMD, which libdpdk.pc does not list.
    println!("cargo::rustc-link-lib=dylib=rte_net_ring");

    let header = Path::new("csrc/portico_shim.h");
    let bindings = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .clang_args(compile_flags.iter())
        .rust_edition(bindgen::RustEdition::Edition2024)
        .use_core()
        .layout_tests(true)
        .derive_default(true)
        .generate_comments(false)
        .allowlist_function("portico_.*")
        .allowlist_function("rte_eal_(init|cleanup|has_hugepages|process_type|get_runtime_dir)")
        .allowlist_function("rte_strerror|rte_version|rte_socket_id|rte_lcore_count|rte_get_tsc_hz")
        .allowlist_function("rte_thread_(register|unregister)")
        .allowlist_function("rte_pktmbuf_(pool_create|free_bulk)")
        .allowlist_function("rte_mempool_(free|avail_count|in_use_count|lookup)")
        .allowlist_function("rte_mempool_(create_empty|set_ops_byname|populate_default|obj_iter)")
        .allowlist_function("rte_mbuf_best_mempool_ops|rte_pktmbuf_(pool_init|init)")
        .allowlist_type("rte_pktmbuf_pool_private")
        .allowlist_var("RTE_MEMPOOL_F_NO_IOVA_CONTIG")
        .allowlist_function("rte_ring_(create|free)")
        .allowlist_function("rte_eth_from_rings")
        .allowlist_var("rte_eth_fp_ops")
        .allowlist_function("rte_eth_call_(rx|tx)_callbacks|rte_eth_add_(rx|tx)_callback")
        .allowlist_function("rte_eth_dev_(configure|start|stop|close|info_get|socket_id|count_avail|get_port_by_name|get_name_by_port|is_valid_port|set_mtu|default_mac_addr_set)")
        .allowlist_function("rte_eth_(rx_queue_setup|tx_queue_setup|macaddr_get|link_get_nowait|stats_get|stats_reset|xstats_get|xstats_get_names|xstats_reset|promiscuous_enable|find_next_owned_by|link_speed_to_str)")
        // Telemetry: commands answered from Rust (none of these is inline).
        .allowlist_function("rte_telemetry_register_cmd|rte_tel_data_.*")
        // What the CPU offers DPDK's power management (adaptive polling reports it).
        .allowlist_function("rte_cpu_get_intrinsics_support")
        .allowlist_type("rte_cpu_intrinsics")
        .allowlist_type("rte_tel_value_type")
        .allowlist_var("RTE_TEL_MAX_.*")
        .allowlist_type("rte_mbuf")
        .allowlist_var("RTE_MAX_ETHPORTS|RTE_MBUF_DEFAULT_BUF_SIZE|RTE_PKTMBUF_HEADROOM|RTE_ETH_LINK_.*|RTE_MAX_LCORE|SOCKET_ID_ANY|RING_F_.*|RTE_ETH_NAME_MAX_LEN|RTE_ETH_DEV_NO_OWNER")
        // Packed structs that also carry an alignment cannot be expressed in Rust
        // (E0588); Portico parses these headers itself in `wire`.
        .opaque_type("rte_arp_hdr|rte_arp_ipv4|rte_l2tpv2_combined_msg_hdr|rte_gtp_psc_generic_hdr")
        .generate()
        .unwrap_or_else(|e| fail(&format!("bindgen failed on the DPDK headers ({e}): {INSTALL_HINT}")));

    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("write bindings.rs");

    // Where EAL auto-loads PMDs from: the engine uses it to tell a missing driver from a typo.
    let libdir = pkg_config(&["--variable=libdir", "libdpdk"]).unwrap_or_default();
    let pmd_dir = std::fs::read_dir(Path::new(&libdir).join("dpdk"))
        .ok()
        .and_then(|rd| {
            rd.flatten().map(|e| e.path()).find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("pmds-"))
            })
        })
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    std::fs::write(
        out.join("consts.rs"),
        format!(
            "/// DPDK version found by pkg-config at build time.\npub const DPDK_VERSION: &str = {:?};\n\
             /// Directory EAL loads PMD shared objects from (empty if unknown).\npub const PMD_DIR: &str = {:?};\n\
             /// Why `rx_burst`/`tx_burst` call the C shim; empty when they reach the PMD inline.\n\
             pub const FP_OPS_SHIM_REASON: &str = {:?};\n",
            lib.version, pmd_dir, shim_reason
        ),
    )
    .expect("write consts.rs");
}
