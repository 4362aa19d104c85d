//! libfabric's traffic classes (`fi_tx_attr::tclass`, `fi_domain_attr::tclass`) onto the
//! engine's (seed 000), pure. An endpoint's class is its connections': each (peer, class) has
//! a queue pair of its own, in the traffic-shaper class named as the libfabric class is
//! (`FI_PORTICO_SHAPER`'s `[[shaper.classes]]` `name`), and with `FI_TC_DSCP` that DSCP on the
//! wire. See `docs/libfabric.md`, "Traffic classes".

/// `FI_TC_UNSPEC`: the domain's class (else the engine's defaults).
pub const UNSPEC: u32 = 0;
/// `FI_TC_DSCP`: the low six bits are a DSCP.
pub const DSCP: u32 = 0x100;
/// `FI_TC_LABEL`, the first label (`FI_TC_BEST_EFFORT`).
pub const LABEL: u32 = 0x200;

/// The labels' names, from `FI_TC_BEST_EFFORT` (`FI_TC_LABEL`) on, as shaper classes are named
/// for them.
pub const LABELS: [&str; 6] = [
    "best_effort",
    "low_latency",
    "dedicated_access",
    "bulk_data",
    "scavenger",
    "network_ctrl",
];

/// Whether `tc` is a traffic class libfabric 1.17 defines.
pub fn valid(tc: u32) -> bool {
    tc == UNSPEC || (tc & !0x3f) == DSCP || (LABEL..LABEL + LABELS.len() as u32).contains(&tc)
}

/// The name a shaper class answers to for `tc`: a label's (`low_latency`), or `dscpN`;
/// `None` for `FI_TC_UNSPEC` or a value libfabric does not define.
pub fn name(tc: u32) -> Option<String> {
    if !valid(tc) || tc == UNSPEC {
        return None;
    }
    if tc & DSCP != 0 {
        return Some(format!("dscp{}", tc & 0x3f));
    }
    Some(LABELS[(tc - LABEL) as usize].to_string())
}

/// Where an endpoint of class `tc` (`FI_TC_UNSPEC` already replaced by the domain's) puts its
/// requests: the shaper class whose name is the class's (else `None`: class 0, the engine's
/// default), and the DSCP `FI_TC_DSCP` names (else `None`: the engine's, 26). `classes`: the
/// shaper's class names, in order (empty without a shaper).
pub fn place(tc: u32, classes: &[String]) -> (Option<u8>, Option<u8>) {
    let class = name(tc)
        .and_then(|n| classes.iter().position(|c| *c == n))
        .map(|i| i as u8);
    let dscp = (valid(tc) && tc & DSCP != 0).then_some((tc & 0x3f) as u8);
    (class, dscp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_values_are_libfabrics() {
        // fabric.h: enum { FI_TC_UNSPEC = 0, FI_TC_DSCP = 0x100, FI_TC_LABEL = 0x200,
        // FI_TC_BEST_EFFORT = FI_TC_LABEL, FI_TC_LOW_LATENCY, ... FI_TC_NETWORK_CTRL }.
        assert_eq!(crate::sys::FI_TC_UNSPEC, UNSPEC);
        assert_eq!(crate::sys::FI_TC_DSCP, DSCP);
        assert_eq!(crate::sys::FI_TC_LABEL, LABEL);
        assert_eq!(crate::sys::FI_TC_LOW_LATENCY, LABEL + 1);
        assert_eq!(crate::sys::FI_TC_BULK_DATA, LABEL + 3);
        assert_eq!(crate::sys::FI_TC_NETWORK_CTRL, LABEL + 5);
    }

    #[test]
    fn labels_and_dscps_find_their_shaper_classes() {
        let classes: Vec<String> = ["bulk_data", "low_latency", "dscp46"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(place(LABEL + 1, &classes), (Some(1), None), "low_latency");
        assert_eq!(place(LABEL + 3, &classes), (Some(0), None), "bulk_data");
        assert_eq!(place(DSCP | 46, &classes), (Some(2), Some(46)));
        // A class no shaper class is named for goes in class 0 (the default).
        assert_eq!(place(LABEL + 4, &classes), (None, None), "scavenger");
        assert_eq!(place(DSCP | 10, &classes), (None, Some(10)));
        assert_eq!(place(UNSPEC, &classes), (None, None));
        // Without a shaper only the DSCP means anything.
        assert_eq!(place(DSCP | 46, &[]), (None, Some(46)));
    }

    #[test]
    fn values_libfabric_does_not_define_are_refused() {
        for tc in [1, 0x140, 0x206, 0x300, u32::MAX] {
            assert!(!valid(tc), "{tc:#x}");
            assert_eq!(place(tc, &["x".to_string()]), (None, None));
        }
        for tc in [0, 0x100, 0x13f, 0x200, 0x205] {
            assert!(valid(tc), "{tc:#x}");
        }
    }
}
