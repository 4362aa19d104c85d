#!/usr/bin/python3
"""An independent IBTA communication-manager (CM) peer for Portico's tap test: an rdma_cm
(librdmacm, RDMA_PS_TCP) client over RoCEv2, built on scapy with its own encoding of the CM
MADs (IBTA vol. 1 ch. 12 tables 106-113, as laid out in Linux include/rdma/ibta_vol1_c12.h)
and of rdma_cm's private-data header (Linux drivers/infiniband/core/cma.c, struct cma_hdr).

Run inside the test's network namespace, on the kernel side of the engine's tap:
  1. resolves the engine's MAC with ARP (tap_peer.start);
  2. sends a ConnectRequest (REQ) to service ID 0x0000000001060000 | PORT on QP1 as a UD
     SEND ONLY (P_Key 0xffff, Q_Key 0x80010000), resent up to 3 times;
  3. checks the ConnectReply (REP) field by field, its ICRC, and its private data (Portico's
     region: version 1, flags, rkey, address, length);
  4. sends ReadyToUse (RTU) with the REQ's transaction ID;
  5. on the new RC QP: RDMA WRITE ONLY of 40 bytes with AckReq (expects an ACK), then RDMA READ
     of the same 40 bytes (expects a READ RESPONSE ONLY carrying them);
  6. sends DisconnectRequest (DREQ), expects DisconnectReply (DREP);
  7. sends a second REQ (new comm ID, new QPN) to BADPORT's service ID and expects a
     ConnectReject (REJ) with reason 8 (invalid service ID) for message REQ.
Prints one JSON object (its last stdout line) and exits 0 only when every check holds.

Usage: cm_peer.py IFACE MY_MAC MY_IP DUT_IP RKEY ADDR DUT_QPN MY_QPN PORT BADPORT
       cm_peer.py --selftest OUTDIR   (offline: frames to OUTDIR/cm_peer.pcap, tshark, parsers)
"""
import ipaddress
import json
import os
import queue
import random
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib

from scapy.all import IP, UDP, Ether, Raw, sendp, wrpcap, AsyncSniffer, conf
from scapy.contrib.roce import BTH

# ---------------------------------------------------------------------------------------------
# Constants (sources: IBTA vol. 1 ch. 12/13; Linux include/rdma/ib_mad.h, include/rdma/ib_cm.h,
# drivers/infiniband/core/cm.c, drivers/infiniband/core/cma.c)
# ---------------------------------------------------------------------------------------------
ROCE_PORT = 4791
UD_SEND_ONLY = 0x64
RC_WRITE_ONLY = 0x0A
RC_READ_REQUEST = 0x0C
RC_READ_RESPONSE_ONLY = 0x10
RC_ACKNOWLEDGE = 0x11
GSI_QPN = 1
GSI_QKEY = 0x80010000          # IB_QP1_QKEY
DEFAULT_PKEY = 0xFFFF

MAD_BASE_VERSION = 1           # IB_MGMT_BASE_VERSION
MAD_CLASS_CM = 0x07            # IB_MGMT_CLASS_CM
CM_CLASS_VERSION = 2           # IB_CM_CLASS_VERSION
MAD_METHOD_SEND = 0x03         # IB_MGMT_METHOD_SEND
MAD_SIZE = 256
MAD_HDR_SIZE = 24
CM_DATA_SIZE = MAD_SIZE - MAD_HDR_SIZE   # 232

ATTR_REQ = 0x0010
ATTR_MRA = 0x0011
ATTR_REJ = 0x0012
ATTR_REP = 0x0013
ATTR_RTU = 0x0014
ATTR_DREQ = 0x0015
ATTR_DREP = 0x0016
ATTR_NAMES = {ATTR_REQ: "REQ", ATTR_MRA: "MRA", ATTR_REJ: "REJ", ATTR_REP: "REP",
              ATTR_RTU: "RTU", ATTR_DREQ: "DREQ", ATTR_DREP: "DREP"}

RDMA_PS_TCP = 0x0106
CMA_VERSION = 0x00
CMA_HDR_SIZE = 36
REQ_PRIVATE_SIZE = 92
REP_PRIVATE_SIZE = 196
REJ_REASON_INVALID_SERVICE_ID = 8
REJ_MSG_REQ, REJ_MSG_REP, REJ_MSG_OTHER = 0, 1, 2

# What this client asks for in its REQ (the values rdma_cm uses where it has its own:
# CMA_CM_RESPONSE_TIMEOUT 20, CMA_MAX_CM_RETRIES 15, retry/RNR counts clamped to 7).
REQ_RESPONDER_RESOURCES = 4
REQ_INITIATOR_DEPTH = 4
REQ_CM_RESPONSE_TIMEOUT = 20
REQ_RETRY_COUNT = 7
REQ_RNR_RETRY_COUNT = 7
REQ_MAX_CM_RETRIES = 15
REQ_PATH_MTU = 3               # IB_MTU_1024, what rdma_cm picks for a 1500-byte Ethernet MTU
REQ_HOP_LIMIT = 64
REQ_LOCAL_ACK_TIMEOUT = 14
# cm_format_req sets SubnetLocal = (hop_limit <= 1) and, for hop_limit > 1, both LIDs to the
# permissive LID 0xffff: over RoCEv2 (hop limit 64) the kernel sends SubnetLocal 0.
REQ_SUBNET_LOCAL = 0
PERMISSIVE_LID = 0xFFFF

APP_DATA = b"hello portico"
PAYLOAD = b"cm_peer wrote this over the RC QP!!!!!!!"   # 40 bytes
assert len(PAYLOAD) == 40

PORTICO_REGION_VERSION = 1
HARD_LIMIT_S = 100


# ---------------------------------------------------------------------------------------------
# ICRC (our own; cross-checked against scapy's BTH.compute_icrc)
# ---------------------------------------------------------------------------------------------
def roce_icrc(frame):
    """The RoCEv2 (IPv4) ICRC of an Ethernet frame as the 4 bytes it carries on the wire: CRC-32
    over 8 bytes of 0xff, the IPv4 header with TOS, TTL and checksum set to all ones, the UDP
    header with the checksum set to all ones, the BTH with its resv8a byte (FECN, BECN, resv6)
    set to all ones, and everything after the BTH up to the ICRC; stored little-endian."""
    ip_off = 14
    ihl = (frame[ip_off] & 0x0F) * 4
    total = struct.unpack_from("!H", frame, ip_off + 2)[0]
    end = ip_off + total
    ip = bytearray(frame[ip_off:ip_off + ihl])
    ip[1] = 0xFF                      # TOS (DSCP + ECN)
    ip[8] = 0xFF                      # TTL
    ip[10:12] = b"\xff\xff"           # header checksum
    udp = bytearray(frame[ip_off + ihl:ip_off + ihl + 8])
    udp[6:8] = b"\xff\xff"            # UDP checksum
    rest = bytearray(frame[ip_off + ihl + 8:end - 4])
    rest[4] = 0xFF                    # BTH byte 4: FECN, BECN, resv6
    crc = zlib.crc32(b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(rest)) & 0xFFFFFFFF
    return struct.pack("<I", crc)


