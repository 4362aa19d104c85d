//! Built-in traffic stages: raw forwarding (testpmd's `io` and `macswap`), a paced UDP
//! frame generator and a checker that verifies every byte of what arrives.

pub mod frame;

mod check;
mod forward;
mod generate;

pub use check::Checker;
pub use forward::{Forward, FwdMode};
pub use generate::Generator;
