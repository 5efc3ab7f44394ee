#!/usr/bin/python3
# The attacker of pmd_ps_hosts_auth (run-ps-hosts-auth-test): a host on the
# job's bridge that is no node of the job and has no key. It sees a copy of
# what one worker sends to the server (the test mirrors that worker's bridge
# port to this host's), then, while the job runs, sends the server:
#   1. captured packets again, byte for byte (a replay: refused by the
#      replay window, auth_replay);
#   2. packets forged as the worker's (its MAC, IP and UDP port, its job id
#      and sender id), each with an AuthBlock whose tag is a real AES-256-GMAC
#      under a key of the attacker's own (auth_bad_mac): gradient packets
#      whose floats are all 1e30, and pure ACKs of the worker's next epoch
#      (a restart the server must not believe);
#   3. those ACKs without the auth flag and block (auth_missing).
# With --no-key (pmd_ps_hosts_forged_epoch: the job does not sign) it sends
# only packets of the worker's next epoch, without an auth block: pure ACKs
# and gradient packets of 1e30s. The server must challenge the worker, which
# answers, and drop every one of them (verdict_challenged).
# Every packet is built the way Mercury signs (lib/transport/auth.cpp): the
# MAC key is HKDF-SHA256(key, salt "mercury", info "mercury packet mac"), the
# nonce (sender id, receiver id, counter), everything additional data. With
# --job-key the attacker checks that construction against the captured
# tags under the job's real key (a check of this script, not an attack): so
# the forged tags fail because of their key alone, not their form.
#
# Prints one line per step; the last is "attacker: sent replayed=R
# forged_data=D forged_ack_mac=A forged_ack_bare=B" (with --no-key "attacker:
# sent forged_epoch_ack=A forged_epoch_data=D"), which the test compares
# with the server's drop counters. Exits non-zero (with the reason) if it
# cannot capture what it needs in time.
#
# Debian's scapy (python3-scapy) under /usr/bin/python3. Capture and sending
# use scapy's raw L2 sockets: dissecting every mirrored frame would cost a
# core the job needs, and a replay must go out exactly as captured.
import argparse
import os
import socket
import struct
import sys
import time

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from scapy.all import IP, UDP, Ether, Raw, conf

# lib/wire/header.h
VERSION = 6
HEADER = 64
AUTH = 24  # wire::AuthBlock: be64 counter, 16-byte tag
DATA, ACK = 1, 3  # wire::PacketType
ACK_VALID, AUTH_FLAG = 0x0001, 0x0040  # wire::flags
OFF_TYPE, OFF_FLAGS, OFF_SENDER, OFF_DTYPE = 1, 2, 8, 11
OFF_PAYLOAD_LEN, OFF_EPOCH = 44, 56  # epoch: be32


def say(*words):
    print("attacker:", *words, flush=True)


def mac_key(key):
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=b"mercury",
                info=b"mercury packet mac").derive(key)


def gmac(key, sender, receiver, header, counter, payload):
    """The tag Mercury's Authenticator computes under `key` (already derived)."""
    nonce = struct.pack(">HHQ", sender, receiver, counter)
    return AESGCM(key).encrypt(nonce, b"", header + struct.pack(">Q", counter) + payload)


class Frame:
    """One captured Mercury frame, worker to server, split into its parts."""

    def __init__(self, raw, ip_off, udp_off):
        self.raw = raw
        self.dst_mac, self.src_mac = raw[0:6], raw[6:12]
        self.sport, self.dport = struct.unpack_from(">HH", raw, udp_off)
        m = udp_off + 8
        udp_len = struct.unpack_from(">H", raw, udp_off + 4)[0]
        self.mercury = raw[m:udp_off + udp_len]
        self.header = self.mercury[:HEADER]
        self.type = self.header[OFF_TYPE]
        self.flags = struct.unpack_from(">H", self.header, OFF_FLAGS)[0]
        self.sender = struct.unpack_from(">H", self.header, OFF_SENDER)[0]
        self.epoch = struct.unpack_from(">I", self.header, OFF_EPOCH)[0]
        if self.flags & AUTH_FLAG:
            self.counter = struct.unpack_from(">Q", self.mercury, HEADER)[0]
            self.tag = self.mercury[HEADER + 8:HEADER + AUTH]
            self.payload = self.mercury[HEADER + AUTH:]
        else:
            self.counter, self.tag, self.payload = None, None, self.mercury[HEADER:]


