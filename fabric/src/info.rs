//! What the provider offers (`fi_getinfo`), and the check of an application's hints against it,
//! pure: [`Hints`] is read out of the C `fi_info` at the FFI boundary, [`Offer`] written back
//! into one there. The rules are `fi_getinfo(3)`'s: every capability, mode bit, order and
//! attribute the application asks for must be one the provider has; a mode bit the provider
//! needs must be one the application accepts; what the application leaves unspecified gets the
//! provider's value.

use crate::addr::EpAddr;
use crate::flags::*;

/// The provider's name, as `fi_info -p` takes it.
pub const PROVIDER: &str = "portico";
/// The fabric's name.
pub const FABRIC: &str = "portico";

/// Primary capabilities: what endpoints can do.
pub const PRIMARY: u64 =
    MSG | TAGGED | RMA | READ | WRITE | RECV | SEND | REMOTE_READ | REMOTE_WRITE;
/// Secondary capabilities the provider has (`FI_SOURCE`, `FI_DIRECTED_RECV` and
/// `FI_RMA_PMEM` only when asked for).
pub const SECONDARY: u64 = SOURCE | DIRECTED_RECV | LOCAL_COMM | REMOTE_COMM | RMA_PMEM;
/// Secondary capabilities offered only to an application that asks for them.
const ON_REQUEST: u64 = SOURCE | DIRECTED_RECV | RMA_PMEM;
/// Operation flags endpoints accept. Every completion level up to `FI_COMMIT_COMPLETE`: a
/// WRITE completes on its ACK, which the target sends once the data is in place (delivery),
/// and with `FI_COMMIT_COMPLETE` it is a durable WRITE (seed 004), complete on the durable ACK.
pub const OP_FLAGS: u64 = COMPLETION
    | INJECT
    | INJECT_COMPLETE
    | TRANSMIT_COMPLETE
    | DELIVERY_COMPLETE
    | COMMIT_COMPLETE
    | REMOTE_CQ_DATA;
/// The orders one reliable connection per direction gives.
pub const ORDERS: u64 =
    ORDER_RAR | ORDER_RAW | ORDER_WAR | ORDER_WAW | ORDER_SAR | ORDER_SAW | ORDER_SAS;
/// MR modes of API 1.5 and later: keys the provider chooses, remote addresses as virtual
/// addresses, registration of allocated memory. No `FI_MR_LOCAL`: every local buffer works
/// without a descriptor (the engine runs in the process, so its whole address space is
/// registered for local access, as an implicit on-demand-paging MR is in verbs).
pub const MR_MODE: u64 = MR_PROV_KEY | MR_VIRT_ADDR | MR_ALLOCATED;

/// Bytes that `fi_inject` copies (the buffer is the application's again on return).
pub const INJECT_SIZE: usize = 256;
/// The largest message.
pub const MAX_MSG_SIZE: u64 = 1 << 30;
/// Work requests an endpoint holds at once, per direction.
pub const QUEUE_SIZE: usize = 1024;
/// Remote CQ data: 4 bytes (the immediate of a WRITE; tagged and untagged sends carry 8, the
/// domain states the smaller).
pub const CQ_DATA_SIZE: usize = 4;

// libfabric's enum values (fi_ep_type, fi_threading, fi_progress, fi_av_type, addr formats).
pub const EP_UNSPEC: u32 = 0;
pub const EP_MSG: u32 = 1;
pub const EP_RDM: u32 = 3;
pub const THREAD_UNSPEC: u32 = 0;
pub const THREAD_SAFE: u32 = 1;
pub const THREAD_COMPLETION: u32 = 3;
pub const THREAD_DOMAIN: u32 = 4;
pub const PROGRESS_UNSPEC: u32 = 0;
pub const PROGRESS_AUTO: u32 = 1;
pub const PROGRESS_MANUAL: u32 = 2;
pub const AV_UNSPEC: u32 = 0;
pub const AV_MAP: u32 = 1;
pub const AV_TABLE: u32 = 2;
pub const FORMAT_UNSPEC: u32 = 0;
pub const SOCKADDR_IN: u32 = 2;
pub const RM_UNSPEC: u32 = 0;
pub const RM_ENABLED: u32 = 2;

