"""What every scapy peer of the tap tests does first: read the command line the test passes
(IFACE MY_MAC MY_IP DUT_IP RKEY ADDR DUT_QPN MY_QPN) and resolve the engine's MAC with ARP.
Imported by scapy_peer.py and hostile_peer.py (their directory is on Python's path)."""
import json
import sys
from types import SimpleNamespace

from scapy.all import ARP, Ether, conf, srp1


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
