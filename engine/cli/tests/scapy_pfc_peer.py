#!/usr/bin/python3
"""A link partner that sends 802.1Qbb PFC frames to Portico, for the shaper's PFC test (seed
000: priority flow control is an input to the shaper's arbitration).

Run inside the test's network namespace, on the kernel side of the engine's tap, against a
target whose one shaper class (its queue pair's) travels at PFC priority 3, with a 10 Mbit/s
link, so that the longest pause (0xFFFF quanta of 512 bit times) lasts 3.36 s. READ responses
pass the shaper in their queue pair's class, so a paused class holds them back:
  0. an RDMA READ of 64 bytes (PSN 0): its READ RESPONSE ONLY comes;
  1. a PFC frame pausing priority 5 (not the class's) for 0xFFFF quanta, then a READ (PSN 1):
     its response comes all the same;
  2. a PFC frame pausing priority 3 for 0xFFFF quanta, then a READ (PSN 2): no response
     within 1 s, while the pause lasts;
  3. a PFC frame with quanta 0 for priority 3 (resume): the held response comes at once.
The PFC frame: destination 01:80:C2:00:00:01, EtherType 0x8808, MAC control opcode 0x0101,
the class-enable vector, eight 2-byte pause times, padded to the 64-byte minimum. Prints one
JSON object; exits 0 when every step holds.

Usage: scapy_pfc_peer.py IFACE MY_MAC MY_IP DUT_IP RKEY ADDR DUT_QPN MY_QPN
"""
import json
import struct
import sys
import threading
import time

from scapy.all import IP, UDP, Ether, Raw, sendp, AsyncSniffer
from scapy.contrib.roce import BTH

import tap_peer

result = {"arp": None, "steps": [], "ok": False}
peer = tap_peer.start(result)
iface, my_mac, my_ip, dut_ip = peer.iface, peer.my_mac, peer.my_ip, peer.dut_ip
rkey, addr, dut_qpn, my_qpn, dut_mac = peer.rkey, peer.addr, peer.dut_qpn, peer.my_qpn, peer.dut_mac

READ_REQUEST = 0x0C
READ_RESPONSE_ONLY = 0x10


def pfc(priority, quanta):
    vector = 1 << priority
    times = [0] * 8
    times[priority] = quanta
    body = struct.pack("!HH8H", 0x0101, vector, *times)
    return Ether(src=my_mac, dst="01:80:c2:00:00:01", type=0x8808) / Raw(body + bytes(46 - len(body)))


def read(psn):
    reth = struct.pack("!QII", addr + 64 * psn, rkey, 64)
    return (Ether(src=my_mac, dst=dut_mac) / IP(src=my_ip, dst=dut_ip, flags="DF")
            / UDP(sport=49152, dport=4791)
            / BTH(opcode=READ_REQUEST, dqpn=dut_qpn, psn=psn, ackreq=1) / Raw(reth))


def listen(timeout):
    ready = threading.Event()
    sniffer = AsyncSniffer(iface=iface, filter=f"udp dst port 4791 and ether src {dut_mac}",
                           count=1, timeout=timeout, started_callback=ready.set)
    sniffer.start()
    ready.wait(5)
    return sniffer


def answer(sniffer):
    sniffer.join()
    pkt = (sniffer.results or [None])[0]
    if pkt is None or BTH not in pkt:
        return None
    return {"opcode": pkt[BTH].opcode, "psn": pkt[BTH].psn}


def step(name, got, want_psn):
    s = {"name": name, "got": got}
    s["ok"] = (got is None) if want_psn is None else (
        got is not None and got["opcode"] == READ_RESPONSE_ONLY and got["psn"] == want_psn)
    result["steps"].append(s)


# 0. Not paused: the READ is answered.
sn = listen(3)
sendp(read(0), iface=iface)
step("unpaused", answer(sn), 0)
# 1. Another priority paused: the class goes on.
sendp(pfc(5, 0xFFFF), iface=iface)
sn = listen(3)
sendp(read(1), iface=iface)
step("other_priority_paused", answer(sn), 1)
# 2. The class's priority paused (3.36 s at 10 Mbit/s): nothing for 1 s.
sendp(pfc(3, 0xFFFF), iface=iface)
sn = listen(1)
sent = time.monotonic()
sendp(read(2), iface=iface)
step("paused", answer(sn), None)
# 3. Resumed (quanta 0): the held response comes, well before the pause would have ended.
sn = listen(2)
sendp(pfc(3, 0), iface=iface)
got = answer(sn)
step("resumed", got, 2)
result["steps"][-1]["after_s"] = round(time.monotonic() - sent, 3)
result["ok"] = len(result["steps"]) == 4 and all(s["ok"] for s in result["steps"])
print(json.dumps(result))
sys.exit(0 if result["ok"] else 1)