/// An application's hints, as far as the provider looks at them (zero: unspecified).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hints {
    pub api_version: u32,
    pub caps: u64,
    pub mode: u64,
    pub addr_format: u32,
    pub src_addr: Option<Vec<u8>>,
    pub dest_addr: Option<Vec<u8>>,
    pub ep_type: u32,
    pub max_msg_size: u64,
    pub mem_tag_format: u64,
    pub tx_caps: u64,
    pub tx_mode: u64,
    pub tx_op_flags: u64,
    pub tx_msg_order: u64,
    pub tx_inject_size: usize,
    pub tx_size: usize,
    pub tx_iov_limit: usize,
    pub rx_caps: u64,
    pub rx_mode: u64,
    pub rx_op_flags: u64,
    pub rx_msg_order: u64,
    pub threading: u32,
    pub control_progress: u32,
    pub data_progress: u32,
    pub av_type: u32,
    pub mr_mode: u64,
    pub resource_mgmt: u32,
    pub cq_data_size: usize,
    /// `tx_attr.tclass`, else `domain_attr.tclass` (`crate::tclass`).
    pub tclass: u32,
    pub domain_name: Option<String>,
    pub fabric_name: Option<String>,
    pub prov_name: Option<String>,
}

/// One `fi_info` the provider returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    pub caps: u64,
    pub mode: u64,
    pub ep_type: u32,
    pub src_addr: EpAddr,
    pub dest_addr: Option<EpAddr>,
    pub tx_op_flags: u64,
    pub rx_op_flags: u64,
    pub msg_order: u64,
    pub threading: u32,
    pub control_progress: u32,
    pub data_progress: u32,
    pub av_type: u32,
    pub mr_mode: u64,
    pub domain_name: String,
    pub endpoints: u16,
    /// The traffic class asked for (`FI_TC_UNSPEC`: the engine's default class).
    pub tclass: u32,
}

/// Why the hints ask for what the provider does not have (logged at info level by the caller;
/// `fi_getinfo` then returns `-FI_ENODATA`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("hints not met: {0}")]
pub struct Mismatch(pub String);

fn no(why: impl Into<String>) -> Result<Offer, Mismatch> {
    Err(Mismatch(why.into()))
}

/// The domain's name: the port's devargs up to the first comma (`net_memif0`, `0000:3b:00.0`).
pub fn domain_name(dev: &str) -> String {
    dev.split(',').next().unwrap_or(dev).to_string()
}