def scapy_icrc(frame):
    """scapy's ICRC for the same bytes (its BTH layer recomputes it when icrc is None)."""
    fresh = Ether(bytes(frame))
    fresh[BTH].icrc = None
    rebuilt = bytes(fresh)
    ip_total = struct.unpack_from("!H", rebuilt, 16)[0]
    return rebuilt[14 + ip_total - 4:14 + ip_total]


# ---------------------------------------------------------------------------------------------
# Encoding: MAD header and CM messages (offsets are from the start of the CM data, i.e. MAD
# byte 24, exactly as the CM_*_LOC macros of ibta_vol1_c12.h count them)
# ---------------------------------------------------------------------------------------------
def mad_header(attr_id, tid, attr_mod=0, status=0):
    return struct.pack("!BBBBHHQHHI", MAD_BASE_VERSION, MAD_CLASS_CM, CM_CLASS_VERSION,
                       MAD_METHOD_SEND, status, 0, tid, attr_id, 0, attr_mod)


def mapped_gid(ip):
    """An IPv4 address as a RoCE GID (::ffff:a.b.c.d)."""
    return b"\x00" * 10 + b"\xff\xff" + socket.inet_aton(ip)


def eui64_guid(mac):
    """A node GUID derived from a MAC the way RoCE devices usually do it (EUI-64)."""
    b = bytes.fromhex(mac.replace(":", ""))
    return int.from_bytes(bytes([b[0] ^ 0x02]) + b[1:3] + b"\xff\xfe" + b[3:6], "big")


def service_id(port):
    """rdma_get_service_id() for AF_INET: (ps << 16) + port."""
    return (RDMA_PS_TCP << 16) | (port & 0xFFFF)


def cma_hdr(src_ip, dst_ip, src_port):
    """rdma_cm's private-data header (cma.c struct cma_hdr, written by cma_format_hdr):
    u8 cma_version; u8 ip_version (version in bits 7:4); __be16 port (the SOURCE port);
    union cma_ip_addr src_addr, dst_addr (16 bytes each). For IPv4 only ip4.addr, the LAST 4
    bytes of each union, is written; the 12 bytes before it stay zero (kzalloc'ed buffer)."""
    return (struct.pack("!BBH", CMA_VERSION, 4 << 4, src_port)
            + b"\x00" * 12 + socket.inet_aton(src_ip)
            + b"\x00" * 12 + socket.inet_aton(dst_ip))


def encode_req(f):
    b = bytearray(CM_DATA_SIZE)
    struct.pack_into("!I", b, 0, f["local_comm_id"])
    # bytes 5..7: ECE vendor ID, zero.
    struct.pack_into("!Q", b, 8, f["service_id"])
    struct.pack_into("!Q", b, 16, f["local_ca_guid"])
    struct.pack_into("!I", b, 28, f["local_qkey"])
    struct.pack_into("!I", b, 32, (f["local_qpn"] & 0xFFFFFF) << 8 | f["responder_resources"])
    struct.pack_into("!I", b, 36, 0 << 8 | f["initiator_depth"])           # local EECN 0
    struct.pack_into("!I", b, 40, 0 << 8 | f["remote_cm_response_timeout"] << 3
                     | f["transport_service_type"] << 1 | f["end_to_end_flow_control"])
    struct.pack_into("!I", b, 44, (f["starting_psn"] & 0xFFFFFF) << 8
                     | f["local_cm_response_timeout"] << 3 | f["retry_count"])
    struct.pack_into("!H", b, 48, f["partition_key"])
    b[50] = f["path_mtu"] << 4 | f["rdc_exists"] << 3 | f["rnr_retry_count"]
    b[51] = f["max_cm_retries"] << 4 | f["srq"] << 3 | 0                   # ext. transport 0
    struct.pack_into("!HH", b, 52, f["primary_local_lid"], f["primary_remote_lid"])
    b[56:72] = f["primary_local_gid"]
    b[72:88] = f["primary_remote_gid"]
    struct.pack_into("!I", b, 88, f["primary_flow_label"] << 12 | f["primary_packet_rate"])
    b[92] = f["primary_traffic_class"]
    b[93] = f["primary_hop_limit"]
    b[94] = f["primary_sl"] << 4 | f["primary_subnet_local"] << 3
    b[95] = f["primary_local_ack_timeout"] << 3
    # 96..139: alternate path, all zero.
    pd = f["private_data"]
    assert len(pd) <= REQ_PRIVATE_SIZE
    b[140:140 + len(pd)] = pd
    return bytes(b)


def encode_rep(f):
    b = bytearray(CM_DATA_SIZE)
    struct.pack_into("!III", b, 0, f["local_comm_id"], f["remote_comm_id"], f["local_qkey"])
    struct.pack_into("!I", b, 12, (f["local_qpn"] & 0xFFFFFF) << 8)
    struct.pack_into("!I", b, 20, (f["starting_psn"] & 0xFFFFFF) << 8)
    b[24] = f["responder_resources"]
    b[25] = f["initiator_depth"]
    b[26] = f["target_ack_delay"] << 3 | f["failover_accepted"] << 1 | f["end_to_end_flow_control"]
    b[27] = f["rnr_retry_count"] << 5 | f["srq"] << 4
    struct.pack_into("!Q", b, 28, f["local_ca_guid"])
    pd = f["private_data"]
    b[36:36 + len(pd)] = pd
    return bytes(b)


def encode_ids(local_comm_id, remote_comm_id, private=b""):
    """RTU (table 111) and DREP (table 113): the two comm IDs, then private data."""
    b = bytearray(CM_DATA_SIZE)
    struct.pack_into("!II", b, 0, local_comm_id, remote_comm_id)
    b[8:8 + len(private)] = private
    return bytes(b)


def encode_dreq(local_comm_id, remote_comm_id, remote_qpn, private=b""):
    b = bytearray(CM_DATA_SIZE)
    struct.pack_into("!III", b, 0, local_comm_id, remote_comm_id, (remote_qpn & 0xFFFFFF) << 8)
    b[12:12 + len(private)] = private
    return bytes(b)


