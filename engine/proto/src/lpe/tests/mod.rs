//! Tests of the LPE: scenario tests for each Portals/MPI rule, property
//! tests comparing the deep structure, the linear list, the queued engine
//! path and the reference model, and a cross-thread hand-off test.

mod harness;
mod props;
mod scenarios;
mod threads;
