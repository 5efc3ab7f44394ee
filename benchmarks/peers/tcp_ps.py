#!/usr/bin/python3
"""A classical parameter server over TCP, for benchmarks/peers/peers_bench.py: the
baseline a kernel-bypass PS has to beat (ps-lite's synchronous push and pull, as
MXNet's dist_sync kvstore uses it, over the kernel's loopback).

  tcp_ps.py server --world N --port P --model FILE [--iters 10] [--warmup 3]
  tcp_ps.py worker --rank R --world N --port P --model FILE [--iters 10] [--warmup 3]

Every iteration: a barrier held by the server, then each worker pushes every tensor,
last layer first as a backward pass emits them, and pulls each tensor's sum as soon
as the server has it (push and pull overlap, as with ps-lite's ZPush and ZPull). The
server keeps one buffer per worker and tensor, sums a tensor in rank order once every
worker's push of it has arrived (numpy, in place: one pass over each contribution),
and sends the sum to every worker. Each worker connection has a receiving and a sending
thread on both sides, so pushes and pulls never wait for each other; numpy and the
socket calls release the GIL. A worker fills its tensors with rank + 1 before each
iteration, so the sum is N (N + 1) / 2 in every element, exactly; each worker checks
every element of every tensor it pulled.

A worker prints one JSON line: {"rank", "times": [seconds per timed iteration, from the
end of the barrier to its last pulled tensor], "exact": bool}. Needs python3-numpy; run
with /usr/bin/python3.
"""
import argparse
import json
import socket
import struct
import threading
import time

import numpy as np

from model_file import read_model

HEADER = struct.Struct("<II")  # tensor index, iteration
BARRIER = 0xFFFFFFFF


def recv_exact(sock, view):
    while len(view):
        n = sock.recv_into(view)
        if n == 0:
            raise ConnectionError("tcp_ps: peer closed the connection")
        view = view[n:]


def recv_header(sock):
    buf = bytearray(HEADER.size)
    recv_exact(sock, memoryview(buf))
    return HEADER.unpack(buf)


def tune(sock):
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)


def serve(a):
    sizes = read_model(a.model, "tcp_ps")
    rounds = a.warmup + a.iters
    listener = socket.create_server(("127.0.0.1", a.port), backlog=a.world)
    conns = [None] * a.world
    for _ in range(a.world):
        c, _ = listener.accept()
        tune(c)
        rank = recv_header(c)[0]
        conns[rank] = c
    listener.close()
    pushed = [[np.empty(n, dtype=np.float32) for n in sizes] for _ in range(a.world)]
    total = [np.empty(n, dtype=np.float32) for n in sizes]
    lock = threading.Lock()
    arrived = [0] * len(sizes)
    barrier = threading.Barrier(a.world)
    # Per worker, the tensors whose sums are ready to send, in the order they completed.
    ready = [[] for _ in range(a.world)]
    ready_cv = [threading.Condition() for _ in range(a.world)]

    def receiver(rank):
        c = conns[rank]
        for it in range(rounds):
            assert recv_header(c)[0] == BARRIER
            barrier.wait()
            c.sendall(HEADER.pack(BARRIER, it))
            for _ in range(len(sizes)):
                t, _ = recv_header(c)
                recv_exact(c, memoryview(pushed[rank][t]).cast("B"))
                with lock:
                    arrived[t] += 1
                    last = arrived[t] == a.world
                    if last:
                        arrived[t] = 0
                if last:
                    np.add(pushed[0][t], pushed[1][t], out=total[t])
                    for r in range(2, a.world):
                        np.add(total[t], pushed[r][t], out=total[t])
                    for r in range(a.world):
                        with ready_cv[r]:
                            ready[r].append((t, it))
                            ready_cv[r].notify()

    def sender(rank):
        c = conns[rank]
        for _ in range(rounds * len(sizes)):
            with ready_cv[rank]:
                while not ready[rank]:
                    ready_cv[rank].wait()
                t, it = ready[rank].pop(0)
            c.sendall(HEADER.pack(t, it))
            c.sendall(memoryview(total[t]).cast("B"))

    threads = [threading.Thread(target=f, args=(r,)) for r in range(a.world)
               for f in (receiver, sender)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for c in conns:
        c.close()


def work(a):
    sizes = read_model(a.model, "tcp_ps")
    tensors = [np.empty(n, dtype=np.float32) for n in sizes]
    pulled = [np.empty(n, dtype=np.float32) for n in sizes]
    want = np.float32(a.world * (a.world + 1) // 2)
    for attempt in range(200):
        try:
            c = socket.create_connection(("127.0.0.1", a.port))
            break
        except ConnectionRefusedError:
            time.sleep(0.05)
    else:
        raise SystemExit("tcp_ps: no server on port %d" % a.port)
    tune(c)
    c.sendall(HEADER.pack(a.rank, 0))
    times, exact = [], True
    for it in range(a.warmup + a.iters):
        for t in tensors:
            t.fill(a.rank + 1)
        c.sendall(HEADER.pack(BARRIER, it))
        assert recv_header(c) == (BARRIER, it)
        start = time.perf_counter()

        def push():
            for i in reversed(range(len(sizes))):
                c.sendall(HEADER.pack(i, it))
                c.sendall(memoryview(tensors[i]).cast("B"))

        pusher = threading.Thread(target=push)
        pusher.start()
        for _ in range(len(sizes)):
            t, got_it = recv_header(c)
            assert got_it == it
            recv_exact(c, memoryview(pulled[t]).cast("B"))
        elapsed = time.perf_counter() - start
        pusher.join()
        exact = exact and all(bool(np.all(p == want)) for p in pulled)
        if it >= a.warmup:
            times.append(elapsed)
    c.close()
    print(json.dumps({"rank": a.rank, "times": times, "exact": exact}), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["server", "worker"])
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args()
    if a.world < 2:
        raise SystemExit("tcp_ps: --world must be at least 2")
    serve(a) if a.role == "server" else work(a)


if __name__ == "__main__":
    main()