def mercury_frame(raw, src, dst):
    """A Frame if `raw` is an IPv4/UDP Mercury frame from `src` to `dst`."""
    if len(raw) < 14 + 20 + 8 + HEADER or raw[12:14] != b"\x08\x00":
        return None
    ihl = (raw[14] & 0x0F) * 4
    if raw[14 + 9] != 17 or raw[14 + 12:14 + 16] != src or raw[14 + 16:14 + 20] != dst:
        return None
    udp = 14 + ihl
    if len(raw) < udp + 8 + HEADER or raw[udp + 8] != VERSION:
        return None
    return Frame(raw, 14, udp)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iface", default="eth0")
    ap.add_argument("--worker-ip", required=True)
    ap.add_argument("--server-ip", required=True)
    ap.add_argument("--server-id", type=int, required=True,
                    help="the server's node index in the job file (the nonce's receiver)")
    ap.add_argument("--job-key", help="the job's key file: only to check this script's GMAC")
    ap.add_argument("--no-key", action="store_true",
                    help="the job does not sign: send only unsigned packets of a next epoch")
    ap.add_argument("--data", type=int, default=24, help="gradient packets to capture")
    ap.add_argument("--other", type=int, default=8, help="other packets to capture (first seen)")
    ap.add_argument("--forge", type=int, default=16, help="packets of each forged kind")
    ap.add_argument("--gap-ms", type=float, default=2.0, help="pause between sent packets")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds to capture in")
    a = ap.parse_args()
    src, dst = socket.inet_aton(a.worker_ip), socket.inet_aton(a.server_ip)

    out = conf.L2socket(iface=a.iface)
    gap = a.gap_ms / 1000.0

    def send(frame):
        out.send(frame)
        time.sleep(gap)

    # 1. Capture. Promiscuous: the mirrored frames are addressed to the server.
    # The first packets that are no gradients (the worker's control messages,
    # each followed by a wait for the answer, then the start of its initial
    # parameters) are replayed at once, most while their counters are still
    # among the last 64 the server took (refused as taken already); the
    # gradients later, when theirs are far below (refused as too old). Both
    # count as auth_replay.
    listen = conf.L2listen(iface=a.iface, promisc=True)
    say("sniffing on", a.iface, "for", a.worker_ip, "to", a.server_ip)
    data, other, seen = [], [], set()
    deadline = time.monotonic() + a.timeout
    while len(data) < a.data or len(other) < a.other:
        if time.monotonic() > deadline:
            say(f"captured only {len(data)} gradient and {len(other)} other packets "
                f"in {a.timeout:.0f} s (wanted {a.data} and {a.other})")
            return 1
        _, raw, _ = listen.recv_raw(65535)
        f = mercury_frame(raw, src, dst) if raw else None
        # The listening socket also sees the replays going out.
        if f is None or raw in seen:
            continue
        seen.add(raw)
        if f.type == DATA and f.payload and len(data) < a.data:
            data.append(f)
        elif f.type != DATA and len(other) < a.other:
            other.append(f)
            if f.counter is not None and not a.no_key:
                send(f.raw)
    listen.close()
    captured = other + data
    if a.no_key:
        say(f"captured {len(captured)} packets ({len(data)} gradient, {len(other)} other)")
        return forge_next_epoch(a, out, send, data)
    say(f"captured {len(captured)} packets ({len(data)} gradient, {len(other)} other:"
        f" types {[f.type for f in other]}); replayed the {len(other)} other at once")
    unsigned = [f for f in captured if f.counter is None]
    if unsigned:
        say(f"{len(unsigned)} of the captured packets carry no AuthBlock"
            f" (flags {unsigned[0].flags:#06x}): the job does not sign")
        return 1
    base = data[-1]
    sender, epoch = base.sender, base.epoch
    say(f"the worker is node {sender}, epoch {epoch}, UDP port {base.sport}")

    # The construction, checked on what the worker really sent.
    if a.job_key:
        with open(a.job_key) as k:
            right = mac_key(bytes.fromhex(k.read().strip()))
        good = sum(gmac(right, f.sender, a.server_id, f.header, f.counter, f.payload) == f.tag
                   for f in captured)
        say(f"the job key's GMAC matches {good} of {len(captured)} captured tags")
        if good != len(captured):
            return 1

    # 2. The gradients replayed, byte for byte, in the order captured.
    for f in data:
        send(f.raw)

    # 3. Forgeries, under a key of the attacker's own.
    wrong = mac_key(os.urandom(32))
    # Fresh counters, above anything the worker has sent: its counter started
    # at its wall clock in nanoseconds and has grown by one a packet since
    # (transport::initial_auth_counter), so only the MAC can refuse these.
    fresh = time.time_ns()

    def forged(header, payload, counter):
        """A frame as from the worker: `header` with kAuth signed under the
        wrong key, or without it sent bare (counter None)."""
        if counter is None:
            mercury = header + payload
        else:
            tag = gmac(wrong, sender, a.server_id, header, counter, payload)
            mercury = header + struct.pack(">Q", counter) + tag + payload
        return (Ether(src=base.src_mac, dst=base.dst_mac) /
                IP(src=a.worker_ip, dst=a.server_ip, ttl=64, flags="DF") /
                UDP(sport=base.sport, dport=base.dport) / Raw(mercury))

    # A gradient: a captured header unchanged (its block, offset, round),
    # every float of its payload 1e30.
    sent_data = 0
    for i in range(a.forge):
        f = data[i % len(data)]
        floats = len(f.payload) // 4
        poison = struct.pack(f"<{floats}f", *([1e30] * floats))
        send(forged(f.header, poison, fresh + i))
        sent_data += 1

    ack = next_epoch_ack(base)
    struct.pack_into(">H", ack, OFF_FLAGS, ACK_VALID | AUTH_FLAG)
    sent_ack_mac = 0
    for i in range(a.forge):
        send(forged(bytes(ack), b"", fresh + a.forge + i))
        sent_ack_mac += 1
    struct.pack_into(">H", ack, OFF_FLAGS, ACK_VALID)
    sent_ack_bare = 0
    for _ in range(a.forge):
        send(forged(bytes(ack), b"", None))
        sent_ack_bare += 1
    out.close()
    say(f"sent replayed={len(captured)} forged_data={sent_data} forged_ack_mac={sent_ack_mac}"
        f" forged_ack_bare={sent_ack_bare}")
    return 0


