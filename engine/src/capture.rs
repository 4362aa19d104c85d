//! Packet capture in pcapng, the format Wireshark and tshark read natively. One interface per
//! port (named after it), nanosecond timestamps, and each packet marked inbound or outbound, so
//! a whole run with several ports opens as one file. Pure: it writes to any `io::Write`, and
//! the worker loop feeds it (see `runtime`), one lock per burst, only when `--pcap` is given.
//!
//! Blocks written (pcapng, draft-ietf-opsawg-pcapng), little-endian:
//! - Section Header Block (type 0x0A0D0D0A, byte-order magic 0x1A2B3C4D, version 1.0);
//! - one Interface Description Block per port (type 1): link type 1 (Ethernet), snap length,
//!   options `if_name` (2) and `if_tsresol` (9) = 9, i.e. nanoseconds;
//! - one Enhanced Packet Block per packet (type 6): interface id, 64-bit timestamp, captured
//!   and original length, the data padded to 4 bytes, option `epb_flags` (2) with the
//!   direction in bits 0–1 (1 inbound, 2 outbound).

use std::io::{self, Write};

const SHB: u32 = 0x0A0D_0D0A;
const IDB: u32 = 0x0000_0001;
const EPB: u32 = 0x0000_0006;
const BYTE_ORDER_MAGIC: u32 = 0x1A2B_3C4D;
const LINKTYPE_ETHERNET: u16 = 1;
const OPT_END: u16 = 0;
const OPT_IF_NAME: u16 = 2;
const OPT_IF_TSRESOL: u16 = 9;
const OPT_EPB_FLAGS: u16 = 2;
/// Longest frame kept whole; longer ones are cut (their original length is still recorded).
pub const SNAPLEN: u32 = 16384;

/// Which way a packet went through its port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Inbound,
    Outbound,
}

fn pad4(n: usize) -> usize {
    (4 - n % 4) % 4
}

/// Appends one pcapng option (code, length, value, padding) to `out`.
fn option(out: &mut Vec<u8>, code: u16, value: &[u8]) {
    out.extend_from_slice(&code.to_le_bytes());
    out.extend_from_slice(&(value.len() as u16).to_le_bytes());
    out.extend_from_slice(value);
    out.extend(std::iter::repeat_n(0u8, pad4(value.len())));
}

/// Appends a whole block: type, total length, body, total length again.
fn block(out: &mut Vec<u8>, kind: u32, body: &[u8]) {
    let total = (12 + body.len()) as u32;
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&total.to_le_bytes());
    out.extend_from_slice(body);
    out.extend_from_slice(&total.to_le_bytes());
}

/// The section header and one interface description per port, in interface-id order.
pub fn file_header(interfaces: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut shb = Vec::new();
    shb.extend_from_slice(&BYTE_ORDER_MAGIC.to_le_bytes());
    shb.extend_from_slice(&1u16.to_le_bytes()); // major
    shb.extend_from_slice(&0u16.to_le_bytes()); // minor
    shb.extend_from_slice(&(-1i64).to_le_bytes()); // section length: not given
    option(&mut shb, OPT_END, &[]);
    block(&mut out, SHB, &shb);
    for name in interfaces {
        let mut idb = Vec::new();
        idb.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        idb.extend_from_slice(&0u16.to_le_bytes());
        idb.extend_from_slice(&SNAPLEN.to_le_bytes());
        option(&mut idb, OPT_IF_NAME, name.as_bytes());
        option(&mut idb, OPT_IF_TSRESOL, &[9]);
        option(&mut idb, OPT_END, &[]);
        block(&mut out, IDB, &idb);
    }
    out
}

