//! libfabric's capability, operation-flag, mode and order bits as `u64` (the headers define
//! them as `1ULL << n` macros, which bindgen types unevenly); a test checks each against the
//! bound headers.
#![allow(dead_code)]

pub const MSG: u64 = 1 << 1;
pub const RMA: u64 = 1 << 2;
pub const TAGGED: u64 = 1 << 3;
pub const ATOMIC: u64 = 1 << 4;
pub const READ: u64 = 1 << 8;
pub const WRITE: u64 = 1 << 9;
pub const RECV: u64 = 1 << 10;
pub const SEND: u64 = 1 << 11;
pub const TRANSMIT: u64 = SEND;
pub const REMOTE_READ: u64 = 1 << 12;
pub const REMOTE_WRITE: u64 = 1 << 13;
pub const MULTI_RECV: u64 = 1 << 16;
pub const REMOTE_CQ_DATA: u64 = 1 << 17;
pub const MORE: u64 = 1 << 18;
pub const PEEK: u64 = 1 << 19;
pub const COMPLETION: u64 = 1 << 24;
pub const INJECT: u64 = 1 << 25;
pub const INJECT_COMPLETE: u64 = 1 << 26;
pub const TRANSMIT_COMPLETE: u64 = 1 << 27;
pub const DELIVERY_COMPLETE: u64 = 1 << 28;
pub const COMMIT_COMPLETE: u64 = 1 << 30;
pub const RMA_PMEM: u64 = 1 << 49;
pub const LOCAL_COMM: u64 = 1 << 51;
pub const REMOTE_COMM: u64 = 1 << 52;
pub const RMA_EVENT: u64 = 1 << 56;
pub const SOURCE: u64 = 1 << 57;
pub const DIRECTED_RECV: u64 = 1 << 59;
pub const CLAIM: u64 = 1 << 59;
pub const DISCARD: u64 = 1 << 58;
pub const SELECTIVE_COMPLETION: u64 = 1 << 59;

pub const CONTEXT: u64 = 1 << 59;
pub const CONTEXT2: u64 = 1 << 52;
pub const MSG_PREFIX: u64 = 1 << 58;

pub const ORDER_RAR: u64 = 1 << 0;
pub const ORDER_RAW: u64 = 1 << 1;
pub const ORDER_WAR: u64 = 1 << 3;
pub const ORDER_WAW: u64 = 1 << 4;
pub const ORDER_SAR: u64 = 1 << 6;
pub const ORDER_SAW: u64 = 1 << 7;
pub const ORDER_SAS: u64 = 1 << 8;

/// The MR mode bits (API 1.5 and later).
pub const MR_LOCAL: u64 = 1 << 2;
pub const MR_VIRT_ADDR: u64 = 1 << 4;
pub const MR_ALLOCATED: u64 = 1 << 5;
pub const MR_PROV_KEY: u64 = 1 << 6;
/// The old enum's values (API before 1.5): `FI_MR_BASIC` and `FI_MR_SCALABLE`.
pub const MR_BASIC: u64 = 1;
pub const MR_SCALABLE: u64 = 2;

pub const ADDR_UNSPEC: u64 = u64::MAX;
/// `FI_TAG_GENERIC`: every bit of the tag is the application's.
pub const TAG_GENERIC: u64 = 0xAAAA_AAAA_AAAA_AAAA;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys;

    #[test]
    fn the_bits_are_the_headers() {
        let pairs: &[(u64, u64)] = &[
            (MSG, sys::FI_MSG as u64),
            (RMA, sys::FI_RMA as u64),
            (TAGGED, sys::FI_TAGGED as u64),
            (RECV, sys::FI_RECV as u64),
            (SEND, sys::FI_SEND as u64),
            (REMOTE_CQ_DATA, sys::FI_REMOTE_CQ_DATA as u64),
            (PEEK, sys::FI_PEEK as u64),
            (COMPLETION, sys::FI_COMPLETION as u64),
            (INJECT, sys::FI_INJECT as u64),
            (TRANSMIT_COMPLETE, sys::FI_TRANSMIT_COMPLETE as u64),
            (DELIVERY_COMPLETE, sys::FI_DELIVERY_COMPLETE as u64),
            (SOURCE, sys::FI_SOURCE),
            (DIRECTED_RECV, sys::FI_DIRECTED_RECV),
            (CLAIM, sys::FI_CLAIM),
            (DISCARD, sys::FI_DISCARD),
            (SELECTIVE_COMPLETION, sys::FI_SELECTIVE_COMPLETION),
            (MR_LOCAL, sys::FI_MR_LOCAL as u64),
            (MR_BASIC, sys::FI_MR_BASIC as u64),
            (ORDER_SAS, sys::FI_ORDER_SAS as u64),
        ];
        for (i, (ours, theirs)) in pairs.iter().enumerate() {
            assert_eq!(ours, theirs, "pair {i}");
        }
    }
}