def encode_rej(local_comm_id, remote_comm_id, msg_rejected, reason, ari=b"", private=b""):
    b = bytearray(CM_DATA_SIZE)
    struct.pack_into("!II", b, 0, local_comm_id, remote_comm_id)
    b[8] = msg_rejected << 6
    b[9] = len(ari) << 1
    struct.pack_into("!H", b, 10, reason)
    b[12:12 + len(ari)] = ari
    b[84:84 + len(private)] = private
    return bytes(b)


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------
def parse_roce(frame):
    """An Ethernet/IPv4/UDP(4791)/BTH frame as a dict, or None. The payload stops before the
    ICRC and the BTH pad bytes; the frame's end comes from the IPv4 total length."""
    frame = bytes(frame)
    if len(frame) < 14 + 20 + 8 + 12 + 4 or frame[12:14] != b"\x08\x00":
        return None
    ihl = (frame[14] & 0x0F) * 4
    total = struct.unpack_from("!H", frame, 16)[0]
    if frame[14 + 9] != 17 or 14 + total > len(frame):
        return None
    udp = 14 + ihl
    sport, dport = struct.unpack_from("!HH", frame, udp)
    if dport != ROCE_PORT:
        return None
    bth = udp + 8
    opcode, flags, pkey, b4, dqpn24, b8, psn24 = struct.unpack_from("!BBHB3sB3s", frame, bth)
    end = 14 + total
    pad = (flags >> 4) & 3
    icrc = frame[end - 4:end]
    return {
        "src_mac": frame[6:12].hex(":"), "dst_mac": frame[0:6].hex(":"),
        "src_ip": socket.inet_ntoa(frame[26:30]), "dst_ip": socket.inet_ntoa(frame[30:34]),
        "sport": sport, "opcode": opcode, "se": flags >> 7, "migreq": (flags >> 6) & 1,
        "padcount": pad, "tver": flags & 0x0F, "pkey": pkey, "fecn": b4 >> 7, "becn": (b4 >> 6) & 1,
        "dqpn": int.from_bytes(dqpn24, "big"), "ackreq": b8 >> 7,
        "psn": int.from_bytes(psn24, "big"),
        "payload": frame[bth + 12:end - 4 - pad],
        "icrc": icrc.hex(), "icrc_expected": roce_icrc(frame).hex(),
        "icrc_ok": icrc == roce_icrc(frame),
    }


def parse_mad_header(mad):
    (base, mclass, cver, method, status, cspec, tid, attr, _resv,
     attr_mod) = struct.unpack_from("!BBBBHHQHHI", mad, 0)
    return {"base_version": base, "mgmt_class": mclass, "class_version": cver, "method": method,
            "status": status, "class_specific": cspec, "tid": tid, "attr_id": attr,
            "attr_mod": attr_mod}


def parse_ud_mad(pkt):
    """A parsed RoCE frame carrying a UD SEND with DETH and a MAD: adds 'deth_qkey',
    'deth_srcqp', 'mad' (header dict) and 'cm' (the 232 bytes of CM data). None otherwise."""
    if pkt is None or pkt["opcode"] != UD_SEND_ONLY or len(pkt["payload"]) < 8 + MAD_SIZE:
        return None
    qkey, srcqp = struct.unpack_from("!II", pkt["payload"], 0)
    mad = pkt["payload"][8:8 + MAD_SIZE]
    out = dict(pkt)
    out.update(deth_qkey=qkey, deth_srcqp=srcqp & 0xFFFFFF, mad=parse_mad_header(mad),
               cm=mad[MAD_HDR_SIZE:], mad_len=len(pkt["payload"]) - 8)
    return out


def u24(b, off):
    return struct.unpack_from("!I", b, off)[0] >> 8


def gid_str(gid):
    """A GID as text; an IPv4-mapped one as ::ffff:a.b.c.d on every Python version."""
    gid = bytes(gid)
    if gid[:12] == b"\x00" * 10 + b"\xff\xff":
        return "::ffff:" + socket.inet_ntoa(gid[12:])
    return str(ipaddress.IPv6Address(gid))


def decode_req(cm):
    w40, w44 = struct.unpack_from("!II", cm, 40)
    fl = struct.unpack_from("!I", cm, 88)[0]
    return {
        "local_comm_id": struct.unpack_from("!I", cm, 0)[0],
        "service_id": struct.unpack_from("!Q", cm, 8)[0],
        "local_ca_guid": struct.unpack_from("!Q", cm, 16)[0],
        "local_qkey": struct.unpack_from("!I", cm, 28)[0],
        "local_qpn": u24(cm, 32), "responder_resources": cm[35],
        "initiator_depth": cm[39],
        "remote_cm_response_timeout": (w40 >> 3) & 0x1F, "transport_service_type": (w40 >> 1) & 3,
        "end_to_end_flow_control": w40 & 1,
        "starting_psn": w44 >> 8, "local_cm_response_timeout": (w44 >> 3) & 0x1F,
        "retry_count": w44 & 7, "partition_key": struct.unpack_from("!H", cm, 48)[0],
        "path_mtu": cm[50] >> 4, "rdc_exists": (cm[50] >> 3) & 1, "rnr_retry_count": cm[50] & 7,
        "max_cm_retries": cm[51] >> 4, "srq": (cm[51] >> 3) & 1,
        "primary_local_lid": struct.unpack_from("!H", cm, 52)[0],
        "primary_remote_lid": struct.unpack_from("!H", cm, 54)[0],
        "primary_local_gid": gid_str(cm[56:72]),
        "primary_remote_gid": gid_str(cm[72:88]),
        "primary_flow_label": fl >> 12, "primary_packet_rate": fl & 0x3F,
        "primary_traffic_class": cm[92], "primary_hop_limit": cm[93],
        "primary_sl": cm[94] >> 4, "primary_subnet_local": (cm[94] >> 3) & 1,
        "primary_local_ack_timeout": cm[95] >> 3,
        "alternate_all_zero": not any(cm[96:140]),
        "private_data": bytes(cm[140:232]),
    }


def decode_cma_hdr(pd):
    return {"cma_version": pd[0], "ip_version": pd[1] >> 4, "src_port": struct.unpack_from("!H", pd, 2)[0],
            "src_addr": socket.inet_ntoa(pd[16:20]), "dst_addr": socket.inet_ntoa(pd[32:36]),
            "src_pad_zero": not any(pd[4:16]), "dst_pad_zero": not any(pd[20:32])}


def decode_rep(cm):
    return {
        "local_comm_id": struct.unpack_from("!I", cm, 0)[0],
        "remote_comm_id": struct.unpack_from("!I", cm, 4)[0],
        "local_qkey": struct.unpack_from("!I", cm, 8)[0],
        "local_qpn": u24(cm, 12), "local_eecn": u24(cm, 16), "starting_psn": u24(cm, 20),
        "responder_resources": cm[24], "initiator_depth": cm[25],
        "target_ack_delay": cm[26] >> 3, "failover_accepted": (cm[26] >> 1) & 3,
        "end_to_end_flow_control": cm[26] & 1,
        "rnr_retry_count": cm[27] >> 5, "srq": (cm[27] >> 4) & 1,
        "local_ca_guid": struct.unpack_from("!Q", cm, 28)[0],
        "private_data": bytes(cm[36:36 + REP_PRIVATE_SIZE]),
    }


def decode_region(pd):
    """Portico's REP private data: version, flags, 2 zero bytes, rkey (BE u32), address
    (BE u64), length (BE u64), the rest zero."""
    version, flags, zero2, rkey, addr, length = struct.unpack_from("!BBHIQQ", pd, 0)
    return {"version": version, "flags": flags, "rkey": rkey, "addr": addr, "len": length,
            "reserved_zero": zero2 == 0 and not any(pd[24:])}


def decode_ids(cm):
    return {"local_comm_id": struct.unpack_from("!I", cm, 0)[0],
            "remote_comm_id": struct.unpack_from("!I", cm, 4)[0]}


def decode_dreq(cm):
    d = decode_ids(cm)
    d["remote_qpn"] = u24(cm, 8)
    return d


def decode_rej(cm):
    d = decode_ids(cm)
    d.update(message_rejected=cm[8] >> 6, rejected_info_length=cm[9] >> 1,
             reason=struct.unpack_from("!H", cm, 10)[0], ari=bytes(cm[12:12 + (cm[9] >> 1)]).hex())
    return d


