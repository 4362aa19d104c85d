#!/usr/bin/python3
"""An independent peer for Portico's remote persistence (IBTA FLUSH and ATOMIC WRITE), built on
scapy. scapy 2.5's RoCE layer knows neither the FLUSH opcode (0x1C) nor its FETH, nor ATOMIC
WRITE (0x1D): this script packs those headers itself (struct) and lets scapy's BTH compute the
ICRC, as the other tap peers do.

Run inside the test's network namespace, on the kernel side of the engine's tap, against a
target whose region is a file under pmem's power-loss simulator (the file holds exactly the
persisted cache lines). One request at a time, each answer awaited before the next is sent:
  0. RDMA WRITE ONLY (PSN 0) of PAYLOAD (one cache line) at ADDR: ACKNOWLEDGE, PSN 0, MSN 1;
  1. FLUSH (PSN 1), FETH placement global visibility + persistence, selectivity 0 (the range
     of the RETH: ADDR, 64 bytes): RDMA READ RESPONSE ONLY, PSN 1, AETH ACK, MSN 2, no
     payload; and the region file then holds PAYLOAD at 0;
  2. ATOMIC WRITE (PSN 2) of ATOMIC (8 bytes) at ADDR+4096: RDMA READ RESPONSE ONLY, PSN 2,
     MSN 3, no payload; and the file then holds ATOMIC at 4096;
  3. FLUSH (PSN 3), persistence only, selectivity 1 (the whole region of the rkey; the RETH's
     address and length ignored): RDMA READ RESPONSE ONLY, PSN 3, MSN 4;
  4. FLUSH (PSN 4) naming a wrong rkey: ACKNOWLEDGE carrying NAK remote access error (AETH
     syndrome 0x62), PSN 4, MSN 4.
Every answer is compared byte for byte with the frame expected, from the BTH to the ICRC
(which scapy computes for the expected bytes); the Ethernet, IPv4 and UDP headers are checked
field by field. The credit count in the low five bits of an ACK syndrome is the responder's to
choose and is taken from the answer. Prints one JSON object; exits 0 when every check holds.

Usage: scapy_flush_peer.py IFACE MY_MAC MY_IP DUT_IP RKEY ADDR DUT_QPN MY_QPN REGION_FILE
"""
import json
import struct
import sys

from scapy.all import IP, UDP, Ether, Raw
from scapy.contrib.roce import BTH

import tap_peer

result = {"arp": None, "steps": [], "ok": False}
peer = tap_peer.start(result)
region_file = sys.argv[9]
iface, my_mac, my_ip, dut_ip = peer.iface, peer.my_mac, peer.my_ip, peer.dut_ip
rkey, addr, dut_qpn, my_qpn, dut_mac = peer.rkey, peer.addr, peer.dut_qpn, peer.my_qpn, peer.dut_mac

PAYLOAD = b"flushed by scapy into portico's file, one cache line of RoCEv2!!"  # 64 bytes
ATOMIC = b"ATOMIC!!"
ATOMIC_OFFSET = 4096
assert len(PAYLOAD) == 64 and len(ATOMIC) == 8

# Opcodes (IBTA 1.5 / 1.6: FLUSH and ATOMIC WRITE are RC opcodes 0x1C and 0x1D).
WRITE_ONLY = 0x0A
READ_RESPONSE_ONLY = 0x10
ACKNOWLEDGE = 0x11
FLUSH = 0x1C
ATOMIC_WRITE = 0x1D
# FETH, low byte: bits 3:0 placement type (bit 0 global visibility, bit 1 persistence),
# bits 5:4 selectivity (0: the RETH's memory range, 1: the whole memory region).
GLOBAL, PERSISTENT = 0x1, 0x2
RANGE, REGION = 0, 1
NAK_REMOTE_ACCESS = 0x62  # 011 00010


def reth(va, key, length):
    return struct.pack("!QII", va, key, length)


def feth(placement, selectivity):
    return struct.pack("!I", placement | selectivity << 4)


def request(opcode, psn, body):
    return (Ether(src=my_mac, dst=dut_mac) / IP(src=my_ip, dst=dut_ip, flags="DF")
            / UDP(sport=49152, dport=4791)
            / BTH(opcode=opcode, dqpn=dut_qpn, psn=psn, ackreq=1) / Raw(body))


def exchange(pkt):
    """Sends `pkt` and returns the engine's first RoCEv2 frame after it (None after 5 s)."""
    return tap_peer.answer(peer, pkt, 5)


def file_bytes(offset, length):
    with open(region_file, "rb") as f:
        f.seek(offset)
        return f.read(length)


