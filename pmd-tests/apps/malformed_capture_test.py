#!/usr/bin/python3
"""Malformed and foreign traffic, replayed into ps-server: a capture written
with scapy (Debian's python3-scapy) holds a different number of frames of
every class the receive path refuses, from a frame too short for Ethernet to
a well-formed Mercury packet of another job. ps-server reads it through one
net_pcap port (rx_pcap), and its last line must count each class by its own
reason, exactly, and nothing else: no frame may be dropped under another
name or pass unnoticed.

Usage: malformed_capture_test.py PS_SERVER_BINARY
"""
import os
import re
import struct
import subprocess
import sys
import tempfile
import unittest

PS_SERVER = None
JOB_ID = 41
SERVER_MAC, SERVER_IP, PORT = "02:00:00:00:00:01", "10.9.0.1", 47100
WORKER_MAC, WORKER_IP = "02:00:00:00:00:11", "10.9.0.11"

JOB = """job: {{id: {job}, name: {name}}}
network: {{mtu: 1500}}
eal: {{memory_mb: 256, hugepages: off}}
nodes:
  - {{name: server0, role: server, ipv4: {sip}, mac: "{smac}",
     ports: ["net_pcap0,rx_pcap={rx},tx_pcap={tx}"], lcores: [0, 1], shards: 1}}
  - {{name: w0, role: worker, ipv4: {wip}, mac: "{wmac}",
     ports: ["net_memif10,role=client,socket={tmp}/w0.sock"], lcores: [1]}}
"""


def mercury_header(version=6, job=JOB_ID, payload=b"\0\0\0\0"):
    """A `data` packet's 64-byte header (docs/wire-format.md), then its payload."""
    # version type flags job_id sender_id priority dtype block_key msg_id msg_len offset
    # iteration param_version seq ack payload_len credit sack epoch reserved
    return struct.pack(">BBHIHBBIIIIIIIIHHQI4x", version, 1, 0, job, 1, 0, 1, 0, 0,
                       len(payload), 0, 0, 0, 0, 0, len(payload), 0, 0, 7) + payload


def frames():
    """Each class of refused frame, and how many of it: counts differ, so a
    class counted under another's name shows."""
    from scapy.layers.inet import IP, TCP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    def udp(**kw):
        ip = dict(src=WORKER_IP, dst=SERVER_IP)
        ip.update({k: v for k, v in kw.items() if k in ("src", "dst", "chksum_ip", "flags")})
        if "chksum_ip" in ip:
            ip["chksum"] = ip.pop("chksum_ip")
        u = dict(sport=PORT, dport=kw.get("dport", PORT))
        if "udp_chksum" in kw:
            u["chksum"] = kw["udp_chksum"]
        if "udp_len" in kw:
            u["len"] = kw["udp_len"]
        eth = Ether(src=WORKER_MAC, dst=kw.get("mac", SERVER_MAC))
        return eth / IP(**ip) / UDP(**u) / Raw(kw.get("payload", mercury_header()))

    good_ip = dict(src=WORKER_IP, dst=SERVER_IP)
    return {
        "frame_truncated": (1, lambda: Raw(b"\x01" * 10)),
        "not_our_mac": (2, lambda: udp(mac="02:00:00:00:00:99")),
        "unknown_ether_type": (3, lambda: Ether(src=WORKER_MAC, dst=SERVER_MAC, type=0x88B5) /
                               Raw(b"\0" * 46)),
        "ip_bad_checksum": (4, lambda: udp(chksum_ip=0x1234)),
        "ip_fragment": (5, lambda: udp(flags="MF")),
        "not_our_ip": (6, lambda: udp(dst="10.9.0.99")),
        "not_udp": (7, lambda: Ether(src=WORKER_MAC, dst=SERVER_MAC) / IP(**good_ip) /
                    TCP(sport=PORT, dport=PORT)),
        "udp_bad_length": (8, lambda: udp(udp_len=400)),
        "udp_bad_checksum": (9, lambda: udp(udp_chksum=0x1234)),
        "not_our_port": (10, lambda: udp(dport=47199)),
        "mercury_header": (11, lambda: udp(payload=mercury_header(version=9))),
        # Well-formed Mercury packets: from a sender not in the job, and of another job.
        "unknown_peer": (12, lambda: udp(src="10.9.0.77")),
        "wrong_job": (13, lambda: udp(payload=mercury_header(job=999))),
    }


class MalformedCapture(unittest.TestCase):
    def test_every_class_is_counted_by_its_reason(self):
        from scapy.utils import wrpcap

        expected = {}
        packets = []
        for reason, (count, make) in frames().items():
            expected[reason] = count
            packets += [make() for _ in range(count)]
        # Interleaved, as an attacker's traffic would be.
        packets = [packets[i] for i in sorted(range(len(packets)), key=lambda i: (i * 7919) % 97)]
        with tempfile.TemporaryDirectory() as tmp:
            rx, tx = os.path.join(tmp, "in.pcap"), os.path.join(tmp, "out.pcap")
            wrpcap(rx, packets, linktype=1)  # Ethernet, the 10-byte runt included
            job = os.path.join(tmp, "job.yaml")
            with open(job, "w") as f:
                f.write(JOB.format(job=JOB_ID, name="malformed%d" % os.getpid(), sip=SERVER_IP,
                                   smac=SERVER_MAC, wip=WORKER_IP, wmac=WORKER_MAC, rx=rx,
                                   tx=tx, tmp=tmp))
            r = subprocess.run([PS_SERVER, "--config", job, "--node", "server0", "--seconds",
                                "2"], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            last = [line for line in r.stdout.splitlines() if "stopped;" in line]
            self.assertTrue(last, r.stdout + r.stderr)
            drops = dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)",
                                                             last[-1].split("drops:")[1]))
            self.assertEqual(drops, expected, last[-1])
            print(f"\n{len(packets)} frames in {len(expected)} classes, each counted by its "
                  f"reason: {last[-1]}", file=sys.stderr)


if __name__ == "__main__":
    PS_SERVER = sys.argv[1]
    unittest.main(argv=[sys.argv[0], "-v"])
