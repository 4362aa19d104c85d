//! Portico: a DPDK packet engine that does in software what an HPC/RDMA NIC does in hardware.
//!
//! Layers, dependencies pointing down only (see `docs/architecture.md`):
//! - [`wire`] (RoCEv2 packet formats and the ICRC), [`traffic::frame`] and [`config`]: pure
//!   code, tested without EAL; [`transport`] (RC queue pairs) on top of `wire`;
//! - [`dataplane`]: the DPDK adapter, the only `unsafe` in this crate;
//! - [`runtime`]: pinned run-to-completion workers running [`runtime::Stage`]s;
//! - [`lpe`]: the list-processing engine (Portals/MPI matching), pure and sharded;
//! - [`traffic`]: the built-in stages (forwarding, generator, checker);
//! - [`app`] (and [`bench`], [`peer`]): what the `portico` command runs; [`report`]: what it
//!   prints; [`summary`]: what a run measured, the plain data between the two
//!   (`app` → `report` → `summary`).

#![deny(unsafe_code)]

pub mod app;
pub mod bench;
pub mod capture;
pub mod cc;
pub mod config;
#[allow(unsafe_code)]
pub mod dataplane;
pub mod hugepages;
pub mod latency;
pub mod lpe;
pub mod peer;
pub mod placement;
pub mod rdma;
pub mod report;
pub mod runtime;
pub mod shaper;
pub mod summary;
pub mod telemetry;
pub mod traffic;
pub mod transport;
pub mod wire;