def check(name, pkt, opcode, psn, msn, syndrome=None):
    """The answer `pkt` against the expected one: returns the step's record, "ok" in it."""
    step = {"name": name, "seen": pkt is not None, "ok": False}
    result["steps"].append(step)
    if pkt is None or BTH not in pkt:
        return step
    raw = bytes(pkt)
    bth = pkt[BTH]
    # BTH 12 bytes, AETH 4, ICRC 4: everything after the UDP header.
    udp_payload = bytes(pkt[UDP].payload)
    aeth = udp_payload[12:16]
    got_syndrome, got_msn = aeth[0], int.from_bytes(aeth[1:4], "big")
    if syndrome is None:
        syndrome = got_syndrome if got_syndrome >> 5 == 0 else -1  # ACK: 000 + credit count
    # The expected answer: these headers, then the BTH and AETH the answer must carry, and
    # the ICRC scapy computes over them.
    headers = Ether(raw[:14 + 20 + 8])
    expected = headers / BTH(opcode=opcode, solicited=0, migreq=0, padcount=0, version=0, pkey=0xFFFF,
                             fecn=0, becn=0, dqpn=my_qpn, ackreq=0, psn=psn) / Raw(
        struct.pack("!I", (max(syndrome, 0) << 24) | msn))
    expected_bytes = bytes(expected)
    fresh = Ether(raw)
    fresh[BTH].icrc = None
    icrc_expected = Ether(bytes(fresh))[BTH].icrc
    ip, udp = pkt[IP], pkt[UDP]
    step.update({
        "opcode": bth.opcode, "psn": bth.psn, "dqpn": bth.dqpn, "syndrome": got_syndrome,
        "msn": got_msn, "icrc": bth.icrc, "icrc_expected": icrc_expected,
        "udp_payload": udp_payload.hex(), "expected": expected_bytes[42:].hex(),
        "headers_ok": (pkt[Ether].src == dut_mac and pkt[Ether].dst == my_mac and ip.src == dut_ip
                       and ip.dst == my_ip and ip.ihl == 5 and ip.proto == 17 and ip.len == 48
                       and udp.dport == 4791 and udp.len == 28 and len(raw) == 62),
    })
    step["exact"] = syndrome >= 0 and raw == expected_bytes
    step["ok"] = bool(step["headers_ok"] and step["exact"] and bth.icrc == icrc_expected)
    return step


# 0. WRITE ONLY: acknowledged.
ans = exchange(request(WRITE_ONLY, 0, reth(addr, rkey, len(PAYLOAD)) + PAYLOAD))
check("write", ans, ACKNOWLEDGE, 0, 1)
# 1. FLUSH of the WRITE's range, visibility and persistence: an empty READ RESPONSE ONLY,
#    and only then is the WRITE in the file (the simulator's file holds what was persisted).
ans = exchange(request(FLUSH, 1, feth(GLOBAL | PERSISTENT, RANGE) + reth(addr, rkey, len(PAYLOAD))))
s = check("flush_range", ans, READ_RESPONSE_ONLY, 1, 2)
s["file_holds_write"] = file_bytes(0, len(PAYLOAD)) == PAYLOAD
s["ok"] = s["ok"] and s["file_holds_write"]
# 2. ATOMIC WRITE: an empty READ RESPONSE ONLY; the region persists every WRITE it takes, so
#    the 8 bytes are in the file by the time it arrives.
ans = exchange(request(ATOMIC_WRITE, 2, reth(addr + ATOMIC_OFFSET, rkey, 8) + ATOMIC))
s = check("atomic_write", ans, READ_RESPONSE_ONLY, 2, 3)
s["file_holds_atomic"] = file_bytes(ATOMIC_OFFSET, 8) == ATOMIC
s["ok"] = s["ok"] and s["file_holds_atomic"]
# 3. FLUSH of the whole region (selectivity 1), persistence only.
ans = exchange(request(FLUSH, 3, feth(PERSISTENT, REGION) + reth(0, rkey, 0)))
check("flush_region", ans, READ_RESPONSE_ONLY, 3, 4)
# 4. FLUSH under a wrong rkey: NAK remote access error.
ans = exchange(request(FLUSH, 4, feth(GLOBAL | PERSISTENT, RANGE) + reth(addr, rkey ^ 0x5A5A5A, 64)))
check("flush_bad_rkey", ans, ACKNOWLEDGE, 4, 4, syndrome=NAK_REMOTE_ACCESS)

result["ok"] = len(result["steps"]) == 5 and all(s["ok"] for s in result["steps"])
print(json.dumps(result))
sys.exit(0 if result["ok"] else 1)
