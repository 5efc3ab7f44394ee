#!/usr/bin/python3
"""Writes the fuzz seed frames in this folder: one valid frame of each kind
(float32 data, bfloat16 and float16 aggregates, bytes aggregate, ack,
partition start-up, ARP request)
addressed to the fuzz target's local endpoint 02:00:00:00:00:01 /
10.0.0.1:47100, with correct IPv4 and UDP checksums. Run from this folder."""
import struct


def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


OURS = bytes([2, 0, 0, 0, 0, 1])
PEER = bytes([2, 0, 0, 0, 0, 2])
VERSION = 6  # wire::kVersion


def frame(typ, payload, dtype=1, offset=0, msg_len=None):
    if msg_len is None:
        msg_len = len(payload) + offset
    # lib/wire/header.h: ... payload_len credit sack epoch reserved
    mh = struct.pack("!BBHIHBBIIIIIIIIHHQII", VERSION, typ, 1, 7, 2, 3, dtype, 42, 1, msg_len,
                     offset, 5, 4, 100, 90, len(payload), 128, 0x5, 1, 0)
    assert len(mh) == 64
    udp_len = 8 + len(mh) + len(payload)
    src, dst = bytes([10, 0, 0, 2]), bytes([10, 0, 0, 1])
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + udp_len, 0, 0x4000, 64, 17, 0, src, dst)
    ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
    udph = struct.pack("!HHHH", 47101, 47100, udp_len, 0)
    pseudo = src + dst + struct.pack("!BBH", 0, 17, udp_len)
    c = csum(pseudo + udph + mh + payload) or 0xFFFF
    udph = udph[:6] + struct.pack("!H", c)
    return OURS + PEER + b"\x08\x00" + ip + udph + mh + payload


open("data_float32", "wb").write(frame(1, bytes(range(64)) * 4 + b"\x01\x00\x00\x01"))
open("agg_bfloat16", "wb").write(frame(2, bytes(range(100)), dtype=2, offset=1408, msg_len=4096))
open("agg_float16", "wb").write(frame(2, bytes(range(7, 71)), dtype=3, offset=2, msg_len=66))
open("agg_bytes", "wb").write(frame(2, b"hello mercury!!", dtype=0, offset=16, msg_len=64))
open("ack", "wb").write(frame(3, b"", dtype=0))
open("partition_start", "wb").write(frame(6, b"", dtype=0, msg_len=0))
arp = (b"\xff" * 6 + PEER + b"\x08\x06" +
       struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, PEER, bytes([10, 0, 0, 2]), b"\0" * 6,
                   bytes([10, 0, 0, 1])))
open("arp_request", "wb").write(arp + b"\0" * (60 - len(arp)))