/// Appends an Enhanced Packet Block for `data` to `out`, without allocating when `out` has room.
pub fn packet_record(out: &mut Vec<u8>, interface: u32, ts_ns: u64, dir: Direction, data: &[u8]) {
    let captured = data.len().min(SNAPLEN as usize);
    let body_len = 20 + captured + pad4(captured) + 8 + 4;
    let total = (12 + body_len) as u32;
    out.extend_from_slice(&EPB.to_le_bytes());
    out.extend_from_slice(&total.to_le_bytes());
    out.extend_from_slice(&interface.to_le_bytes());
    out.extend_from_slice(&((ts_ns >> 32) as u32).to_le_bytes());
    out.extend_from_slice(&(ts_ns as u32).to_le_bytes());
    out.extend_from_slice(&(captured as u32).to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(&data[..captured]);
    out.extend(std::iter::repeat_n(0u8, pad4(captured)));
    let flags: u32 = match dir {
        Direction::Inbound => 1,
        Direction::Outbound => 2,
    };
    out.extend_from_slice(&OPT_EPB_FLAGS.to_le_bytes());
    out.extend_from_slice(&4u16.to_le_bytes());
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&OPT_END.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&total.to_le_bytes());
}

/// A capture file being written.
pub struct PcapngWriter<W: Write> {
    out: W,
    pub packets: u64,
}

impl<W: Write> PcapngWriter<W> {
    pub fn new(mut out: W, interfaces: &[&str]) -> io::Result<Self> {
        out.write_all(&file_header(interfaces))?;
        Ok(PcapngWriter { out, packets: 0 })
    }

