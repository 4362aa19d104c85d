//! What the `portico` command runs. Each command is a file:
//!
//! - `eal`: the EAL command line (Portico's defaults, then the devices, then the user's
//!   arguments), the cores this process may use, and the main core;
//! - [`scenario`]: `portico run`, ports and workers set up from a [`Scenario`], and the
//!   checkers' verdicts;
//! - `fwd`: `portico fwd`, raw forwarding between the probed ports;
//! - `ports`: `portico ports`, and the size of the mbuf pool for the ports a run opens;
//! - `threads`: where the host, the workers and EAL's own threads run (`/proc/self/task`);
//! - `line_trip`: how long a cache line takes from the host's core to a worker's and back;
//! - `monitor`: the loop every run shares: start the workers, print live stats, stop on the
//!   duration, a signal, finished work or a failed worker, drain, and collect the [`Summary`].
//!
//! What a run measured is plain data in [`crate::summary`], printed by [`crate::report`];
//! `app` calls `report`, never the other way round. The public items are re-exported here, so
//! other code names them `crate::app::...`.
//!
//! [`Scenario`]: crate::config::Scenario

mod eal;
mod fwd;
mod line_trip;
mod monitor;
mod ports;
mod scenario;
mod threads;

pub use eal::{DeviceArg, available_cores, plan_eal_args};
pub use fwd::{FwdOpts, run_fwd};
pub use line_trip::{LineTrip, TripError, line_round_trip, line_trips};
pub use monitor::{RunOpts, port_summary};
pub use ports::{check_pool_fits, list_ports, pool_bytes, pool_size};
pub use scenario::run_scenario;
pub use threads::{CoresReport, ThreadPlace, current_cpu};

pub use crate::summary::{
    CaptureSummary, CheckVerdict, MemoryChoice, PortSummary, StopReason, Summary,
};

use crate::config::ConfigError;
use crate::dataplane::{DpdkError, EalError};
use crate::runtime::RuntimeError;

/// Why a command failed; [`AppError::exit_code`] maps it to the process status.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The config file is wrong; the message names the field.
    #[error("bad config {path}: {source}")]
    Config { path: String, source: ConfigError },
    /// A command-line argument (or a config value checked late) is wrong; the message names it.
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Eal(#[from] EalError),
    #[error(transparent)]
    Dpdk(#[from] DpdkError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// Any other failure at run time: an engine that did not start, a worker gone, an
    /// operation that timed out. The message is shown as it is.
    #[error("{0}")]
    Failed(String),
    #[error("check failed: {0}")]
    CheckFailed(String),
    #[error("capture file {path}: {source}")]
    Capture {
        path: String,
        source: std::io::Error,
    },
}

impl AppError {
    /// 2 for what the user must fix in the config or arguments, 1 for failures at run time.
    pub fn exit_code(&self) -> i32 {
        match self {
            AppError::Config { .. } | AppError::Usage(_) => 2,
            AppError::Eal(_)
            | AppError::Dpdk(_)
            | AppError::Runtime(_)
            | AppError::Failed(_)
            | AppError::CheckFailed(_)
            | AppError::Capture { .. } => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_and_usage_exit_2_run_time_failures_exit_1() {
        let config = AppError::Config {
            path: "x.toml".into(),
            source: ConfigError {
                field: "rdma.mtu".into(),
                message: "7 is not 256, 512, 1024, 2048 or 4096".into(),
            },
        };
        assert_eq!(config.exit_code(), 2);
        assert_eq!(
            AppError::Usage("--qd: must be at least 1".into()).exit_code(),
            2
        );
        let failed = AppError::Failed("engine did not start".into());
        assert_eq!(failed.exit_code(), 1);
        assert_eq!(failed.to_string(), "engine did not start", "shown as it is");
        assert_eq!(AppError::CheckFailed("x".into()).exit_code(), 1);
    }
}
