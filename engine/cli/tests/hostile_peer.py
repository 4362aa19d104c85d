#!/usr/bin/python3
"""A hostile RoCEv2 peer for Portico's tap test, built on scapy's RoCE layer.

Run inside the test's network namespace, on the kernel side of the engine's tap. Resolves the
engine with ARP, then sends, in order:
  - one frame for every check the engine makes before its transport (each aimed at the
    region at ADDR+4096, with the expected PSN 0, so that only the check stops it):
    a foreign P_Key, the invalid P_Key 0, another source IP, another host's MAC, a VLAN tag,
    IPv4 options, an IPv4 fragment, a UC WRITE, a UD SEND, an unknown QPN;
  - a zero-length WRITE (PSN 0) with a bogus rkey and address: acknowledged (C9-88);
  - a real WRITE (PSN 1) of PAYLOAD at ADDR: acknowledged;
  - a CmpSwap (PSN 2) at ADDR+4096: NAK Invalid Request (atomics are not executed).
Prints one JSON object with the ACKs/NAKs it saw and exits 0 when they are as expected.

Usage: hostile_peer.py IFACE MY_MAC MY_IP DUT_IP RKEY ADDR DUT_QPN MY_QPN
"""
import json
import struct
import sys
import time

from scapy.all import IP, UDP, Dot1Q, Ether, IPOption_NOP, Raw, sendp, AsyncSniffer
from scapy.contrib.roce import AETH, BTH

import tap_peer

result = {"arp": None, "answers": [], "ok": False}
peer = tap_peer.start(result)
iface, my_mac, my_ip, dut_ip = peer.iface, peer.my_mac, peer.my_ip, peer.dut_ip
rkey, addr, dut_qpn, my_qpn, dut_mac = peer.rkey, peer.addr, peer.dut_qpn, peer.my_qpn, peer.dut_mac

PAYLOAD = b"only this WRITE may land in the region!!"  # 40 bytes
HOSTILE = b"\xee" * 64

WRITE_ONLY = 0x0a
CMP_SWAP = 0x13
UC_WRITE_ONLY = 0x2a
UD_SEND_ONLY = 0x64


def reth(va, key, length):
    return struct.pack("!QII", va, key, length)


def frame(opcode=WRITE_ONLY, psn=0, body=None, pkey=0xffff, src=my_ip, dst_mac=None, qpn=dut_qpn,
          vlan=False, ip_opts=None, ip_flags="DF"):
    if body is None:
        body = reth(addr + 4096, rkey, len(HOSTILE)) + HOSTILE
    eth = Ether(src=my_mac, dst=dst_mac or dut_mac)
    if vlan:
        eth = eth / Dot1Q(vlan=5)
    ip = IP(src=src, dst=dut_ip, flags=ip_flags)
    if ip_opts:
        ip.options = ip_opts
    return eth / ip / UDP(sport=49152, dport=4791) / BTH(
        opcode=opcode, pkey=pkey, dqpn=qpn, psn=psn, ackreq=1) / Raw(body)


hostile = [
    ("bad_pkey", frame(pkey=0x1234)),
    ("bad_pkey", frame(pkey=0x0000)),
    ("wrong_source", frame(src="10.77.0.99")),
    ("wrong_mac", frame(dst_mac="02:00:00:00:00:77")),
    ("vlan_tagged", frame(vlan=True)),
    ("ip_options", frame(ip_opts=[IPOption_NOP()] * 4)),
    ("ip_fragments", frame(ip_flags="MF")),
    ("wrong_transport", frame(opcode=UC_WRITE_ONLY)),
    ("wrong_transport", frame(opcode=UD_SEND_ONLY, body=struct.pack("!II", 0x11111111, my_qpn) + HOSTILE)),
    ("unknown_qp", frame(qpn=dut_qpn + 1)),
]
zero = frame(psn=0, body=reth(0xdead0000, 0x0bad0bad, 0))
write = frame(psn=1, body=reth(addr, rkey, len(PAYLOAD)) + PAYLOAD)
atomic_eth = struct.pack("!QIQQ", addr + 4096, rkey, 7, 0)
cmp_swap = frame(opcode=CMP_SWAP, psn=2, body=atomic_eth)

sniffer = AsyncSniffer(iface=iface, filter=f"udp dst port 4791 and ether src {dut_mac}", count=3, timeout=10)
sniffer.start()
time.sleep(0.5)
sendp([f for _, f in hostile], iface=iface)
time.sleep(0.2)
sendp([zero, write, cmp_swap], iface=iface, inter=0.05)
sniffer.join()

for pkt in sniffer.results or []:
    bth = pkt[BTH]
    aeth = AETH(bytes(bth.payload)[:4])
    result["answers"].append({"opcode": bth.opcode, "psn": bth.psn, "dqpn": bth.dqpn,
                              "syndrome": aeth.syndrome, "msn": aeth.msn})
result["sent"] = {}
for reason, _ in hostile:
    result["sent"][reason] = result["sent"].get(reason, 0) + 1
# ACK (syndrome 000xxxxx) for PSN 0 and 1, then NAK Invalid Request (011 00001 = 0x61) for 2.
got = [(a["opcode"], a["psn"], a["syndrome"] >> 5, a["syndrome"]) for a in result["answers"]]
result["ok"] = (len(got) == 3 and got[0][:3] == (0x11, 0, 0) and got[1][:3] == (0x11, 1, 0)
                and got[2][0] == 0x11 and got[2][1] == 2 and got[2][3] == 0x61)
print(json.dumps(result))
sys.exit(0 if result["ok"] else 1)