def decode_mra(cm):
    d = decode_ids(cm)
    d.update(message_mraed=cm[8] >> 6, service_timeout=cm[9] >> 3)
    return d


def decode_cm(pkt):
    """The CM message of a parsed UD MAD frame, by attribute ID."""
    attr = pkt["mad"]["attr_id"]
    cm = pkt["cm"]
    return {ATTR_REQ: decode_req, ATTR_REP: decode_rep, ATTR_RTU: decode_ids,
            ATTR_DREQ: decode_dreq, ATTR_DREP: decode_ids, ATTR_REJ: decode_rej,
            ATTR_MRA: decode_mra}.get(attr, lambda _cm: {})(cm)


# ---------------------------------------------------------------------------------------------
# Frames
# ---------------------------------------------------------------------------------------------
class Wire:
    """Addresses of both ends; builds the frames this client sends."""

    def __init__(self, my_mac, dut_mac, my_ip, dut_ip, sport=49152):
        self.my_mac, self.dut_mac, self.my_ip, self.dut_ip = my_mac, dut_mac, my_ip, dut_ip
        self.sport = sport
        self.gsi_psn = random.getrandbits(24)

    def _base(self, src_mac=None, dst_mac=None, src_ip=None, dst_ip=None):
        return (Ether(src=src_mac or self.my_mac, dst=dst_mac or self.dut_mac)
                / IP(src=src_ip or self.my_ip, dst=dst_ip or self.dut_ip, flags="DF", ttl=64)
                / UDP(sport=self.sport, dport=ROCE_PORT))

    def mad(self, attr_id, tid, cm_data, reverse=False):
        """A CM MAD as rdma_cm sends it over RoCEv2: UD SEND ONLY to QP1, DETH from QP1.
        `reverse` builds it as the DUT would send it to us (for the self-test)."""
        assert len(cm_data) == CM_DATA_SIZE
        self.gsi_psn = (self.gsi_psn + 1) & 0xFFFFFF
        deth = struct.pack("!II", GSI_QKEY, GSI_QPN)
        body = deth + mad_header(attr_id, tid) + cm_data
        base = (self._base(self.dut_mac, self.my_mac, self.dut_ip, self.my_ip) if reverse
                else self._base())
        return base / BTH(opcode=UD_SEND_ONLY, pkey=DEFAULT_PKEY, dqpn=GSI_QPN,
                          psn=self.gsi_psn) / Raw(body)

    def rc(self, opcode, dqpn, psn, body, ackreq=0, reverse=False):
        base = (self._base(self.dut_mac, self.my_mac, self.dut_ip, self.my_ip) if reverse
                else self._base())
        return base / BTH(opcode=opcode, pkey=DEFAULT_PKEY, dqpn=dqpn, psn=psn,
                          ackreq=ackreq) / Raw(body)


def req_fields(comm_id, port, my_mac, my_ip, dut_ip, my_qpn, psn, sport):
    return {
        "local_comm_id": comm_id, "service_id": service_id(port),
        "local_ca_guid": eui64_guid(my_mac), "local_qkey": 0, "local_qpn": my_qpn,
        "responder_resources": REQ_RESPONDER_RESOURCES, "initiator_depth": REQ_INITIATOR_DEPTH,
        "remote_cm_response_timeout": REQ_CM_RESPONSE_TIMEOUT, "transport_service_type": 0,
        "end_to_end_flow_control": 0, "starting_psn": psn,
        "local_cm_response_timeout": REQ_CM_RESPONSE_TIMEOUT, "retry_count": REQ_RETRY_COUNT,
        "partition_key": DEFAULT_PKEY, "path_mtu": REQ_PATH_MTU, "rdc_exists": 0,
        "rnr_retry_count": REQ_RNR_RETRY_COUNT, "max_cm_retries": REQ_MAX_CM_RETRIES, "srq": 0,
        "primary_local_lid": PERMISSIVE_LID, "primary_remote_lid": PERMISSIVE_LID,
        "primary_local_gid": mapped_gid(my_ip), "primary_remote_gid": mapped_gid(dut_ip),
        "primary_flow_label": 0, "primary_packet_rate": 0, "primary_traffic_class": 0,
        "primary_hop_limit": REQ_HOP_LIMIT, "primary_sl": 0,
        "primary_subnet_local": REQ_SUBNET_LOCAL, "primary_local_ack_timeout": REQ_LOCAL_ACK_TIMEOUT,
        "private_data": cma_hdr(my_ip, dut_ip, sport) + APP_DATA,
    }


def new_comm_id(avoid=()):
    while True:
        c = random.getrandbits(32)
        if c and c not in avoid:
            return c


def kernel_tid(hi_tid, comm_id):
    """Linux cm_form_tid(): the MAD agent's hi_tid in the upper 32 bits, the local comm ID in
    the lower ones. The kernel uses it for the REQ, the RTU (cm_id_priv->tid) and the DREQ."""
    return (hi_tid << 32) | comm_id


# ---------------------------------------------------------------------------------------------
# Checks on what the DUT sent
# ---------------------------------------------------------------------------------------------
def check_ud_envelope(pkt, expect_attr, expect_tid, errors, what):
    """Fields every CM MAD from the DUT must have; appends to `errors`; returns a dict."""
    mad = pkt["mad"]
    checks = {
        "opcode_ud_send_only": pkt["opcode"] == UD_SEND_ONLY,
        "dest_qp_1": pkt["dqpn"] == GSI_QPN,
        "deth_qkey": pkt["deth_qkey"] == GSI_QKEY,
        "deth_src_qp_1": pkt["deth_srcqp"] == GSI_QPN,
        "icrc_ok": pkt["icrc_ok"],
        "mad_256": pkt["mad_len"] == MAD_SIZE,
        "base_version": mad["base_version"] == MAD_BASE_VERSION,
        "mgmt_class_cm": mad["mgmt_class"] == MAD_CLASS_CM,
        "class_version": mad["class_version"] == CM_CLASS_VERSION,
        "method_send": mad["method"] == MAD_METHOD_SEND,
        "status_0": mad["status"] == 0,
        "attr_id": mad["attr_id"] == expect_attr,
        "tid": mad["tid"] == expect_tid,
    }
    for k, v in checks.items():
        if not v:
            errors.append(f"{what}: {k} failed")
    return {"pkey": pkt["pkey"], "psn": pkt["psn"], "dqpn": pkt["dqpn"],
            "deth_qkey": pkt["deth_qkey"], "deth_srcqp": pkt["deth_srcqp"],
            "icrc": pkt["icrc"], "icrc_expected": pkt["icrc_expected"], "icrc_ok": pkt["icrc_ok"],
            "mad": {k: (hex(v) if k == "tid" else v) for k, v in mad.items()},
            "checks": checks}


