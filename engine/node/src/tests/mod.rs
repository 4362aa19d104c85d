//! The crate's tests that span modules, on pure nodes over the simulated wire (`testing`):
//! each acceptance check of a received frame on its own (`acceptance`, the table in
//! `docs/security.md`), tagged messaging end to end (`tagged`), and the declared counter sets
//! (`counters`). A module's own unit tests
//! sit in its file, in `mod tests`.

mod acceptance;
mod cm;
mod counters;
mod tagged;