/// The API version as libfabric encodes it.
pub const fn version(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

/// Checks `hints` against what the provider has on the engine named by `local` (the address
/// of endpoint 0) and `dev`.
pub fn offer(
    hints: Option<&Hints>,
    local: EpAddr,
    dev: &str,
    endpoints: u16,
) -> Result<Offer, Mismatch> {
    offer_type(hints, EP_RDM, local, dev, endpoints)
}

/// Every endpoint type the hints allow, RDM first: each type's offer, or why none fits (the
/// reason for the type the hints asked for, else RDM's).
pub fn offers(
    hints: Option<&Hints>,
    rdm_local: EpAddr,
    msg_local: EpAddr,
    dev: &str,
    endpoints: u16,
    for_layering: bool,
) -> Result<Vec<Offer>, Mismatch> {
    let rdm = offer_type(hints, EP_RDM, rdm_local, dev, endpoints);
    // Message endpoints are not offered to a utility provider (ofi_rxm) looking for a core
    // to layer over, unless the parameters allow it: its RDM over Portico's connections would
    // be listed ahead of Portico's own RDM, whose tagged messages the list-processing engine
    // matches, and an application asking for "portico" would get it.
    let msg = if for_layering {
        no(format!(
            "endpoint type {EP_MSG}: not offered to utility providers (FI_PORTICO_LAYERING=1 allows it)"
        ))
    } else {
        offer_type(hints, EP_MSG, msg_local, dev, endpoints)
    };
    match (rdm, msg) {
        (Err(e), Err(m)) => Err(if hints.is_some_and(|h| h.ep_type == EP_MSG) {
            m
        } else {
            e
        }),
        (r, m) => Ok(r.into_iter().chain(m).collect()),
    }
}

/// The offer of one endpoint type.
pub fn offer_type(
    hints: Option<&Hints>,
    ep_type: u32,
    local: EpAddr,
    dev: &str,
    endpoints: u16,
) -> Result<Offer, Mismatch> {
    let domain = domain_name(dev);
    let default = Hints {
        api_version: version(1, 17),
        ..Hints::default()
    };
    let h = hints.unwrap_or(&default);
    if let Some(p) = &h.prov_name
        && !names_provider(p)
    {
        return no(format!("provider {p:?}"));
    }
    if let Some(f) = &h.fabric_name
        && f != FABRIC
    {
        return no(format!("fabric {f:?} (this is {FABRIC:?})"));
    }
    if let Some(d) = &h.domain_name
        && *d != domain
    {
        return no(format!("domain {d:?} (this is {domain:?})"));
    }
    if h.ep_type != EP_UNSPEC && h.ep_type != ep_type {
        return no(format!(
            "endpoint type {} (FI_EP_RDM and FI_EP_MSG only)",
            h.ep_type
        ));
    }
    // A message endpoint is one connection: no tag matching, no source to tell apart.
    let (primary, secondary) = if ep_type == EP_MSG {
        (PRIMARY & !TAGGED, LOCAL_COMM | REMOTE_COMM | RMA_PMEM)
    } else {
        (PRIMARY, SECONDARY)
    };
    let all = primary | secondary;
    for (what, caps) in [
        ("caps", h.caps),
        ("tx caps", h.tx_caps),
        ("rx caps", h.rx_caps),
    ] {
        if caps & !all != 0 {
            return no(format!("{what} {:#x} beyond {all:#x}", caps & !all));
        }
    }
    if !matches!(h.addr_format, FORMAT_UNSPEC | SOCKADDR_IN) {
        return no(format!(
            "address format {} (FI_SOCKADDR_IN only)",
            h.addr_format
        ));
    }
    let dest_addr = match &h.dest_addr {
        Some(b) => Some(
            EpAddr::parse(b)
                .ok_or_else(|| Mismatch("dest_addr is not a Portico address".into()))?,
        ),
        None => None,
    };
    let mut src_addr = local;
    if let Some(b) = &h.src_addr {
        let a =
            EpAddr::parse(b).ok_or_else(|| Mismatch("src_addr is not a Portico address".into()))?;
        if a.ip != local.ip {
            return no(format!(
                "src_addr {} is not this engine's ({})",
                a.ip, local.ip
            ));
        }
        src_addr = a;
    }
    if h.max_msg_size > MAX_MSG_SIZE {
        return no(format!("max_msg_size {} > {MAX_MSG_SIZE}", h.max_msg_size));
    }
    if h.tx_inject_size > INJECT_SIZE {
        return no(format!("inject_size {} > {INJECT_SIZE}", h.tx_inject_size));
    }
    if h.tx_size > QUEUE_SIZE {
        return no(format!("tx size {} > {QUEUE_SIZE}", h.tx_size));
    }
    if h.tx_iov_limit > crate::engine::MAX_IOV {
        return no(format!(
            "tx iov_limit {} (at most {} entries per send or RMA)",
            h.tx_iov_limit,
            crate::engine::MAX_IOV
        ));
    }
    for (what, flags) in [
        ("tx op_flags", h.tx_op_flags),
        ("rx op_flags", h.rx_op_flags),
    ] {
        if flags & !OP_FLAGS != 0 {
            return no(format!("{what} {:#x}", flags & !OP_FLAGS));
        }
    }
    for (what, order) in [
        ("tx msg_order", h.tx_msg_order),
        ("rx msg_order", h.rx_msg_order),
    ] {
        if order & !ORDERS != 0 {
            return no(format!("{what} {:#x}", order & !ORDERS));
        }
    }
    if !matches!(
        h.threading,
        THREAD_UNSPEC | THREAD_SAFE | THREAD_DOMAIN | THREAD_COMPLETION | 2 | 5
    ) {
        return no(format!("threading {}", h.threading));
    }
    for (what, p) in [
        ("control_progress", h.control_progress),
        ("data_progress", h.data_progress),
    ] {
        if !matches!(p, PROGRESS_UNSPEC | PROGRESS_AUTO | PROGRESS_MANUAL) {
            return no(format!("{what} {p}"));
        }
    }
    if !matches!(h.av_type, AV_UNSPEC | AV_MAP | AV_TABLE) {
        return no(format!("av_type {}", h.av_type));
    }
    if !crate::tclass::valid(h.tclass) {
        return no(format!(
            "tclass {:#x} (not a class libfabric defines)",
            h.tclass
        ));
    }
    if h.cq_data_size > CQ_DATA_SIZE {
        return no(format!("cq_data_size {} > {CQ_DATA_SIZE}", h.cq_data_size));
    }
    let old_api = h.api_version < version(1, 5);
    let mr_mode = if old_api {
        // Before 1.5 the MR mode was an enum: BASIC is exactly what Portico's keys are.
        match h.mr_mode {
            0 | MR_BASIC => MR_BASIC,
            m => return no(format!("mr_mode {m} (FI_MR_BASIC only)")),
        }
    } else {
        let m = if h.mr_mode == MR_BASIC {
            MR_PROV_KEY | MR_VIRT_ADDR | MR_ALLOCATED
        } else {
            h.mr_mode
        };
        if m != 0 && m & MR_MODE != MR_MODE {
            return no(format!(
                "mr_mode {m:#x} lacks {:#x} (FI_MR_PROV_KEY, FI_MR_VIRT_ADDR, FI_MR_ALLOCATED)",
                MR_MODE & !m
            ));
        }
        MR_MODE
    };
    let caps = if h.caps == 0 {
        primary | secondary
    } else {
        with_implied(h.caps) | (secondary & !ON_REQUEST) | (h.caps & secondary)
    };
    Ok(Offer {
        caps,
        mode: 0,
        ep_type,
        src_addr,
        dest_addr,
        tx_op_flags: if h.tx_op_flags == 0 {
            TRANSMIT_COMPLETE
        } else {
            h.tx_op_flags
        },
        rx_op_flags: h.rx_op_flags,
        msg_order: ORDERS,
        threading: if h.threading == THREAD_UNSPEC {
            THREAD_SAFE
        } else {
            h.threading
        },
        control_progress: if h.control_progress == PROGRESS_UNSPEC {
            PROGRESS_AUTO
        } else {
            h.control_progress
        },
        data_progress: if h.data_progress == PROGRESS_UNSPEC {
            PROGRESS_AUTO
        } else {
            h.data_progress
        },
        av_type: if h.av_type == AV_UNSPEC {
            AV_TABLE
        } else {
            h.av_type
        },
        mr_mode,
        domain_name: domain,
        endpoints,
        tclass: h.tclass,
    })
}

/// Whether a `prov_name` hint names this provider: a `;`-separated list whose entries are
/// names, or names after `^` that are excluded (`portico;^ofi_rxm` is what a utility provider
/// asks of a core provider it may not layer over itself).
fn names_provider(list: &str) -> bool {
    list.split(';')
        .any(|n| !n.starts_with('^') && n.eq_ignore_ascii_case(PROVIDER))
}

/// A primary capability with the directions it implies when none is named (`FI_MSG` alone
/// means sending and receiving; `FI_RMA` alone, all four RMA directions).
fn with_implied(caps: u64) -> u64 {
    let mut c = caps & PRIMARY;
    if c & (MSG | TAGGED) != 0 && c & (SEND | RECV) == 0 {
        c |= SEND | RECV;
    }
    if c & RMA != 0 && c & (READ | WRITE | REMOTE_READ | REMOTE_WRITE) == 0 {
        c |= READ | WRITE | REMOTE_READ | REMOTE_WRITE;
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn local() -> EpAddr {
        EpAddr {
            ip: Ipv4Addr::new(10, 0, 0, 1),
            port: 7471,
            index: 0,
        }
    }

    fn hints() -> Hints {
        Hints {
            api_version: version(1, 17),
            ..Hints::default()
        }
    }

    #[test]
    fn no_hints_get_everything() {
        let o = offer(None, local(), "net_memif0,role=server", 4).unwrap();
        assert_eq!(o.caps, PRIMARY | SECONDARY);
        assert_eq!(o.domain_name, "net_memif0");
        assert_eq!(
            (o.ep_type, o.threading, o.av_type, o.mr_mode),
            (EP_RDM, THREAD_SAFE, AV_TABLE, MR_MODE)
        );
        assert_eq!(o.mode, 0, "the provider asks for no mode bit");
    }

    #[test]
    fn pingpong_and_open_mpi_hints_are_met() {
        // fi_pingpong -e rdm: FI_MSG, three mode bits offered, FI_MR_LOCAL plus the basic map.
        let mut h = hints();
        h.ep_type = EP_RDM;
        h.caps = MSG;
        h.mode = CONTEXT | CONTEXT2 | MSG_PREFIX;
        h.mr_mode = MR_LOCAL | MR_ALLOCATED | MR_PROV_KEY | MR_VIRT_ADDR;
        let o = offer(Some(&h), local(), "net_memif0", 4).unwrap();
        assert_eq!(o.caps & PRIMARY, MSG | SEND | RECV);
        assert_eq!(o.mr_mode, MR_MODE, "FI_MR_LOCAL is not needed");
        // Open MPI's mtl ofi (API 1.0): FI_TAGGED, FI_CONTEXT, SAS order, FI_AV_MAP.
        let mut h = hints();
        h.api_version = version(1, 0);
        h.caps = TAGGED;
        h.mode = CONTEXT;
        h.tx_msg_order = ORDER_SAS;
        h.rx_msg_order = ORDER_SAS;
        h.av_type = AV_MAP;
        h.tx_op_flags = COMPLETION;
        h.rx_op_flags = COMPLETION;
        let o = offer(Some(&h), local(), "net_memif0", 4).unwrap();
        assert_eq!(o.mr_mode, MR_BASIC, "the old enum's BASIC before API 1.5");
        assert_eq!(o.av_type, AV_MAP);
        assert_eq!(o.caps & PRIMARY, TAGGED | SEND | RECV);
    }

    #[test]
    fn what_the_provider_lacks_is_refused_with_a_reason() {
        let cases: Vec<(Hints, &str)> = vec![
            (
                Hints {
                    ep_type: 2,
                    ..hints()
                },
                "endpoint type 2",
            ),
            (
                Hints {
                    caps: 1 << 4,
                    ..hints()
                },
                "caps 0x10",
            ),
            (
                Hints {
                    addr_format: 3,
                    ..hints()
                },
                "address format 3",
            ),
            (
                Hints {
                    mr_mode: MR_LOCAL,
                    ..hints()
                },
                "mr_mode 0x4 lacks 0x70",
            ),
            (
                Hints {
                    prov_name: Some("tcp".into()),
                    ..hints()
                },
                "provider \"tcp\"",
            ),
            (
                Hints {
                    domain_name: Some("mlx5_0".into()),
                    ..hints()
                },
                "domain \"mlx5_0\"",
            ),
            (
                Hints {
                    tx_inject_size: 4096,
                    ..hints()
                },
                "inject_size 4096",
            ),
            (
                Hints {
                    cq_data_size: 8,
                    ..hints()
                },
                "cq_data_size 8",
            ),
            (
                Hints {
                    dest_addr: Some(vec![1, 2, 3]),
                    ..hints()
                },
                "dest_addr is not a Portico address",
            ),
        ];
        for (h, want) in cases {
            let e = offer(Some(&h), local(), "net_tap0", 4).unwrap_err();
            assert!(e.0.starts_with(want), "{e} (wanted {want})");
        }
    }

    #[test]
    fn provider_name_lists_are_read_as_libfabric_writes_them() {
        assert!(names_provider("portico"));
        assert!(names_provider("PORTICO"));
        assert!(names_provider("portico;^ofi_rxm"));
        assert!(names_provider("ofi_rxm;portico"));
        assert!(!names_provider("^portico"));
        assert!(!names_provider("tcp;ofi_rxm"));
        assert!(!names_provider("porticox"));
    }

    #[test]
    fn message_endpoints_are_offered_beside_rdm_without_tag_matching() {
        let msg_local = EpAddr {
            port: 7475,
            ..local()
        };
        let count = |h: &Hints, layering: bool| {
            offers(Some(h), local(), msg_local, "net_tap0", 4, layering).map(|v| v.len())
        };
        let all = offers(None, local(), msg_local, "net_tap0", 4, false).unwrap();
        assert_eq!(
            all.iter().map(|o| o.ep_type).collect::<Vec<_>>(),
            [EP_RDM, EP_MSG]
        );
        assert_eq!(all[1].caps & TAGGED, 0);
        assert_eq!(all[1].src_addr.port, 7475);
        let msg = Hints {
            ep_type: EP_MSG,
            ..hints()
        };
        assert_eq!(count(&msg, false), Ok(1));
        // A utility provider looking for a core to layer over: no MSG, so its RDM cannot be
        // listed ahead of Portico's own.
        let e = count(&msg, true).unwrap_err();
        assert!(e.0.contains("not offered to utility providers"), "{e}");
        let tagged_msg = Hints {
            caps: TAGGED,
            ..msg
        };
        let e = count(&tagged_msg, false).unwrap_err();
        assert!(e.0.starts_with("caps 0x8"), "{e}");
        let tagged = Hints {
            caps: TAGGED,
            ..hints()
        };
        assert_eq!(count(&tagged, false), Ok(1), "RDM only");
    }

    #[test]
    fn a_source_address_must_be_this_engine() {
        let mut other = local();
        other.ip = Ipv4Addr::new(10, 0, 0, 9);
        let h = Hints {
            src_addr: Some(other.to_bytes().to_vec()),
            ..hints()
        };
        assert!(offer(Some(&h), local(), "net_tap0", 4).is_err());
        let mut mine = local();
        mine.index = 2;
        let h = Hints {
            src_addr: Some(mine.to_bytes().to_vec()),
            ..hints()
        };
        assert_eq!(
            offer(Some(&h), local(), "net_tap0", 4).unwrap().src_addr,
            mine
        );
    }
}
