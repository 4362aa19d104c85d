//! Portico: a DPDK packet engine that does in software what an HPC/RDMA NIC does in hardware.
//!
//! The layers are crates, dependencies pointing down only (see `docs/architecture.md`):
//! - `wire` (`engine/wire`): packet formats and the ICRC; depends on no other Portico crate;
//! - `proto` (`engine/proto`): the RC transport, congestion control and the seed cores
//!   (shaper, list processing, placement, persistence rules), pure;
//! - `node` (`engine/node`): the worker-side RDMA engine and the application's API to it;
//! - this crate: [`dataplane`] (the DPDK adapter, the only `unsafe` here), [`runtime`]
//!   (pinned run-to-completion workers running [`runtime::Stage`]s, [`rdma::RdmaStage`]
//!   among them), [`traffic`] (forwarding, generator, checker), and what the `portico`
//!   command runs: [`app`], [`peer`], [`config`]; [`report`] prints what [`summary`] holds
//!   (`app` → `report` → `summary`);
//! - above it, `portico-bench` (`bench/`, the benchmark harness) and `portico-cli`
//!   (`engine/cli`, the `portico` binary).
//!
//! The lower crates are re-exported under their old module names ([`wire`], [`transport`],
//! [`cc`], [`shaper`], [`lpe`], [`placement`], [`rdma`]) so that users of this crate see one
//! tree.

#![deny(unsafe_code)]

pub mod app;
pub mod capture;
pub mod cc;
pub mod config;
#[allow(unsafe_code)]
pub mod dataplane;
pub mod hugepages;
pub mod latency;
pub mod peer;
pub mod rdma;
pub mod report;
pub mod runtime;
pub mod summary;
pub mod telemetry;
pub mod traffic;

pub use proto::{lpe, placement, rng, shaper, transport};
pub use wire;

/// Declares a set of counters once (from `portico-counters`; see [`runtime::counter_set`]).
pub use portico_counters::counter_set;
