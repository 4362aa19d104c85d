//! The EAL command line and the cores: Portico's defaults (log levels, `-l`, no files under
//! `/var/run/dpdk`, `--no-pci`, hugepages or `--no-huge`), then the devices, then the user's
//! own arguments, which win where they overlap.

use crate::config::HugepageMode;
use crate::dataplane::Eal;
use crate::hugepages::HugepageStatus;
use crate::report;
use crate::runtime::Polling;
use crate::summary::MemoryChoice;

use super::AppError;

/// A device to hand to EAL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceArg {
    Vdev(String),
    Pci(String),
}

fn has_any(args: &[String], flags: &[&str]) -> bool {
    args.iter().any(|a| {
        flags.iter().any(|f| {
            a == f
                || (f.starts_with("--") && a.starts_with(&format!("{f}=")))
                || (!f.starts_with("--") && a.starts_with(f) && a.len() > f.len())
        })
    })
}

/// The EAL command line for a run: Portico's defaults, then the devices, then the user's own
/// arguments (which win where they overlap, as later EAL options do).
pub fn plan_eal_args(
    user: &[String],
    mode: HugepageMode,
    memory_mb: u32,
    main_core: usize,
    devices: &[DeviceArg],
    huge: &HugepageStatus,
) -> Result<(Vec<String>, MemoryChoice), AppError> {
    let mut args: Vec<String> = vec![
        "--log-level=lib.eal:error".into(),
        "--log-level=lib.telemetry:warning".into(),
    ];
    if !has_any(user, &["-l", "-c", "--lcores", "--main-lcore"]) {
        args.push("-l".into());
        args.push(main_core.to_string());
    }
    let memory = if has_any(user, &["--no-huge"]) {
        MemoryChoice::NoHuge { mb: None }
    } else {
        match mode {
            HugepageMode::On if !huge.usable() => {
                return Err(AppError::Usage(format!(
                    "eal.hugepages: \"on\" but no usable hugepages ({} free of {} KiB, hugetlbfs {}): run scripts/hugepages.sh",
                    huge.free,
                    huge.page_kb,
                    if huge.mounted {
                        "mounted"
                    } else {
                        "not mounted"
                    }
                )));
            }
            HugepageMode::On | HugepageMode::Auto if huge.usable() => MemoryChoice::Hugepages {
                page_kb: huge.page_kb,
                free: huge.free,
            },
            _ => {
                args.push("--no-huge".into());
                args.push("-m".into());
                args.push(memory_mb.to_string());
                MemoryChoice::NoHuge {
                    mb: Some(memory_mb),
                }
            }
        }
    };
    // No files under /var/run/dpdk, so that several Portico processes (and CI runs) never
    // collide: --in-memory on hugepages; under --no-huge (which EAL runs in legacy memory
    // mode, incompatible with --in-memory) --no-shconf does the same.
    if !has_any(
        user,
        &["--file-prefix", "--in-memory", "--proc-type", "--no-shconf"],
    ) {
        match memory {
            MemoryChoice::Hugepages { .. } => args.push("--in-memory".into()),
            MemoryChoice::NoHuge { .. } => args.push("--no-shconf".into()),
        }
    }
    let has_pci = devices.iter().any(|d| matches!(d, DeviceArg::Pci(_)));
    if !has_pci && !has_any(user, &["-a", "--allow", "-b", "--block", "--no-pci"]) {
        args.push("--no-pci".into());
    }
    for d in devices {
        match d {
            DeviceArg::Vdev(v) => {
                args.push("--vdev".into());
                args.push(v.clone());
            }
            DeviceArg::Pci(p) => {
                args.push("-a".into());
                args.push(p.clone());
            }
        }
    }
    args.extend(user.iter().cloned());
    Ok((args, memory))
}

/// The cores this process may run on: the calling thread's affinity set, so call it before
/// EAL starts (EAL pins the thread that starts it to the main lcore).
pub fn available_cores() -> Vec<usize> {
    let mut ids: Vec<usize> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect();
    ids.sort_unstable();
    ids
}