def check_rep(pkt, req, tid, errors):
    env = check_ud_envelope(pkt, ATTR_REP, tid, errors, "rep")
    rep = decode_cm(pkt)
    region = decode_region(rep["private_data"])
    checks = {
        "remote_comm_id_is_ours": rep["remote_comm_id"] == req["local_comm_id"],
        "local_comm_id_nonzero": rep["local_comm_id"] != 0,
        "local_qpn_nonzero": rep["local_qpn"] != 0,
        "starting_psn_24bit": 0 <= rep["starting_psn"] < 1 << 24,
        "responder_resources_le_our_initiator_depth":
            rep["responder_resources"] <= req["initiator_depth"],
        "initiator_depth_le_our_responder_resources":
            rep["initiator_depth"] <= req["responder_resources"],
        "failover_accepted_0": rep["failover_accepted"] == 0,
        "region_version_1": region["version"] == PORTICO_REGION_VERSION,
        "region_holds_payload": region["len"] >= len(PAYLOAD),
    }
    for k, v in checks.items():
        if not v:
            errors.append(f"rep: {k} failed")
    fields = {k: v for k, v in rep.items() if k != "private_data"}
    for k in ("local_comm_id", "remote_comm_id", "local_qkey", "local_qpn", "local_ca_guid"):
        fields[k] = hex(fields[k])
    fields["private_data_head"] = rep["private_data"][:24].hex()
    return rep, fields, region, dict(env, checks=dict(env["checks"], **checks))


# ---------------------------------------------------------------------------------------------
# Live run against the DUT
# ---------------------------------------------------------------------------------------------
class Inbox:
    """Frames from the DUT, as the sniffer delivers them; wait() takes the first that a
    predicate accepts and keeps the others for later waits."""

    def __init__(self, iface, dut_mac):
        self.q = queue.Queue()
        self.kept = []
        self.unmatched = 0
        self.sniffer = AsyncSniffer(iface=iface, filter=f"udp dst port {ROCE_PORT} and ether src {dut_mac}",
                                    prn=lambda p: self.q.put(bytes(p)), store=False)

    def start(self):
        self.sniffer.start()
        time.sleep(0.5)

    def stop(self):
        try:
            self.sniffer.stop()
        except Exception:  # noqa: BLE001 - the sniffer may have stopped by itself
            pass

    def wait(self, pred, timeout):
        for i, pkt in enumerate(self.kept):
            if pred(pkt):
                return self.kept.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                raw = self.q.get(timeout=min(left, 0.2))
            except queue.Empty:
                continue
            pkt = parse_roce(raw)
            if pkt is None:
                self.unmatched += 1
                continue
            mad = parse_ud_mad(pkt)
            pkt = mad or pkt
            if pred(pkt):
                return pkt
            self.kept.append(pkt)


def is_cm(attrs, remote_comm_id=None):
    def pred(p):
        if "mad" not in p or p["mad"]["attr_id"] not in attrs or p["mad"]["mgmt_class"] != MAD_CLASS_CM:
            return False
        return remote_comm_id is None or decode_ids(p["cm"])["remote_comm_id"] == remote_comm_id
    return pred


def is_rc(opcodes, psn, dqpn):
    return lambda p: "mad" not in p and p["opcode"] in opcodes and p["psn"] == psn and p["dqpn"] == dqpn


def send_and_wait(inbox, iface, frame, pred, timeout, resends, log):
    """Sends `frame`, waits `timeout`; resends it up to `resends` more times."""
    for attempt in range(resends + 1):
        sendp(frame, iface=iface)
        log.append(attempt)
        got = inbox.wait(pred, timeout)
        if got is not None:
            return got
    return None


def live():
    import tap_peer  # the harness puts this directory on Python's path

    result = {"arp": None, "ok": False, "errors": []}
    errors = result["errors"]
    if len(sys.argv) < 11:
        result["errors"].append("usage: IFACE MY_MAC MY_IP DUT_IP RKEY ADDR DUT_QPN MY_QPN PORT BADPORT")
        print(json.dumps(result))
        sys.exit(2)
    # A hard bound on the whole run, whatever the DUT does (the target itself stops after 60 s).
    def out_of_time(_sig, _frame):
        raise TimeoutError("cm_peer: out of time")
    signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(HARD_LIMIT_S)
    peer = tap_peer.start(result)
    port, badport = int(sys.argv[9], 0), int(sys.argv[10], 0)
    iface, my_mac, my_ip, dut_ip = peer.iface, peer.my_mac, peer.my_ip, peer.dut_ip
    my_qpn, dut_mac = peer.my_qpn, peer.dut_mac
    wire = Wire(my_mac, dut_mac, my_ip, dut_ip, sport=random.randrange(49152, 65536))
    result.update(port=port, badport=badport, my_qpn=my_qpn)
    # A socket on UDP 4791 keeps this host's kernel from answering the DUT's RoCE frames with
    # ICMP port-unreachable; nothing reads it (the sniffer sees the frames).
    quiet = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        quiet.bind((my_ip, ROCE_PORT))
    except OSError:
        pass
    inbox = Inbox(iface, dut_mac)
    try:
        inbox.start()
        run_sequence(result, errors, inbox, wire, peer, port, badport)
    except TimeoutError as e:
        errors.append(str(e))
    finally:
        signal.alarm(0)
        inbox.stop()
        quiet.close()
    result["unparsed_frames"] = inbox.unmatched
    result["leftover_frames"] = [{"opcode": p["opcode"], "psn": p["psn"],
                                  "attr": ATTR_NAMES.get(p["mad"]["attr_id"], p["mad"]["attr_id"])
                                  if "mad" in p else None} for p in inbox.kept]
    result["ok"] = not errors
    print(json.dumps(result))
    sys.exit(0 if result["ok"] else 1)


