//! Counters declared once, at the bottom of Portico's crate graph so that every crate can
//! declare its own (`portico-node`'s node and tag counters, `portico`'s stages and polling).
//! Depends on nothing but serde; `portico` re-exports it as `portico::counter_set!` and
//! `portico::runtime::counter_set`.
//!
//! [`counter_set!`](crate::counter_set) takes a list of counters, each
//! with its name, a doc line and how it combines ([`Combine`]), and derives from it everything
//! that used to be kept in step by hand:
//!
//! - a struct of plain `u64` fields, one per counter, with the doc on the field;
//! - an enum of the counters' slots (`Counters::stage[i]`), dense, in declaration order;
//! - `NAMES` (what a `portico` stage's `counter_names` returns: the JSON, telemetry and summary
//!   keys) and `DECLS` (name, doc, combination: the listings for docs and tests);
//! - `combine` (summing over engines and workers, or max, or last), `store` into and `load`
//!   from the slots, `from_pairs` (back from a worker report's named counters), `iter`;
//! - `Serialize`, as a struct with one key per counter, in declaration order.
//!
//! Nothing of it runs per packet: the counting is in the struct's plain fields (or straight in
//! a worker's slots), as before; the rest runs when a set is published, combined or read.

#![forbid(unsafe_code)]

/// How a counter combines across engines of a stage, and across workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Combine {
    /// Added up (events, packets, bytes).
    Sum,
    /// The largest (a high-water mark).
    Max,
    /// The later one wins (a level, a setting).
    Last,
}

impl Combine {
    /// `acc` combined with `v`.
    #[inline]
    pub const fn apply(self, acc: u64, v: u64) -> u64 {
        match self {
            Combine::Sum => acc.wrapping_add(v),
            Combine::Max => {
                if v > acc {
                    v
                } else {
                    acc
                }
            }
            Combine::Last => v,
        }
    }

    /// As declared: `Sum`, `Max`, `Last`.
    pub const fn name(self) -> &'static str {
        match self {
            Combine::Sum => "Sum",
            Combine::Max => "Max",
            Combine::Last => "Last",
        }
    }
}

/// One declared counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterDecl {
    /// Its name: the field, the slot, the JSON key, the telemetry key, the summary's word.
    pub name: &'static str,
    /// Its doc comment, lines joined (with the leading spaces rustdoc keeps; see
    /// [`CounterDecl::doc`]).
    pub raw_doc: &'static str,
    pub combine: Combine,
}