/// The main lcore: the first core no worker uses (else the first core, shared with a worker).
pub(super) fn main_core_for(workers: &[usize], cores: &[usize]) -> usize {
    cores
        .iter()
        .copied()
        .find(|c| !workers.contains(c))
        .or_else(|| cores.first().copied())
        .unwrap_or(0)
}

/// EAL as started: what the summary records about it.
pub(super) struct Started {
    pub(super) memory: MemoryChoice,
    pub(super) args: Vec<String>,
}

/// Starts EAL and prints the banner.
pub(super) fn start_eal(
    args: Vec<String>,
    memory: MemoryChoice,
    polling: Option<Polling>,
    json: bool,
) -> Result<Started, AppError> {
    let info = Eal::init(&args)?;
    report::banner(info, &memory, polling, json);
    Ok(Started { memory, args })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn huge(free: u64, mounted: bool) -> HugepageStatus {
        HugepageStatus {
            page_kb: 2048,
            total: free,
            free,
            mounted,
        }
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn defaults_without_hugepages() {
        let (args, mem) = plan_eal_args(
            &[],
            HugepageMode::Auto,
            512,
            0,
            &[DeviceArg::Vdev("net_null0".into())],
            &huge(0, false),
        )
        .unwrap();
        assert_eq!(
            args,
            s(&[
                "--log-level=lib.eal:error",
                "--log-level=lib.telemetry:warning",
                "-l",
                "0",
                "--no-huge",
                "-m",
                "512",
                "--no-shconf",
                "--no-pci",
                "--vdev",
                "net_null0"
            ])
        );
        assert_eq!(mem, MemoryChoice::NoHuge { mb: Some(512) });
    }

    #[test]
    fn hugepages_used_when_free_and_mounted() {
        let (args, mem) =
            plan_eal_args(&[], HugepageMode::Auto, 512, 1, &[], &huge(512, true)).unwrap();
        assert!(!args.contains(&"--no-huge".to_string()));
        assert!(args.contains(&"--in-memory".to_string()));
        assert_eq!(
            mem,
            MemoryChoice::Hugepages {
                page_kb: 2048,
                free: 512
            }
        );
        let (args, _) =
            plan_eal_args(&[], HugepageMode::Off, 256, 1, &[], &huge(512, true)).unwrap();
        assert!(args.contains(&"--no-huge".to_string()));
        let e = plan_eal_args(&[], HugepageMode::On, 256, 1, &[], &huge(0, true)).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().starts_with("eal.hugepages:"), "{e}");
    }

    #[test]
    fn user_arguments_replace_defaults() {
        let user = s(&[
            "-l",
            "0-1",
            "--file-prefix=x",
            "--no-huge",
            "-a",
            "0000:01:00.0",
        ]);
        let (args, mem) =
            plan_eal_args(&user, HugepageMode::Auto, 512, 0, &[], &huge(512, true)).unwrap();
        assert_eq!(
            args,
            [
                s(&[
                    "--log-level=lib.eal:error",
                    "--log-level=lib.telemetry:warning"
                ]),
                user
            ]
            .concat()
        );
        assert_eq!(mem, MemoryChoice::NoHuge { mb: None });
    }

    #[test]
    fn pci_devices_are_allowed_not_blocked() {
        let (args, _) = plan_eal_args(
            &[],
            HugepageMode::Auto,
            512,
            0,
            &[DeviceArg::Pci("0000:3b:00.0".into())],
            &huge(512, true),
        )
        .unwrap();
        assert!(!args.contains(&"--no-pci".to_string()));
        assert!(args.windows(2).any(|w| w == ["-a", "0000:3b:00.0"]));
    }

    #[test]
    fn main_core_avoids_workers_when_it_can() {
        assert_eq!(main_core_for(&[1], &[0, 1]), 0);
        assert_eq!(main_core_for(&[0], &[0, 1]), 1);
        assert_eq!(main_core_for(&[0, 1], &[0, 1]), 0, "shared with worker 0");
        assert_eq!(main_core_for(&[], &[]), 0);
    }
}