def run_sequence(result, errors, inbox, wire, peer, port, badport):
    iface = peer.iface
    hi_tid = random.getrandbits(32)

    # 2-3. REQ, then REP (an MRA on the way is recorded and waited through).
    comm_id = new_comm_id()
    tid = kernel_tid(hi_tid, comm_id)
    our_psn = random.getrandbits(24)
    req = req_fields(comm_id, port, wire.my_mac, wire.my_ip, wire.dut_ip, peer.my_qpn, our_psn,
                     wire.sport)
    req_frame = wire.mad(ATTR_REQ, tid, encode_req(req))
    result["req"] = {"tid": hex(tid), "local_comm_id": hex(comm_id), "service_id": hex(req["service_id"]),
                     "local_qpn": hex(peer.my_qpn), "starting_psn": our_psn,
                     "icrc_scapy_eq_own": bytes(req_frame)[-4:] == roce_icrc(bytes(req_frame)),
                     "sends": []}
    if not result["req"]["icrc_scapy_eq_own"]:
        errors.append("req: scapy's ICRC differs from our own")
    mras = []
    rep_pkt = None
    reply_pred = is_cm((ATTR_REP, ATTR_REJ, ATTR_MRA), comm_id)
    for attempt in range(4):
        sendp(req_frame, iface=iface)
        result["req"]["sends"].append(attempt)
        deadline = time.monotonic() + 5.0
        while rep_pkt is None:
            got = inbox.wait(reply_pred, max(0.0, deadline - time.monotonic()))
            if got is None:
                break
            if got["mad"]["attr_id"] == ATTR_MRA:
                mras.append(decode_mra(got["cm"]))
                continue
            rep_pkt = got
        if rep_pkt is not None:
            break
    if mras:
        result["mra"] = mras
    if rep_pkt is None:
        errors.append("rep: no REP (nor REJ) from the DUT after 4 REQs")
    elif rep_pkt["mad"]["attr_id"] == ATTR_REJ:
        result["rep_rejected"] = decode_rej(rep_pkt["cm"])
        errors.append(f"rep: the DUT rejected the REQ, reason {result['rep_rejected']['reason']}")
        rep_pkt = None

    rep = region = None
    if rep_pkt is not None:
        rep, result["rep"], region, env = check_rep(rep_pkt, req, tid, errors)
        result["rep_frame"] = env
        result["rep_icrc_ok"] = env["icrc_ok"]
        result["region"] = {k: (hex(v) if k in ("rkey", "addr") else v) for k, v in region.items()}
        result["region_matches_ready"] = region["rkey"] == peer.rkey and region["addr"] == peer.addr
        result["dut_qpn_matches_arg"] = rep["local_qpn"] == peer.dut_qpn

    if rep is not None:
        # 4. RTU: the REQ's TID (cm_format_rtu uses cm_id_priv->tid, set from the REQ).
        rtu = wire.mad(ATTR_RTU, tid, encode_ids(comm_id, rep["local_comm_id"]))
        sendp(rtu, iface=iface)
        result["rtu_sent"] = {"tid": hex(tid), "local_comm_id": hex(comm_id),
                              "remote_comm_id": hex(rep["local_comm_id"])}
        time.sleep(0.1)

        # 5. RC traffic on the new QP: our PSNs continue from the REQ's starting PSN; the
        # DUT's responses carry the PSNs of our requests (its own starting PSN, from the REP,
        # would only number requests it sends).
        dut_qpn = rep["local_qpn"]
        if region["version"] == PORTICO_REGION_VERSION and region["len"] >= len(PAYLOAD):
            reth = struct.pack("!QII", region["addr"], region["rkey"], len(PAYLOAD))
            write_psn = our_psn
            write = wire.rc(RC_WRITE_ONLY, dut_qpn, write_psn, reth + PAYLOAD, ackreq=1)
            ack = send_and_wait(inbox, iface, write, is_rc((RC_ACKNOWLEDGE,), write_psn, peer.my_qpn),
                                5.0, 2, result.setdefault("write_sends", []))
            if ack is None:
                errors.append("write: no ACK")
            else:
                syn = ack["payload"][0] if ack["payload"] else None
                msn = int.from_bytes(ack["payload"][1:4], "big") if len(ack["payload"]) >= 4 else None
                result["write_ack"] = {"opcode": ack["opcode"], "psn": ack["psn"], "dqpn": ack["dqpn"],
                                       "syndrome": syn, "msn": msn, "icrc_ok": ack["icrc_ok"]}
                if syn is None or syn >> 5 != 0:
                    errors.append(f"write: not an ACK (syndrome {syn})")
                if not ack["icrc_ok"]:
                    errors.append("write: ACK ICRC wrong")
            read_psn = (our_psn + 1) & 0xFFFFFF
            read = wire.rc(RC_READ_REQUEST, dut_qpn, read_psn, reth, ackreq=1)
            resp = send_and_wait(inbox, iface, read,
                                 is_rc((RC_READ_RESPONSE_ONLY, RC_ACKNOWLEDGE), read_psn, peer.my_qpn),
                                 5.0, 2, result.setdefault("read_sends", []))
            if resp is None:
                errors.append("read: no response")
            else:
                data = resp["payload"][4:]
                result["read_response"] = {"opcode": resp["opcode"], "psn": resp["psn"],
                                           "dqpn": resp["dqpn"], "syndrome": resp["payload"][0],
                                           "icrc_ok": resp["icrc_ok"]}
                result["read_data"] = data.hex()
                result["read_matches"] = data == PAYLOAD
                if resp["opcode"] != RC_READ_RESPONSE_ONLY:
                    errors.append(f"read: got opcode {resp['opcode']:#x}, not READ RESPONSE ONLY")
                elif data != PAYLOAD:
                    errors.append("read: data differs from what was written")
                if not resp["icrc_ok"]:
                    errors.append("read: response ICRC wrong")
        else:
            errors.append("rc: no usable region in the REP, WRITE/READ skipped")

        # 6. DREQ -> DREP. The kernel's DREQ TID is cm_form_tid() again, i.e. the REQ's TID;
        # the DREP must echo the DREQ's TID (cm_dreq_handler saves it, cm_format_drep uses it).
        dreq = wire.mad(ATTR_DREQ, tid, encode_dreq(comm_id, rep["local_comm_id"], dut_qpn))
        drep = send_and_wait(inbox, iface, dreq, is_cm((ATTR_DREP,), comm_id), 5.0, 2,
                             result.setdefault("dreq_sends", []))
        if drep is None:
            result["drep_ok"] = False
            errors.append("drep: no DREP")
        else:
            d = decode_ids(drep["cm"])
            denv = check_ud_envelope(drep, ATTR_DREP, tid, errors, "drep")
            ok = d["remote_comm_id"] == comm_id and d["local_comm_id"] == rep["local_comm_id"]
            if not ok:
                errors.append("drep: comm IDs do not match")
            result["drep"] = {"local_comm_id": hex(d["local_comm_id"]),
                              "remote_comm_id": hex(d["remote_comm_id"]), "icrc_ok": denv["icrc_ok"],
                              "tid": denv["mad"]["tid"]}
            result["drep_ok"] = ok and all(denv["checks"].values())

    # 7. A REQ for a service nobody listens on: REJ, reason 8 (invalid service ID), message
    # rejected 0 (REQ). A new comm ID, and a new QPN: a new rdma_cm id has a new QP, and a
    # kernel CM checks for a stale connection (same remote QPN and CA GUID still in timewait,
    # REJ reason 10) before it looks up the service ID.
    comm2 = new_comm_id({comm_id})
    tid2 = kernel_tid(hi_tid, comm2)
    qpn2 = (peer.my_qpn + 1) & 0xFFFFFF
    req2 = req_fields(comm2, badport, wire.my_mac, wire.my_ip, wire.dut_ip, qpn2,
                      random.getrandbits(24), wire.sport)
    req2_frame = wire.mad(ATTR_REQ, tid2, encode_req(req2))
    result["req2"] = {"tid": hex(tid2), "local_comm_id": hex(comm2),
                      "service_id": hex(req2["service_id"]), "local_qpn": hex(qpn2)}
    got = send_and_wait(inbox, iface, req2_frame, is_cm((ATTR_REJ, ATTR_REP), comm2), 5.0, 1,
                        result.setdefault("req2_sends", []))
    if got is None:
        result["rej_reason"] = None
        errors.append("rej: no REJ for the unknown service ID")
    elif got["mad"]["attr_id"] == ATTR_REP:
        result["rej_reason"] = None
        errors.append("rej: the DUT accepted a REQ for an unknown service ID")
    else:
        rej = decode_rej(got["cm"])
        renv = check_ud_envelope(got, ATTR_REJ, tid2, errors, "rej")
        result["rej"] = dict(rej, local_comm_id=hex(rej["local_comm_id"]),
                             remote_comm_id=hex(rej["remote_comm_id"]), icrc_ok=renv["icrc_ok"],
                             tid=renv["mad"]["tid"])
        result["rej_reason"] = rej["reason"]
        result["rej_message_rejected"] = rej["message_rejected"]
        if rej["reason"] != REJ_REASON_INVALID_SERVICE_ID:
            errors.append(f"rej: reason {rej['reason']}, expected {REJ_REASON_INVALID_SERVICE_ID}")
        if rej["message_rejected"] != REJ_MSG_REQ:
            errors.append(f"rej: message rejected {rej['message_rejected']}, expected 0 (REQ)")


