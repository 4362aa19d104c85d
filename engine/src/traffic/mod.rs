//! Built-in traffic stages: raw forwarding (testpmd's `io` and `macswap`), a paced UDP
//! frame generator and a checker that verifies every byte of what arrives.

pub mod frame;

mod check;
mod forward;
mod generate;

pub use check::{CheckCounters, CheckSlot, Checker};
pub use forward::{Forward, FwdMode};
pub use generate::{GenerateCounters, GenerateSlot, Generator};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{Counters, Stage, WorkerReport};

    /// A worker report of a stage named `names` whose slot `i` holds `i + 1`, its JSON's
    /// `counters` (what the summary, the interval lines and telemetry list), and those read
    /// back by name.
    fn report(names: &'static [&'static str]) -> (WorkerReport, Vec<(String, u64)>) {
        let mut c = Counters::default();
        for (i, v) in c.stage.iter_mut().enumerate() {
            *v = i as u64 + 1;
        }
        let r = WorkerReport::new("w", None, "s", names, &c);
        let v = serde_json::to_value(&r).unwrap();
        let listed = serde_json::from_value(v["counters"].clone()).unwrap();
        (r, listed)
    }

    fn numbered(names: &[&str]) -> Vec<(String, u64)> {
        (names.iter().enumerate())
            .map(|(i, n)| (n.to_string(), i as u64 + 1))
            .collect()
    }

    /// The checker's counters: the names the summaries and tests read (`valid`, `seq_gaps`,
    /// ...), one per declared counter, in order, each from its own slot, and back by name.
    #[test]
    fn checker_counters_follow_their_declaration() {
        let names = Checker::new(None).counter_names();
        assert_eq!(names, CheckCounters::NAMES);
        assert_eq!(
            names,
            ["valid", "invalid", "seq_gaps", "late", "valid_bytes"]
        );
        let (r, listed) = report(names);
        assert_eq!(listed, numbered(names));
        let c = CheckCounters::from_pairs(listed.iter().map(|(n, v)| (n.as_str(), *v)));
        assert_eq!(c.values().to_vec(), [1, 2, 3, 4, 5]);
        assert_eq!(r.counter("late"), Some(CheckSlot::late.index() as u64 + 1));
        for d in CheckCounters::DECLS {
            assert!(!d.doc().is_empty(), "{}", d.name);
        }
    }

    /// The generator's, likewise (the generator itself needs a mempool, hence EAL: its
    /// `counter_names` are `GenerateCounters::NAMES`, and `ring_loopback` reads them).
    #[test]
    fn generator_counters_follow_their_declaration() {
        assert_eq!(GenerateCounters::NAMES, ["generated", "alloc_failures"]);
        let (r, listed) = report(&GenerateCounters::NAMES);
        assert_eq!(listed, numbered(&GenerateCounters::NAMES));
        assert_eq!(
            r.counter("generated"),
            Some(GenerateSlot::generated.index() as u64 + 1)
        );
        let mut all = GenerateCounters::from_pairs(listed.iter().map(|(n, v)| (n.as_str(), *v)));
        all.combine(&all.clone());
        assert_eq!(all.values(), [2, 4], "summed over generators");
        for d in GenerateCounters::DECLS {
            assert!(!d.doc().is_empty(), "{}", d.name);
        }
    }
}