    /// Writes records made by [`packet_record`] (`count` of them).
    pub fn write_records(&mut self, records: &[u8], count: u64) -> io::Result<()> {
        self.out.write_all(records)?;
        self.packets += count;
        Ok(())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// One packet read back from a capture (for tests and tools).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub interface: u32,
    pub ts_ns: u64,
    pub direction: Option<Direction>,
    pub original_len: u32,
    pub data: Vec<u8>,
}

/// Reads back what [`PcapngWriter`] writes: interface names and packets. Checks every block's
/// framing; unknown block types are skipped. Never panics on malformed input.
pub fn read(bytes: &[u8]) -> Result<(Vec<String>, Vec<Record>), String> {
    let u32_at = |b: &[u8], at: usize| -> Result<u32, String> {
        b.get(at..at + 4)
            .map(|s| u32::from_le_bytes(s.try_into().expect("4 bytes")))
            .ok_or_else(|| format!("truncated at byte {at}"))
    };
    let u16_at = |b: &[u8], at: usize| -> Result<u16, String> {
        b.get(at..at + 2)
            .map(|s| u16::from_le_bytes(s.try_into().expect("2 bytes")))
            .ok_or_else(|| format!("truncated at byte {at}"))
    };
    let mut names = Vec::new();
    let mut records = Vec::new();
    let mut at = 0;
    let mut first = true;
    while at < bytes.len() {
        let kind = u32_at(bytes, at)?;
        let total = u32_at(bytes, at + 4)? as usize;
        if total < 12 || !total.is_multiple_of(4) || at + total > bytes.len() {
            return Err(format!("bad block length {total} at byte {at}"));
        }
        if u32_at(bytes, at + total - 4)? as usize != total {
            return Err(format!("trailing length differs at byte {at}"));
        }
        let body = &bytes[at + 8..at + total - 4];
        if first && (kind != SHB || u32_at(body, 0)? != BYTE_ORDER_MAGIC) {
            return Err("not a little-endian pcapng section".into());
        }
        first = false;
        let options = |mut o: usize, mut f: &mut dyn FnMut(u16, &[u8])| -> Result<(), String> {
            while o + 4 <= body.len() {
                let code = u16_at(body, o)?;
                let len = u16_at(body, o + 2)? as usize;
                if code == OPT_END {
                    break;
                }
                let v = body
                    .get(o + 4..o + 4 + len)
                    .ok_or("option overruns its block")?;
                f(code, v);
                o += 4 + len + pad4(len);
            }
            let _ = &mut f;
            Ok(())
        };
        match kind {
            IDB => {
                let mut name = String::new();
                options(8, &mut |code, v| {
                    if code == OPT_IF_NAME {
                        name = String::from_utf8_lossy(v).into_owned();
                    }
                })?;
                names.push(name);
            }
            EPB => {
                let interface = u32_at(body, 0)?;
                let ts_ns = ((u32_at(body, 4)? as u64) << 32) | u32_at(body, 8)? as u64;
                let captured = u32_at(body, 12)? as usize;
                let original_len = u32_at(body, 16)?;
                let data = body
                    .get(20..20 + captured)
                    .ok_or("packet overruns its block")?
                    .to_vec();
                let mut direction = None;
                options(20 + captured + pad4(captured), &mut |code, v| {
                    if code == OPT_EPB_FLAGS && v.len() == 4 {
                        direction = match u32::from_le_bytes(v.try_into().expect("4 bytes")) & 3 {
                            1 => Some(Direction::Inbound),
                            2 => Some(Direction::Outbound),
                            _ => None,
                        };
                    }
                })?;
                records.push(Record {
                    interface,
                    ts_ns,
                    direction,
                    original_len,
                    data,
                });
            }
            _ => {}
        }
        at += total;
    }
    Ok((names, records))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_header_and_record() {
        let head = file_header(&["p0"]);
        #[rustfmt::skip]
        let expect: Vec<u8> = vec![
            // SHB: type, length 32, magic, v1.0, section length -1, end of options, length
            0x0a, 0x0d, 0x0d, 0x0a, 32, 0, 0, 0, 0x4d, 0x3c, 0x2b, 0x1a, 1, 0, 0, 0,
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 32, 0, 0, 0,
            // IDB: type 1, length 40, linktype 1, reserved, snaplen 16384,
            1, 0, 0, 0, 40, 0, 0, 0, 1, 0, 0, 0, 0, 0x40, 0, 0,
            // if_name "p0" (padded), if_tsresol 9 (padded), end, length
            2, 0, 2, 0, b'p', b'0', 0, 0, 9, 0, 1, 0, 9, 0, 0, 0, 0, 0, 0, 0, 40, 0, 0, 0,
        ];
        assert_eq!(head, expect);

        let mut rec = Vec::new();
        packet_record(
            &mut rec,
            0,
            0x0000_0001_0000_0002,
            Direction::Outbound,
            &[0xaa, 0xbb, 0xcc],
        );
        #[rustfmt::skip]
        let expect: Vec<u8> = vec![
            6, 0, 0, 0, 48, 0, 0, 0,          // EPB, length 48
            0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, // interface 0, timestamp high 1, low 2
            3, 0, 0, 0, 3, 0, 0, 0,             // captured 3, original 3
            0xaa, 0xbb, 0xcc, 0,                // data, padded
            2, 0, 4, 0, 2, 0, 0, 0,             // epb_flags: outbound
            0, 0, 0, 0, 48, 0, 0, 0,            // end of options, length
        ];
        assert_eq!(rec, expect);
    }

    #[test]
    fn written_captures_read_back() {
        let mut file = Vec::new();
        let mut w = PcapngWriter::new(&mut file, &["a", "bb"]).unwrap();
        let mut recs = Vec::new();
        let big = vec![7u8; SNAPLEN as usize + 10];
        packet_record(
            &mut recs,
            1,
            123_456_789,
            Direction::Inbound,
            &[1, 2, 3, 4, 5],
        );
        packet_record(&mut recs, 0, 987_654_321_000, Direction::Outbound, &big);
        w.write_records(&recs, 2).unwrap();
        assert_eq!(w.packets, 2);
        let (names, got) = read(&file).unwrap();
        assert_eq!(names, ["a", "bb"]);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].interface, 1);
        assert_eq!(got[0].ts_ns, 123_456_789);
        assert_eq!(got[0].direction, Some(Direction::Inbound));
        assert_eq!(got[0].data, [1, 2, 3, 4, 5]);
        assert_eq!(
            got[1].data.len(),
            SNAPLEN as usize,
            "cut at the snap length"
        );
        assert_eq!(got[1].original_len as usize, big.len());
        assert_eq!(got[1].direction, Some(Direction::Outbound));
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        let mut file = file_header(&["x"]);
        packet_record(&mut file, 0, 1, Direction::Inbound, &[9; 61]);
        for cut in 0..file.len() {
            let _ = read(&file[..cut]);
        }
        let mut bad = file.clone();
        bad[4] = 13; // SHB length no longer a multiple of 4
        assert!(read(&bad).is_err());
        assert!(read(b"not a capture at all").is_err());
    }
}
