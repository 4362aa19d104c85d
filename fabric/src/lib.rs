//! Portico as a libfabric provider: `libportico-fi.so`, loaded by the system's libfabric
//! (`FI_PROVIDER_PATH`), so that unmodified libfabric programs (fi_pingpong, Open MPI's
//! `mtl ofi`) run over the engine and its offloads. See `docs/libfabric.md`.
//!
//! - [`params`]: the `FI_PORTICO_*` parameters, pure.
//! - [`addr`]: the endpoint address (`FI_SOCKADDR_IN` with the endpoint's index), pure.
//! - [`info`]: what `fi_getinfo` offers and the check of the application's hints, pure.
//! - [`tclass`]: libfabric's traffic classes onto the shaper's classes and DSCPs, pure.
//! - [`maps`]: which registrations are shared file mappings (durable WRITE targets), pure.
//! - [`engine`]: the process's one engine and the provider's state, safe Rust.
//! - [`msg`]: `FI_EP_MSG` endpoints, passive endpoints and their connection events.
//! - `ffi`: the C boundary, every `fid` object and ops table (the crate's only `unsafe`).
//! - [`sys`]: libfabric's types, from its installed headers by bindgen.

#![deny(unsafe_code)]

pub mod addr;
pub mod engine;
#[allow(unsafe_code)]
mod ffi;
mod flags;
pub mod info;
pub mod maps;
pub mod msg;
pub mod params;
#[allow(unsafe_code)]
pub mod sys;
pub mod tclass;
