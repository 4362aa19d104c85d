//! The DPDK adapter: EAL start-up, mempools, an owning [`Mbuf`], bursts with sound TX ownership,
//! ports and queues for PMDs and vdevs, link status, stats and xstats, thread registration,
//! telemetry commands answered in Rust.
//!
//! This is the only module of the engine that contains `unsafe`; each block says why it holds.
//! Everything above it (wire formats, state machines, the runtime's stages) sees safe types.

mod burst;
mod eal;
mod lcore;
mod mbuf;
mod mempool;
mod port;
pub mod telemetry;
pub mod unmap_guard;
pub mod wake;

pub use burst::{Burst, Drain, MAX_BURST};
pub use eal::{Eal, EalError, EalInfo};
pub use lcore::{ThreadRegistration, lcore_id};
pub use mbuf::Mbuf;
pub use mempool::{Mempool, PoolLayout};
pub use port::{
    LinkStatus, Port, PortConfig, PortInfo, PortStats, RING_MAX_QUEUES, RssState, RxQueue, TxQueue,
    port_by_name, port_ids, port_xstats, ring_pair, ring_pair_queues,
};

use std::ffi::CStr;

/// An error returned by a DPDK call, with the text of `rte_errno` or of the negative return.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {text} ({code})")]
pub struct DpdkError {
    pub what: String,
    pub code: i32,
    pub text: String,
}

impl DpdkError {
    /// Builds an error from a DPDK return code (negative errno) or, when `code` is 0 or -1,
    /// from `rte_errno`.
    pub(crate) fn from_code(what: impl Into<String>, code: i32) -> Self {
        let code = if code == 0 || code == -1 {
            rte_errno()
        } else {
            code.abs()
        };
        DpdkError {
            what: what.into(),
            code,
            text: if code == 0 {
                "failed, the driver gave no reason (see its log line above)".to_string()
            } else {
                strerror(code)
            },
        }
    }
}

/// The calling thread's `rte_errno`.
pub fn rte_errno() -> i32 {
    // SAFETY: reads a thread-local int; valid on any thread.
    unsafe { dpdk_sys::portico_errno() }
}

/// DPDK's text for an errno value (covers DPDK's own codes above `RTE_MIN_ERRNO`).
pub fn strerror(code: i32) -> String {
    // SAFETY: rte_strerror returns a pointer to a static or thread-local NUL-terminated string.
    unsafe { CStr::from_ptr(dpdk_sys::rte_strerror(code)) }
        .to_string_lossy()
        .into_owned()
}

/// The CPU's time-stamp counter. Only meaningful after EAL start-up (for [`tsc_hz`]).
///
/// On x86-64 this is the `rdtsc` instruction itself, inlined (as DPDK's own `rte_rdtsc` is in
/// C); elsewhere the shim's out-of-line call. The worker reads it once per burst and per
/// poll, and the call through the shim showed as 1.6 % of the RDMA worker's samples.
#[inline]
pub fn rdtsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `rdtsc` only reads the time-stamp counter; every x86-64 CPU has it.
    return unsafe { core::arch::x86_64::_rdtsc() };
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: reads the TSC; no memory is touched.
    unsafe {
        dpdk_sys::portico_rdtsc()
    }
}

/// TSC ticks per second, as EAL calibrated them. Requires EAL.
pub fn tsc_hz() -> u64 {
    // SAFETY: plain getter; returns 0 before EAL init, which callers treat as unknown.
    unsafe { dpdk_sys::rte_get_tsc_hz() }
}

/// Whether this CPU has what DPDK's power monitor (`rte_power_monitor`, the `monitor` mode of
/// `rte_power_ethdev_pmgmt_queue_enable`) needs: WAITPKG's UMWAIT or AMD's MONITORX.
pub fn cpu_has_power_monitor() -> bool {
    let mut i = dpdk_sys::rte_cpu_intrinsics::default();
    // SAFETY: fills the struct it is given; needs nothing else (EAL or not).
    unsafe { dpdk_sys::rte_cpu_get_intrinsics_support(&mut i) };
    i.power_monitor() != 0
}

/// The DPDK version linked at run time, e.g. "DPDK 22.11.11".
pub fn dpdk_version() -> String {
    // SAFETY: rte_version returns a pointer to a static string.
    unsafe { CStr::from_ptr(dpdk_sys::rte_version()) }
        .to_string_lossy()
        .into_owned()
}

/// Directory EAL loads PMD shared objects from, as found at build time.
pub const PMD_DIR: &str = dpdk_sys::PMD_DIR;

pub(crate) fn c_string(what: &str, s: &str) -> Result<std::ffi::CString, DpdkError> {
    std::ffi::CString::new(s).map_err(|_| DpdkError {
        what: what.to_string(),
        code: libc_einval(),
        text: format!("{s:?} contains a NUL byte"),
    })
}

const fn libc_einval() -> i32 {
    22
}
