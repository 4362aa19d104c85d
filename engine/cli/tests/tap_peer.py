"""What every scapy peer of the tap tests does first: read the command line the test passes
(IFACE MY_MAC MY_IP DUT_IP RKEY ADDR DUT_QPN MY_QPN) and resolve the engine's MAC with ARP.
Imported by scapy_peer.py, scapy_flush_peer.py and hostile_peer.py (their directory is on
Python's path), which `answer` also serves: one request, the engine's answer to it."""
import json
import sys
import threading
from types import SimpleNamespace

from scapy.all import ARP, AsyncSniffer, Ether, conf, sendp, srp1


def start(result):
    """The peer's arguments, with `dut_mac` resolved. When the engine does not answer ARP,
    prints `result` (its "arp" left None) and exits 1; otherwise sets result["arp"]."""
    iface, my_mac, my_ip, dut_ip, rkey, addr, dut_qpn, my_qpn = sys.argv[1:9]
    conf.verb = 0
    arp = srp1(Ether(dst="ff:ff:ff:ff:ff:ff", src=my_mac) / ARP(op=1, hwsrc=my_mac, psrc=my_ip, pdst=dut_ip),
               iface=iface, timeout=5, retry=3)
    if arp is None or ARP not in arp or arp[ARP].op != 2:
        print(json.dumps(result))
        sys.exit(1)
    result["arp"] = arp[ARP].hwsrc
    return SimpleNamespace(iface=iface, my_mac=my_mac, my_ip=my_ip, dut_ip=dut_ip, rkey=int(rkey),
                           addr=int(addr, 0), dut_qpn=int(dut_qpn, 0), my_qpn=int(my_qpn, 0),
                           dut_mac=arp[ARP].hwsrc)


def answer(peer, pkt, timeout):
    """Sends `pkt` once a sniffer for the engine's RoCEv2 frames is listening, and returns the
    first frame the engine sends after it (None after `timeout` seconds)."""
    ready = threading.Event()
    sniffer = AsyncSniffer(iface=peer.iface, filter=f"udp dst port 4791 and ether src {peer.dut_mac}",
                           count=1, timeout=timeout, started_callback=ready.set)
    sniffer.start()
    ready.wait(5)
    sendp(pkt, iface=peer.iface)
    sniffer.join()
    return (sniffer.results or [None])[0]
