//! Counters declared once: `counter_set!`, [`Combine`] and [`CounterDecl`] live in the leaf
//! crate `portico-counters` (so that `portico-node` declares its counters with them too) and
//! are re-exported here and as `portico::counter_set!`.

pub use portico_counters::{Combine, CounterDecl};