# ---------------------------------------------------------------------------------------------
# Offline self-test
# ---------------------------------------------------------------------------------------------
def selftest(outdir):
    conf.verb = 0
    os.makedirs(outdir, exist_ok=True)
    errors = []
    out = {"errors": errors}
    my_mac, dut_mac, my_ip, dut_ip = "02:00:00:00:00:0a", "02:00:00:00:00:0b", "10.77.0.1", "10.77.0.2"
    my_qpn, dut_qpn, port, badport = 0x11, 0x22, 7471, 7472
    wire = Wire(my_mac, dut_mac, my_ip, dut_ip, sport=50000)
    hi_tid = 0x1234ABCD
    comm_id, dut_comm_id, comm2 = 0x0A0B0C0D, 0x5A5B5C5D, 0x0E0F1011
    tid, tid2 = kernel_tid(hi_tid, comm_id), kernel_tid(hi_tid, comm2)
    our_psn, dut_psn = 0x00ABCDEF, 0x00123456
    rkey, addr, rlen = 0x00C0FFEE, 0x7F0012340000, 65536

    # ICRC: our own against scapy's, on an RC WRITE first (what scapy_peer.py already relies on).
    write = wire.rc(RC_WRITE_ONLY, dut_qpn, our_psn,
                    struct.pack("!QII", addr, rkey, len(PAYLOAD)) + PAYLOAD, ackreq=1)
    wb = bytes(write)
    out["icrc_rc_write"] = {"scapy": wb[-4:].hex(), "own": roce_icrc(wb).hex()}
    if wb[-4:] != roce_icrc(wb):
        errors.append("icrc: own != scapy on RC WRITE")

    req = req_fields(comm_id, port, my_mac, my_ip, dut_ip, my_qpn, our_psn, wire.sport)
    frames = {}
    frames["REQ"] = wire.mad(ATTR_REQ, tid, encode_req(req))
    region_pd = struct.pack("!BBHIQQ", PORTICO_REGION_VERSION, 0, 0, rkey, addr, rlen)
    rep_f = {"local_comm_id": dut_comm_id, "remote_comm_id": comm_id, "local_qkey": 0,
             "local_qpn": dut_qpn, "starting_psn": dut_psn, "responder_resources": 4,
             "initiator_depth": 4, "target_ack_delay": 15, "failover_accepted": 0,
             "end_to_end_flow_control": 0, "rnr_retry_count": 7, "srq": 0,
             "local_ca_guid": eui64_guid(dut_mac), "private_data": region_pd}
    frames["REP"] = wire.mad(ATTR_REP, tid, encode_rep(rep_f), reverse=True)
    frames["RTU"] = wire.mad(ATTR_RTU, tid, encode_ids(comm_id, dut_comm_id))
    frames["DREQ"] = wire.mad(ATTR_DREQ, tid, encode_dreq(comm_id, dut_comm_id, dut_qpn))
    frames["DREP"] = wire.mad(ATTR_DREP, tid, encode_ids(dut_comm_id, comm_id), reverse=True)
    req2 = req_fields(comm2, badport, my_mac, my_ip, dut_ip, my_qpn + 1, 0x000777, wire.sport)
    frames["REQ2"] = wire.mad(ATTR_REQ, tid2, encode_req(req2))
    frames["REJ"] = wire.mad(ATTR_REJ, tid2, encode_rej(0, comm2, REJ_MSG_REQ,
                                                        REJ_REASON_INVALID_SERVICE_ID), reverse=True)
    frames["WRITE"] = write
    ack = wire.rc(RC_ACKNOWLEDGE, my_qpn, our_psn, struct.pack("!I", 0x1F << 24 | 1), reverse=True)
    frames["ACK"] = ack
    frames["READ"] = wire.rc(RC_READ_REQUEST, dut_qpn, (our_psn + 1) & 0xFFFFFF,
                             struct.pack("!QII", addr, rkey, len(PAYLOAD)), ackreq=1)
    frames["READ_RESPONSE"] = wire.rc(RC_READ_RESPONSE_ONLY, my_qpn, (our_psn + 1) & 0xFFFFFF,
                                      struct.pack("!I", 0x1F << 24 | 2) + PAYLOAD, reverse=True)
    order = ["REQ", "REP", "RTU", "WRITE", "ACK", "READ", "READ_RESPONSE", "DREQ", "DREP", "REQ2",
             "REJ"]
    for i, name in enumerate(order):
        frames[name].time = 1_700_000_000 + i / 1000

    # Every frame: own ICRC == scapy's, and the parser reads back what was encoded.
    out["frames"] = {}
    for name in order:
        fb = bytes(frames[name])
        p = parse_roce(fb)
        info = {"len": len(fb), "icrc_ok": p["icrc_ok"], "scapy_icrc_eq_own": scapy_icrc(fb) == roce_icrc(fb)}
        if not (p["icrc_ok"] and info["scapy_icrc_eq_own"]):
            errors.append(f"{name}: ICRC mismatch")
        m = parse_ud_mad(p)
        if m is not None:
            info["attr"] = ATTR_NAMES.get(m["mad"]["attr_id"])
            info["tid"] = hex(m["mad"]["tid"])
        out["frames"][name] = info

    # Round trips through the decoders.
    d = decode_req(parse_ud_mad(parse_roce(bytes(frames["REQ"])))["cm"])
    want = dict(req, primary_local_gid="::ffff:" + my_ip, primary_remote_gid="::ffff:" + dut_ip,
                private_data=req["private_data"].ljust(REQ_PRIVATE_SIZE, b"\x00"))
    bad = [k for k in want if d.get(k) != want[k]]
    if bad:
        errors.append(f"REQ round trip differs in {bad}")
    cma = decode_cma_hdr(d["private_data"])
    out["req_cma_hdr"] = cma
    if (cma["cma_version"], cma["ip_version"], cma["src_port"], cma["src_addr"], cma["dst_addr"]) != (
            0, 4, wire.sport, my_ip, dut_ip) or d["private_data"][36:36 + len(APP_DATA)] != APP_DATA:
        errors.append("REQ: CMA header / application data wrong")

    rep_pkt = parse_ud_mad(parse_roce(bytes(frames["REP"])))
    rep_errors = []
    rep, out["rep"], region, env = check_rep(rep_pkt, req, tid, rep_errors)
    out["region"] = region
    if rep_errors:
        errors.extend(rep_errors)
    if (region["rkey"], region["addr"], region["len"]) != (rkey, addr, rlen):
        errors.append("REP region round trip")
    if (rep["local_qpn"], rep["starting_psn"], rep["target_ack_delay"], rep["rnr_retry_count"]) != (
            dut_qpn, dut_psn, 15, 7):
        errors.append("REP field round trip")
    # A REP whose comm ID, TID, ICRC or region version is wrong must fail the checks.
    broken = bytearray(bytes(frames["REP"]))
    broken[-10] ^= 0x01
    bp = parse_ud_mad(parse_roce(bytes(broken)))
    be = []
    check_rep(bp, req, tid, be)
    if not any("icrc" in e for e in be):
        errors.append("a corrupted REP passed the ICRC check")
    be = []
    check_rep(rep_pkt, dict(req, local_comm_id=comm_id ^ 1), tid ^ 1, be)
    if not any("remote_comm_id" in e for e in be) or not any("tid" in e for e in be):
        errors.append("a REP for another comm ID / TID passed")

    drep = parse_ud_mad(parse_roce(bytes(frames["DREP"])))
    de = []
    check_ud_envelope(drep, ATTR_DREP, tid, de, "drep")
    if de or decode_ids(drep["cm"]) != {"local_comm_id": dut_comm_id, "remote_comm_id": comm_id}:
        errors.append(f"DREP parse: {de}")
    rej = parse_ud_mad(parse_roce(bytes(frames["REJ"])))
    re_ = []
    check_ud_envelope(rej, ATTR_REJ, tid2, re_, "rej")
    rd = decode_rej(rej["cm"])
    out["rej"] = rd
    if re_ or rd["reason"] != 8 or rd["message_rejected"] != 0 or rd["remote_comm_id"] != comm2:
        errors.append(f"REJ parse: {re_} {rd}")
    dq = decode_dreq(parse_ud_mad(parse_roce(bytes(frames["DREQ"])))["cm"])
    if dq != {"local_comm_id": comm_id, "remote_comm_id": dut_comm_id, "remote_qpn": dut_qpn}:
        errors.append(f"DREQ round trip {dq}")
    ap = parse_roce(bytes(frames["ACK"]))
    if not is_rc((RC_ACKNOWLEDGE,), our_psn, my_qpn)(ap) or ap["payload"][0] >> 5 != 0:
        errors.append("ACK parse")
    rp = parse_roce(bytes(frames["READ_RESPONSE"]))
    read_psn = (our_psn + 1) & 0xFFFFFF
    if not is_rc((RC_READ_RESPONSE_ONLY,), read_psn, my_qpn)(rp) or rp["payload"][4:] != PAYLOAD:
        errors.append("READ RESPONSE parse")

    # Inbox matching without a sniffer.
    ib = Inbox.__new__(Inbox)
    ib.q, ib.kept, ib.unmatched = queue.Queue(), [], 0
    for name in ("ACK", "DREP", "REJ", "REP"):
        ib.q.put(bytes(frames[name]))
    got = ib.wait(is_cm((ATTR_REP, ATTR_REJ, ATTR_MRA), comm_id), 1.0)
    if got is None or got["mad"]["attr_id"] != ATTR_REP:
        errors.append("inbox: REP not matched")
    if (ib.wait(is_cm((ATTR_DREP,), comm_id), 0.1) is None
            or ib.wait(is_rc((RC_ACKNOWLEDGE,), our_psn, my_qpn), 0.1) is None):
        errors.append("inbox: kept frames not matched later")

    # The pcap and tshark.
    pcap = os.path.join(outdir, "cm_peer.pcap")
    wrpcap(pcap, [frames[n] for n in order])
    out["pcap"] = pcap
    try:
        tshark = subprocess.run(["tshark", "-r", pcap, "-V", "-Y", "infiniband"], capture_output=True,
                                text=True, timeout=60)
        text = tshark.stdout
        with open(os.path.join(outdir, "tshark.txt"), "w") as fh:
            fh.write(text + tshark.stderr)
        out["tshark_rc"] = tshark.returncode
        out["tshark_malformed"] = "Malformed" in text
        if tshark.returncode != 0 or "Malformed" in text:
            errors.append("tshark: failed or Malformed")
        blocks = text.split("\nFrame ")
        out["tshark_frames"] = len(blocks)
        if len(blocks) != len(order):
            errors.append(f"tshark shows {len(blocks)} frames, wrote {len(order)}")
        # What tshark must show in each frame (it decodes CM MADs and rdma_cm's IP CM header).
        expect = {
            "REQ": ["CM ConnectRequest", "Attribute ID: 0x0010", "Transaction ID: 0x1234abcd0a0b0c0d",
                    "Local Communication ID: 0x0a0b0c0d", "Protocol: 0x06", "Destination Port: 0x1d2f",
                    "Local QPN: 0x000011", "Starting PSN: 0xabcdef", "Partition Key: 0xffff",
                    "Path Packet Payload MTU: 0x3", "Primary Local Port GID: 10.77.0.1",
                    "Primary Remote Port GID: 10.77.0.2", "Primary Hop Limit: 0x40",
                    "IP CM IP Version: 0x4", "IP CM Source Port: 0xc350", "IP CM Source IP: 10.77.0.1",
                    "IP CM Destination IP: 10.77.0.2", "Queue Key: 0x0000000080010000",
                    "Destination Queue Pair: 0x000001", "Source Queue Pair: 0x00000001"],
            "REP": ["CM ConnectReply", "Remote Communication ID: 0x0a0b0c0d", "Local QPN: 0x000022",
                    "Starting PSN: 0x123456"],
            "RTU": ["CM ReadyToUse", "Local Communication ID: 0x0a0b0c0d",
                    "Remote Communication ID: 0x5a5b5c5d", "Transaction ID: 0x1234abcd0a0b0c0d"],
            "WRITE": ["RDMA WRITE Only", "Remote Key: 0x00c0ffee", "DMA Length: 40"],
            "ACK": ["Acknowledge", "OpCode: Ack (0)"],
            "READ": ["RDMA READ Request", "Remote Key: 0x00c0ffee"],
            "READ_RESPONSE": ["RDMA READ response Only", "Destination Queue Pair: 0x000011"],
            "DREQ": ["CM DisconnectRequest", "Remote QPN/EECN: 0x000022"],
            "DREP": ["CM DisconnectReply", "Remote Communication ID: 0x0a0b0c0d"],
            "REQ2": ["CM ConnectRequest", "Destination Port: 0x1d30", "Local QPN: 0x000012",
                     "Transaction ID: 0x1234abcd0e0f1011"],
            "REJ": ["CM ConnectReject", "Reason: 0x0008", "Message REJected: 0x0",
                    "Remote Communication ID: 0x0e0f1011"],
        }
        out["tshark_checks"] = {}
        for name, block in zip(order, blocks):
            missing = [e for e in expect[name] if e not in block]
            out["tshark_checks"][name] = "ok" if not missing else missing
            if missing:
                errors.append(f"tshark {name}: missing {missing}")
    except (OSError, subprocess.TimeoutExpired) as e:
        errors.append(f"tshark: {e}")
    out["ok"] = not errors
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--selftest":
        sys.exit(selftest(sys.argv[2] if len(sys.argv) > 2 else "."))
    live()