impl CounterDecl {
    /// The doc comment as one line.
    pub fn doc(&self) -> String {
        self.raw_doc
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Where the counters of one declared set go among another set's slots, matched by name at
/// compile time: counter `i` of the first goes to the slot of the second named `prefix` +
/// its name, if there is one. A set that reports another's counters (the RDMA stage reports
/// its nodes') takes them this way instead of listing them again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NameMap<const N: usize>([Option<usize>; N]);

impl<const N: usize> NameMap<N> {
    /// The map from the names `from` (each after `prefix`) to their places in `to`.
    pub const fn new(from: &[&str; N], prefix: &str, to: &[&str]) -> Self {
        let mut map = [None; N];
        let mut i = 0;
        while i < N {
            let mut j = 0;
            while j < to.len() {
                if prefixed_eq(prefix, from[i], to[j]) {
                    map[i] = Some(j);
                    break;
                }
                j += 1;
            }
            i += 1;
        }
        NameMap(map)
    }

    /// Where counter `i` goes (None: the other set has no such counter).
    pub const fn target(&self, i: usize) -> Option<usize> {
        self.0[i]
    }

    /// Where each counter goes, in order.
    pub const fn targets(&self) -> &[Option<usize>; N] {
        &self.0
    }

    /// Copies `from`'s values into their places in `to`; the others are left as they are.
    #[inline]
    pub fn copy(&self, from: &[u64; N], to: &mut [u64]) {
        for (t, v) in self.0.iter().zip(from) {
            if let Some(t) = *t {
                to[t] = *v;
            }
        }
    }
}

/// Whether `prefix` followed by `name` is `whole`.
const fn prefixed_eq(prefix: &str, name: &str, whole: &str) -> bool {
    let (p, n, w) = (prefix.as_bytes(), name.as_bytes(), whole.as_bytes());
    if p.len() + n.len() != w.len() {
        return false;
    }
    let mut k = 0;
    while k < w.len() {
        let b = if k < p.len() { p[k] } else { n[k - p.len()] };
        if b != w[k] {
            return false;
        }
        k += 1;
    }
    true
}

#[doc(hidden)]
pub mod __private {
    pub use serde;
}

/// Declares a set of counters once; see [the crate](crate).
///
/// ```ignore
/// portico_counters::counter_set! {
///     /// What the stage counts.
///     pub struct MyCounters, slots MySlot {
///         /// Frames received.
///         received: Sum,
///         /// The deepest the queue was.
///         max_depth: Max,
///     }
/// }
/// ```
/// gives `struct MyCounters { pub received: u64, pub max_depth: u64 }`, `enum MySlot {
/// received, max_depth }` (`MySlot::max_depth as usize == 1`), `MyCounters::NAMES ==
/// ["received", "max_depth"]`, `MyCounters::DECLS`, `MyCounters::LEN`, and `combine`, `store`,
/// `load`, `from_pairs`, `values`, `iter` and `Serialize` on it. Every counter needs a doc.
#[macro_export]
macro_rules! counter_set {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident, slots $slot:ident {
            $(
                $(#[doc = $doc:literal])+
                $field:ident: $combine:ident,
            )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        $vis struct $name {
            $(
                $(#[doc = $doc])+
                pub $field: u64,
            )+
        }

        #[doc = concat!("The slots of [`", stringify!($name), "`]'s counters, in declaration order.")]
        #[allow(non_camel_case_types, dead_code)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        $vis enum $slot {
            $(
                $(#[doc = $doc])+
                $field,
            )+
        }

        #[allow(dead_code)]
        impl $slot {
            /// Every slot, in order.
            pub const ALL: [$slot; $name::LEN] = [$($slot::$field),+];

            /// Its index in the slots.
            #[inline]
            pub const fn index(self) -> usize {
                self as usize
            }
        }

        #[allow(dead_code)]
        impl $name {
            /// Every counter: name, doc and how it combines, in slot order.
            pub const DECLS: [$crate::CounterDecl; $name::LEN] = [$(
                $crate::CounterDecl {
                    name: stringify!($field),
                    raw_doc: concat!($($doc),+),
                    combine: $crate::Combine::$combine,
                }
            ),+];

            /// How many counters there are.
            pub const LEN: usize = [$(stringify!($field)),+].len();

            /// The counters' names, in slot order.
            pub const NAMES: [&'static str; $name::LEN] = [$(stringify!($field)),+];

            /// Combines `other` into `self`, each counter as declared.
            #[inline]
            pub fn combine(&mut self, other: &Self) {
                $(
                    self.$field = $crate::Combine::$combine
                        .apply(self.$field, other.$field);
                )+
            }

            /// The values, in slot order.
            #[inline]
            pub fn values(&self) -> [u64; $name::LEN] {
                [$(self.$field),+]
            }

            /// Writes the values into their slots (`slots` is at least [`Self::LEN`] long).
            #[inline]
            pub fn store(&self, slots: &mut [u64]) {
                slots[..Self::LEN].copy_from_slice(&self.values());
            }

            /// Reads the values from their slots (missing slots read 0).
            pub fn load(slots: &[u64]) -> Self {
                let at = |s: $slot| slots.get(s.index()).copied().unwrap_or(0);
                $name {
                    $($field: at($slot::$field),)+
                }
            }

            /// Reads the values from (name, value) pairs (a `WorkerReport`'s counters); names
            /// not declared are ignored, counters not given read 0.
            pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, u64)>) -> Self {
                let mut c = $name::default();
                for (n, v) in pairs {
                    match n {
                        $(stringify!($field) => c.$field = v,)+
                        _ => {}
                    }
                }
                c
            }

            /// (name, value) of every counter, in slot order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + use<> {
                Self::NAMES.into_iter().zip(self.values())
            }
        }

        impl $crate::__private::serde::Serialize for $name {
            fn serialize<S>(&self, s: S) -> ::core::result::Result<S::Ok, S::Error>
            where
                S: $crate::__private::serde::Serializer,
            {
                use $crate::__private::serde::ser::SerializeStruct;
                let mut st = s.serialize_struct(stringify!($name), $name::LEN)?;
                $(st.serialize_field(stringify!($field), &self.$field)?;)+
                st.end()
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::counter_set! {
        /// A set for the tests.
        struct Demo, slots DemoSlot {
            /// Frames received.
            received: Sum,
            /// The deepest the queue was,
            /// over two lines.
            max_depth: Max,
            /// The current setting.
            setting: Last,
        }
    }

    #[test]
    fn names_slots_and_docs_come_from_the_declaration() {
        assert_eq!(Demo::NAMES, ["received", "max_depth", "setting"]);
        assert_eq!(Demo::LEN, 3);
        assert_eq!(
            DemoSlot::ALL.map(DemoSlot::index),
            [0, 1, 2],
            "dense, in order"
        );
        assert_eq!(DemoSlot::max_depth as usize, 1);
        assert_eq!(
            Demo::DECLS[1].doc(),
            "The deepest the queue was, over two lines."
        );
        assert_eq!(Demo::DECLS[2].combine, Combine::Last);
    }

    #[test]
    fn combine_store_load_and_pairs() {
        let mut a = Demo {
            received: 3,
            max_depth: 10,
            setting: 1,
        };
        a.combine(&Demo {
            received: 4,
            max_depth: 7,
            setting: 2,
        });
        assert_eq!(
            a,
            Demo {
                received: 7,
                max_depth: 10,
                setting: 2
            }
        );
        let mut slots = [0u64; 5];
        a.store(&mut slots);
        assert_eq!(slots, [7, 10, 2, 0, 0]);
        assert_eq!(Demo::load(&slots), a);
        assert_eq!(Demo::load(&slots[..1]).max_depth, 0);
        let pairs = a
            .iter()
            .map(|(n, v)| (n.to_string(), v))
            .collect::<Vec<_>>();
        assert_eq!(
            Demo::from_pairs(
                pairs
                    .iter()
                    .map(|(n, v)| (n.as_str(), *v))
                    .chain([("other", 9)])
            ),
            a
        );
        assert_eq!(Combine::Sum.apply(u64::MAX, 1), 0, "wraps, never panics");
    }

    #[test]
    fn name_maps_match_names_after_a_prefix() {
        let m = NameMap::new(&["dropped", "received", "other"], "tag_", &Demo::NAMES);
        assert_eq!([m.target(0), m.target(1), m.target(2)], [None, None, None]);
        let m = NameMap::new(
            &["setting", "received", "late"],
            "",
            &["received", "max_depth", "setting"],
        );
        assert_eq!(
            [m.target(0), m.target(1), m.target(2)],
            [Some(2), Some(0), None]
        );
        let m = NameMap::new(&["depth", "x"], "max_", &Demo::NAMES);
        assert_eq!(m.target(0), Some(1));
        let mut to = [7; 3];
        m.copy(&[5, 6], &mut to);
        assert_eq!(to, [7, 5, 7], "only the matched slot is written");
        assert!(!prefixed_eq("a", "b", "a"));
        assert!(!prefixed_eq("", "ab", "ac"));
    }

    #[test]
    fn serialises_one_key_per_counter_in_order() {
        let d = Demo {
            received: 1,
            max_depth: 2,
            setting: 3,
        };
        assert_eq!(
            serde_json::to_string(&d).unwrap(),
            r#"{"received":1,"max_depth":2,"setting":3}"#
        );
    }
}