def next_epoch_ack(base):
    """The header of a pure ACK of the worker's next incarnation, from one of
    its data packets: believed, it would make the server restart its stream to
    the worker (what it had in flight failed) and refuse the real worker's
    packets as of a stale epoch."""
    ack = bytearray(base.header)
    ack[OFF_TYPE] = ACK
    ack[OFF_DTYPE] = 0
    struct.pack_into(">IIIIII", ack, 12, 0, 0, 0, 0, 0, 0)  # block_key .. param_version
    struct.pack_into(">H", ack, OFF_PAYLOAD_LEN, 0)
    struct.pack_into(">I", ack, OFF_EPOCH, base.epoch % 0xFFFFFFFF + 1)  # never 0
    return ack


def forge_next_epoch(a, out, send, data):
    """Without a key: unsigned packets as from the worker, of its next epoch
    (pure ACKs, then gradients of 1e30s). Each must be dropped while the
    worker answers the server's challenge."""
    signed = [f for f in data if f.counter is not None]
    if signed:
        say(f"{len(signed)} of the captured packets carry an AuthBlock: the job signs")
        return 1
    base = data[-1]
    say(f"the worker is node {base.sender}, epoch {base.epoch}, UDP port {base.sport}")

    def frame(mercury):
        return (Ether(src=base.src_mac, dst=base.dst_mac) /
                IP(src=a.worker_ip, dst=a.server_ip, ttl=64, flags="DF") /
                UDP(sport=base.sport, dport=base.dport) / Raw(mercury))

    ack = next_epoch_ack(base)
    struct.pack_into(">H", ack, OFF_FLAGS, ACK_VALID)
    for _ in range(a.forge):
        send(frame(bytes(ack)))
    for i in range(a.forge):
        f = data[i % len(data)]
        header = bytearray(f.header)
        struct.pack_into(">I", header, OFF_EPOCH, f.epoch % 0xFFFFFFFF + 1)
        floats = len(f.payload) // 4
        send(frame(bytes(header) + struct.pack(f"<{floats}f", *([1e30] * floats))))
    out.close()
    say(f"sent forged_epoch_ack={a.forge} forged_epoch_data={a.forge}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
