#!/usr/bin/python3
"""An independent RoCEv2 peer for Portico's tap test, built on scapy's RoCE layer.

Run inside the test's network namespace, on the kernel side of the engine's tap:
  1. resolves the engine's MAC with ARP (the engine must answer for its address);
  2. sends an RC RDMA WRITE ONLY (PSN 0) and, once it is acknowledged, an RC SEND ONLY
     (PSN 1), both with AckReq;
  3. checks that each is acknowledged: opcode ACKNOWLEDGE, AETH syndrome ACK, the right PSN
     and QPN, and an ICRC equal to the one scapy computes for the same packet.
Prints one JSON object and exits 0 when every check holds, 1 otherwise.

Usage: scapy_peer.py IFACE MY_MAC MY_IP DUT_IP RKEY ADDR DUT_QPN MY_QPN
RKEY and ADDR come from the target's `ready` line: ADDR is the real address of the target's
region (its own memory), decimal or 0x-hex; the WRITE lands at ADDR.
"""
import json
import struct
import sys

from scapy.all import IP, UDP, Ether, Raw
from scapy.contrib.roce import AETH, BTH, opcode

import tap_peer

result = {"arp": None, "acks": [], "ok": False}
peer = tap_peer.start(result)
iface, my_mac, my_ip, dut_ip = peer.iface, peer.my_mac, peer.my_ip, peer.dut_ip
rkey, addr, dut_qpn, my_qpn, dut_mac = peer.rkey, peer.addr, peer.dut_qpn, peer.my_qpn, peer.dut_mac

# 40 bytes: RoCEv2 payloads are padded to a multiple of 4 (the BTH pad count is left at 0).
payload = b"written by scapy into portico, RoCEv2!!!"
base = Ether(src=my_mac, dst=dut_mac) / IP(src=my_ip, dst=dut_ip, flags="DF") / UDP(sport=49152, dport=4791)
reth = struct.pack("!QII", addr, rkey, len(payload))
write = base / BTH(opcode=opcode("RC", "RDMA_WRITE_ONLY")[0], dqpn=dut_qpn, psn=0, ackreq=1) / Raw(reth + payload)
send = base / BTH(opcode=opcode("RC", "SEND_ONLY")[0], dqpn=dut_qpn, psn=1, ackreq=1) / Raw(payload)

# One after the other, each once the one before is acknowledged: sent back to back, the two
# may reach the engine in one burst, and one ACK of PSN 1 then acknowledges both (IBTA lets a
# responder coalesce its ACKs), which is not what this test looks at.
answers = [a for a in (tap_peer.answer(peer, p, 10) for p in (write, send)) if a is not None]

ok = True
for i, pkt in enumerate(answers):
    bth = pkt[BTH]
    aeth = AETH(bytes(bth.payload)[:4])
    # Rebuild the packet as scapy would emit it, to get scapy's own ICRC for these bytes.
    fresh = Ether(bytes(pkt))
    fresh[BTH].icrc = None
    expected_icrc = Ether(bytes(fresh))[BTH].icrc
    ack = {"opcode": bth.opcode, "psn": bth.psn, "dqpn": bth.dqpn, "syndrome": aeth.syndrome,
           "icrc": bth.icrc, "icrc_expected": expected_icrc}
    result["acks"].append(ack)
    # Syndrome bits 7..5 = 000 is an ACK; the low five bits carry the credit count.
    ok &= bth.opcode == opcode("RC", "ACKNOWLEDGE")[0] and aeth.syndrome >> 5 == 0 and bth.psn == i and bth.dqpn == my_qpn
    ok &= bth.icrc == expected_icrc
result["ok"] = bool(ok and len(result["acks"]) == 2)
print(json.dumps(result))
sys.exit(0 if result["ok"] else 1)
