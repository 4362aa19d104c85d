//! EAL start-up. EAL may start once per process (a second `rte_eal_init` fails with
//! EALREADY, and nothing may be called after `rte_eal_cleanup`), so [`Eal::init`] is guarded
//! by a process-wide `OnceLock` and the EAL is never torn down before exit.

use std::ffi::{CString, c_char, c_int};
use std::sync::OnceLock;

use super::{rte_errno, strerror};

static EAL: OnceLock<EalInfo> = OnceLock::new();

/// What the running EAL was started with.
#[derive(Debug, Clone)]
pub struct EalInfo {
    /// The arguments passed to `rte_eal_init`, program name first.
    pub args: Vec<String>,
    /// True when EAL runs on hugepages, false under `--no-huge`.
    pub hugepages: bool,
    /// The run-time DPDK version string.
    pub version: String,
    /// TSC ticks per second.
    pub tsc_hz: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum EalError {
    #[error("EAL init failed: {text} (rte_errno {code}); EAL arguments: {args}")]
    Init {
        code: i32,
        text: String,
        args: String,
    },
    #[error("EAL is already running in this process (it starts once per process)")]
    AlreadyStarted,
    #[error("EAL argument {0:?} contains a NUL byte")]
    BadArgument(String),
}

/// The Environment Abstraction Layer of this process.
pub struct Eal;

impl Eal {
    /// Starts EAL with `args` (without the program name). Fails if EAL is already running.
    pub fn init(args: &[String]) -> Result<&'static EalInfo, EalError> {
        if EAL.get().is_some() {
            return Err(EalError::AlreadyStarted);
        }
        let mut all = vec!["portico".to_string()];
        all.extend(args.iter().cloned());
        let owned: Vec<CString> = all
            .iter()
            .map(|a| CString::new(a.as_str()).map_err(|_| EalError::BadArgument(a.clone())))
            .collect::<Result<_, _>>()?;
        // EAL places its control threads (interrupts, multi-process, telemetry) on the CPUs
        // the process may use that no lcore holds, which on a small machine are the workers'
        // cores. With the calling thread pinned to the main lcore first, that set is empty
        // and EAL falls back to the main lcore's CPU: the control threads then share the
        // host's core, never a busy-polling worker's (EAL pins this thread there anyway).
        if let Some(main) = single_lcore(args) {
            core_affinity::set_for_current(core_affinity::CoreId { id: main });
        }
        // Before EAL loads any PMD: the process's own munmap, which waits for pollers.
        super::unmap_guard::install();
        // EAL may permute argv, so it gets its own array of pointers; the strings stay owned
        // by `owned` (EAL keeps no pointer to them after init returns).
        let mut argv: Vec<*mut c_char> = owned.iter().map(|c| c.as_ptr() as *mut c_char).collect();
        // SAFETY: argv holds argc valid NUL-terminated strings that outlive the call.
        let rc = unsafe { dpdk_sys::rte_eal_init(argv.len() as c_int, argv.as_mut_ptr()) };
        if rc < 0 {
            let code = rte_errno();
            return Err(EalError::Init {
                code,
                text: strerror(code),
                args: args.join(" "),
            });
        }
        // SAFETY: EAL is initialised; these are plain getters.
        let (hugepages, tsc_hz) = unsafe {
            (
                dpdk_sys::rte_eal_has_hugepages() != 0,
                dpdk_sys::rte_get_tsc_hz(),
            )
        };
        let info = EalInfo {
            args: all,
            hugepages,
            version: super::dpdk_version(),
            tsc_hz,
        };
        Ok(EAL.get_or_init(|| info))
    }

    /// The running EAL, if [`Eal::init`] succeeded in this process.
    pub fn get() -> Option<&'static EalInfo> {
        EAL.get()
    }
}

/// The core of `-l N` or `--lcores N` when it names exactly one core (the main lcore).
fn single_lcore(args: &[String]) -> Option<usize> {
    let at = args.iter().position(|a| a == "-l" || a == "--lcores")?;
    args.get(at + 1)?.parse().ok()
}

#[cfg(test)]
mod lcore_tests {
    use super::single_lcore;

    #[test]
    fn one_named_lcore_is_found_and_lists_are_left_alone() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(single_lcore(&args(&["--no-huge", "-l", "3"])), Some(3));
        assert_eq!(single_lcore(&args(&["--lcores", "0"])), Some(0));
        assert_eq!(single_lcore(&args(&["-l", "0,1"])), None);
        assert_eq!(single_lcore(&args(&["-l", "0-3"])), None);
        assert_eq!(single_lcore(&args(&["-l"])), None);
        assert_eq!(single_lcore(&args(&["-c", "0x3"])), None);
    }
}
