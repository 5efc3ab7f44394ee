#!/usr/bin/python3
"""The mercury Python package against a real job: ps-server and two Python
worker processes over net_memif, optimizer sum.

Each worker declares numpy arrays and torch tensors, checks that the package
refuses what it must (wrong dtype, strided views, duplicates, unknown keys,
wrong sizes, calls after shutdown), that version 0 is rank 0's buffers bit for
bit (half-precision tensors too: a torch bfloat16 tensor, a numpy float16 array, a
uint16 array of bfloat16 bits; each one's push_pull the float32 rank-order average of the
widened inputs rounded once into its dtype, a buffer of another dtype refused), that every push_pull, push + pull and pull into another buffer delivers
the rank-order average bit for bit, that completion callbacks run once each on
the dispatcher thread even when one raises, that a transfer failed by
shutdown raises TransferError with the library's text, and that each worker's
timeline holds every iteration's phases of every tensor, in order, with the
trainer's spans. The same job runs with the workers as processes of their own
and as forks of the test (mercury.launch's worker_main), whose exit statuses
(a return, an exception, sys.exit) and refusals (another thread running, both
or neither of worker_argv and worker_main) are checked too, and a server that
cannot start ends the launch with its last line.

Usage: worker_api_test.py BUILD_DIR
(in worker mode: worker_api_test.py BUILD_DIR --worker JOB NODE)
"""
import os
import sys
import tempfile
import threading
import time
import unittest

BUILD = None

JOB = """
job: {{id: 7, name: {name}}}
network: {{mtu: 9000, peer_timeout_ms: 5000}}
mempool: {{mbufs: 4095, cache: 128}}
eal: {{memory_mb: 512, hugepages: "off"}}
training: {{sync: bsp, optimizer: sum}}
nodes:
  - name: server0
    role: server
    ipv4: 10.0.0.1
    mac: 02:00:00:00:00:01
    ports:
      - net_memif0,role=server,id=0,socket={tmp}/w0.sock,bsize=9216
      - net_memif1,role=server,id=0,socket={tmp}/w1.sock,bsize=9216
    lcores: [0, 1]
    shards: 1
  - name: w0
    role: worker
    ipv4: 10.0.0.11
    mac: 02:00:00:00:00:11
    ports: [ "net_memif10,role=client,id=0,socket={tmp}/w0.sock,bsize=9216" ]
    lcores: [2]
  - name: w1
    role: worker
    ipv4: 10.0.0.12
    mac: 02:00:00:00:00:12
    ports: [ "net_memif11,role=client,id=0,socket={tmp}/w1.sock,bsize=9216" ]
    lcores: [3]
"""

ROUNDS = 3


def gradient(np, rank, rnd, tensor, n):
    rng = np.random.default_rng(1_000_003 * rnd + 1009 * tensor + rank)
    return rng.standard_normal(n).astype(np.float32)


def average(np, rnd, tensor, n):
    """What the server returns with optimizer sum and 2 workers: (g0 + g1) * (1/2)."""
    return (gradient(np, 0, rnd, tensor, n) + gradient(np, 1, rnd, tensor, n)) * np.float32(0.5)


def worker_main(job, node):
    """One worker: raises AssertionError on the first wrong thing."""
    import numpy as np
    import torch

    import mercury

    w = mercury.Worker(job, node, timeline=os.path.join(os.path.dirname(job), "timeline"))
    assert w.timeline_enabled
    rank = w.rank
    assert w.workers == 2 and rank == int(node[1:]), (w.workers, rank)
    assert w.optimizer == "sum", w.optimizer
    assert w.sync == "bsp", w.sync

    a = np.arange(1000, dtype=np.float32) if rank == 0 else np.full(1000, -1, np.float32)
    b = torch.arange(3 * 50 * 7, dtype=torch.float32).reshape(3, 50, 7) * 0.5
    if rank != 0:
        b.fill_(-1)
    c = np.linspace(0, 1, 20_000, dtype=np.float32) if rank == 0 else np.zeros(20_000, np.float32)
    expect0 = [np.arange(1000, dtype=np.float32),
               (torch.arange(3 * 50 * 7, dtype=torch.float32) * 0.5).numpy(),
               np.linspace(0, 1, 20_000, dtype=np.float32)]

    def refused(exc, fn, text):
        try:
            fn()
        except exc as e:
            assert text in str(e), f"{exc.__name__} without {text!r}: {e}"
            return
        raise AssertionError(f"not refused ({exc.__name__}, {text!r})")

    refused(TypeError, lambda: w.declare("f64", np.zeros(4)), "float32")
    refused(ValueError, lambda: w.declare("strided", np.zeros(8, np.float32)[::2]), "contiguous")
    refused(mercury.UsageError, lambda: w.declare("i32", torch.zeros(4, dtype=torch.int32)),
            "float32")
    refused(TypeError, lambda: w.declare("list", [1.0, 2.0]), "float32 array")

    ka = w.declare("a", a, priority=0)
    kb = w.declare("b", b, priority=1)
    kc = w.declare("c", c)
    assert (ka, kb, kc) == (0, 1, 2) and w.tensors == 3
    # Half precision, declared from the array's or tensor's dtype (numpy has no
    # bfloat16: a uint16 array of its bits names it).
    half0 = [torch.linspace(-2, 2, 3001).to(torch.bfloat16),
             np.linspace(-3, 3, 777).astype(np.float16),
             torch.linspace(0, 1, 64).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)]
    halves = [t.clone() if hasattr(t, "clone") else t.copy() for t in half0]
    if rank != 0:
        halves[0].fill_(float("nan"))
        halves[1].fill(np.nan)
        halves[2].fill(0xffff)
    refused(mercury.UsageError, lambda: w.declare("u16", np.zeros(4, np.uint16)),
            "needs dtype='bfloat16' or 'float16'")
    refused(mercury.UsageError, lambda: w.declare("x", half0[1].copy(), dtype="bfloat16"),
            "float16 but bfloat16 is expected")
    kd = w.declare("d", halves[0])
    ke = w.declare("e", halves[1])
    kf = w.declare("f", halves[2], dtype="bfloat16")
    assert [w.dtype(k) for k in (ka, kd, ke, kf)] == ["float32", "bfloat16", "float16",
                                                      "bfloat16"]
    refused(mercury.UsageError, lambda: w.declare("a", np.zeros(4, np.float32)), "a")
    refused(mercury.UsageError, lambda: w.push("nope", a), "nope")

    w.start()
    assert w.started
    refused(mercury.UsageError, lambda: w.declare("late", np.zeros(4, np.float32)), "start")
    bufs = [a, b.numpy().reshape(-1), c]
    for k, (got, want) in enumerate(zip(bufs, expect0)):
        assert np.array_equal(got, want), f"version 0 of tensor {k} is not rank 0's buffer"
    assert torch.equal(halves[0], half0[0]) and np.array_equal(halves[1], half0[1]) and \
        np.array_equal(halves[2], half0[2]), "version 0 of a half tensor is not rank 0's"

    t0 = time.monotonic_ns()
    w.timeline_span("setup", "trainer", t0 - 1000, t0)
    sizes = [1000, 1050, 20_000]
    refused(mercury.UsageError, lambda: w.push_pull(ka, np.zeros(999, np.float32)), "")
    other = np.zeros(20_000, np.float32)
    for rnd in range(ROUNDS):
        grads = [gradient(np, rank, rnd, k, n) for k, n in enumerate(sizes)]
        if rnd == 0:    # push_pull into the declared buffers, by key and by name
            hs = [w.push_pull(ka, grads[0]), w.push_pull("b", torch.from_numpy(grads[1])),
                  w.push_pull(kc, grads[2])]
        elif rnd == 1:  # push, then pull
            pushes = [w.push(k, g) for k, g in enumerate(grads)]
            hs = [w.pull(k) for k in range(3)] + pushes
        else:           # c pulled into another buffer (a copy of the version)
            hs = [w.push_pull(ka, grads[0]), w.push_pull(kb, grads[1]),
                  w.push_pull(kc, grads[2], out=other)]
        for h in hs:
            h.wait()
            assert h.ready() and h.ok and h.error == ""
        for k, n in enumerate(sizes):
            got = other if (rnd == 2 and k == 2) else bufs[k]
            assert np.array_equal(got, average(np, rnd, k, n)), \
                f"round {rnd}: tensor {k} is not the rank-order average"
            assert w.version(k) == rnd + 1, (k, w.version(k), rnd)
    # A pull of a version already in completes at once, with that version.
    h = w.pull(kb, min_version=ROUNDS)
    h.wait()
    assert h.ok and w.version(kb) == ROUNDS, w.version(kb)
    assert w.mark_read(kb) == ROUNDS  # bsp: the version, nothing marked

    # Callbacks: once each, on the dispatcher thread, in spite of one raising.
    ran = []
    done = threading.Event()

    def record(tag):
        def fn(h):
            ran.append((tag, threading.current_thread().name, h.ok))
            if tag == "raises":
                raise RuntimeError("a callback that raises")
            if len(ran) == 3:
                done.set()
        return fn

    g = gradient(np, rank, ROUNDS, 0, 1000)
    h = w.push_pull(ka, g)
    h.add_done_callback(record("raises"))
    h.add_done_callback(record("pending"))
    h.wait()
    h.add_done_callback(record("complete"))
    assert done.wait(10), f"callbacks did not run: {ran}"
    assert sorted(t for t, _, _ in ran) == ["complete", "pending", "raises"], ran
    assert all(name == "mercury-callbacks" and ok for _, name, ok in ran), ran

    # The counters are published every few milliseconds.
    for _ in range(200):
        s = w.stats()
        if s["pushes"] == 3 * ROUNDS + 1:
            break
        time.sleep(0.01)
    # Pulls: one per push, and the min_version pull.
    assert s["pushes"] == 3 * ROUNDS + 1 and s["pulls"] == 3 * ROUNDS + 2, s
    assert s["versions_completed"] >= 3 * ROUNDS + 1, s
    # Drops by reason: a dict of names to positive counts (none expected over memif).
    assert isinstance(s["drops"], dict), s
    assert all(isinstance(k, str) and isinstance(v, int) and v > 0
               for k, v in s["drops"].items()), s
    check_halves(w, np, torch, rank, halves, (kd, ke, kf), refused)
    w.barrier()
    if rank == 1:
        # A version no push will make: this pull can never complete, and shutdown
        # fails it. (A push here would reach a server whose rank 0 has left: a
        # BSP job refuses it, rightly.)
        h = w.pull(ka, min_version=ROUNDS + 2)
        w.shutdown()
        try:
            h.wait()
            raise AssertionError("a transfer failed by shutdown did not raise")
        except mercury.TransferError as e:
            assert "shut down" in str(e), str(e)
    w.shutdown()
    refused(mercury.UsageError, lambda: w.push(ka, g), "shut down")
    print(f"{node}: every check passed", flush=True)


def half_gradients(np, torch, rank, rnd):
    """Rank `rank`'s gradients of the half tensors d (bfloat16), e (float16), f (bfloat16)."""
    g = [gradient(np, rank, rnd, 10 + k, n) for k, n in enumerate((3001, 777, 64))]
    return [torch.from_numpy(g[0]).to(torch.bfloat16), g[1].astype(np.float16),
            torch.from_numpy(g[2]).to(torch.bfloat16)]


def check_halves(w, np, torch, rank, halves, keys, refused):
    """Two rounds of the half tensors: each aggregate the rank-order float32 average of
    the widened gradients, rounded once to nearest even into the tensor's dtype."""
    kd, ke, kf = keys
    for rnd in range(2):
        mine = half_gradients(np, torch, rank, rnd)
        g0, g1 = half_gradients(np, torch, 0, rnd), half_gradients(np, torch, 1, rnd)
        want = [((g0[0].float() + g1[0].float()) * 0.5).to(torch.bfloat16),
                ((g0[1].astype(np.float32) + g1[1].astype(np.float32)) * np.float32(0.5)
                 ).astype(np.float16),
                ((g0[2].float() + g1[2].float()) * 0.5).to(torch.bfloat16)]
        bits = mine[2].view(torch.int16).numpy().view(np.uint16)
        hs = [w.push_pull(kd, mine[0]), w.push_pull(ke, mine[1]), w.push_pull(kf, bits)]
        for h in hs:
            h.wait()
        assert torch.equal(halves[0].view(torch.int16), want[0].view(torch.int16)), \
            f"round {rnd}: the bfloat16 tensor is not the rounded float32 average"
        assert np.array_equal(halves[1].view(np.uint16), want[1].view(np.uint16)), \
            f"round {rnd}: the float16 array is not the rounded float32 average"
        assert np.array_equal(halves[2], want[2].view(torch.int16).numpy().view(np.uint16)), \
            f"round {rnd}: the uint16 bfloat16 bits are not the rounded float32 average"
    # Nothing converts: a buffer of another dtype than the tensor's is refused.
    refused(mercury_usage(), lambda: w.push(kd, np.zeros(3001, np.float16)),
            "float16 but bfloat16 is expected")
    refused(mercury_usage(), lambda: w.push(ke, torch.zeros(777, dtype=torch.bfloat16)),
            "bfloat16 but float16 is expected")
    refused(mercury_usage(), lambda: w.push(kd, np.zeros(3001, np.float32)),
            "float32 but bfloat16 is expected")


def mercury_usage():
    import mercury
    return mercury.UsageError


class PythonWorker(unittest.TestCase):
    def test_errors_before_eal(self):
        import mercury

        with self.assertRaises(mercury.WorkerError) as e:
            mercury.Worker("/nonexistent/job.yaml", "w0")
        self.assertIn("/nonexistent/job.yaml", str(e.exception))
        with tempfile.TemporaryDirectory() as tmp:
            job = os.path.join(tmp, "job.yaml")
            with open(job, "w") as f:
                f.write(JOB.format(name="pyapi-bad", tmp=tmp))
            with self.assertRaises(mercury.WorkerError) as e:
                mercury.Worker(job, "server0")
            self.assertIn("server", str(e.exception))
            with self.assertRaises(mercury.WorkerError) as e:
                mercury.Worker(job, "w9")
            self.assertIn("w9", str(e.exception))

    def run_two_workers(self, name, forked):
        """The job with each worker its own process (this file in worker mode) or, with
        run_job's worker_main, a fork of this process (as train-digits runs them)."""
        from mercury.launch import run_job

        with tempfile.TemporaryDirectory() as tmp:
            job = os.path.join(tmp, "job.yaml")
            with open(job, "w") as f:
                f.write(JOB.format(name=name, tmp=tmp))
            how = ({"worker_main": lambda node, rank: worker_main(job, node)} if forked else
                   {"worker_argv": lambda node, rank: [sys.executable, __file__, BUILD,
                                                       "--worker", job, node]})
            lines = []
            status = run_job(
                job, server_bin=os.path.join(BUILD, "apps", "ps-server"),
                echo=lambda node, line: lines.append(f"{node}: {line}"), timeout_s=120, **how)
            out = "\n".join(lines)
            self.assertEqual(status, {"w0": 0, "w1": 0, "server0": 0}, out)
            self.assertIn("w0: w0: every check passed", out)
            self.assertIn("w1: w1: every check passed", out)
            self.check_timelines(os.path.join(tmp, "timeline"))

    def test_two_workers_over_memif(self):
        self.run_two_workers("pyapi", forked=False)

    def test_two_workers_forked_over_memif(self):
        self.run_two_workers("pyfork", forked=True)

    def test_forked_workers_exit_status_and_refusals(self):
        from mercury.launch import run_job

        def fails(node, rank):
            if rank == 0:
                raise ValueError("rank 0 gives up")
            sys.exit(3)

        with tempfile.TemporaryDirectory() as tmp:
            job = os.path.join(tmp, "job.yaml")
            with open(job, "w") as f:
                f.write(JOB.format(name="pyforkfail", tmp=tmp))
            server = os.path.join(BUILD, "apps", "ps-server")
            lines = []
            status = run_job(job, worker_main=fails, server_bin=server,
                             echo=lambda node, line: lines.append(f"{node}: {line}"),
                             timeout_s=60)
            out = "\n".join(lines)
            self.assertEqual((status["w0"], status["w1"]), (1, 3), out)
            self.assertIn("w0: ValueError: rank 0 gives up", out)  # its traceback's last line
            self.assertIn("w0: Traceback (most recent call last):", out)

            # A server that cannot start ends the launch, naming it (the forks
            # waiting for it are killed).
            with self.assertRaises(RuntimeError) as e:
                run_job(job, worker_main=lambda node, rank: time.sleep(60), server_bin=server,
                        server_args=["--no-such-option"], echo=lambda node, line: None,
                        timeout_s=60)
            self.assertEqual(str(e.exception),
                             "ps-server server0 failed (exit 1): ps-server: "
                             "unknown argument --no-such-option (see --help)")

            with self.assertRaises(ValueError):
                run_job(job, server_bin=server)  # neither worker_argv nor worker_main
            with self.assertRaises(ValueError):
                run_job(job, lambda node, rank: ["true"], worker_main=fails, server_bin=server)
            # A fork copies no thread: refused while another one runs, naming it.
            stop = threading.Event()
            other = threading.Thread(target=stop.wait, name="someone-else")
            other.start()
            try:
                with self.assertRaises(RuntimeError) as e:
                    run_job(job, worker_main=fails, server_bin=server)
                self.assertIn("someone-else", str(e.exception))
            finally:
                stop.set()
                other.join()

    def check_timelines(self, directory):
        import json

        from mercury.timeline import merge

        files = [os.path.join(directory, f"w{r}.json") for r in range(2)]
        merged = merge(files, os.path.join(directory, "timeline.json"))
        names = {(e["pid"], e["args"]["name"]) for e in merged["traceEvents"]
                 if e["name"] == "process_name"}
        self.assertEqual(names, {(0, "w0"), (1, "w1")})
        for rank, f in enumerate(files):
            with open(f) as fh:
                events = json.load(fh)["traceEvents"]
            rows = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
            self.assertEqual(sorted(rows.values()), ["a", "b", "c", "d", "e", "f", "trainer"])
            self.assertIn("setup", [e["name"] for e in events
                                    if e["ph"] == "X" and rows[e["tid"]] == "trainer"])
            phases = {}
            for e in events:
                if e["ph"] == "X" and rows[e["tid"]] != "trainer":
                    key = (rows[e["tid"]], e["args"]["iteration"])
                    phases.setdefault(key, {})[e["name"]] = (e["ts"], e["ts"] + e["dur"])
            # a: ROUNDS + 1 iterations (the callbacks' push_pull), b and c: ROUNDS; each
            # complete one has its push and pull, queued -> push -> ... in time order.
            self.assertEqual(sorted(i for t, i in phases if t == "a")[:ROUNDS + 1],
                             list(range(ROUNDS + 1)))
            self.assertEqual(sorted(i for t, i in phases if t == "b"), list(range(ROUNDS)))
            self.assertEqual(sorted(i for t, i in phases if t == "c"), list(range(ROUNDS)))
            for t in "def":  # the half-precision tensors: two rounds
                self.assertEqual(sorted(i for u, i in phases if u == t), [0, 1])
            for (tensor, it), p in phases.items():
                if rank == 1 and tensor == "a" and it == ROUNDS + 1:
                    continue  # the pull that shutdown failed
                # Every phase but `aggregate` (left out when a chunk overtakes the
                # last acknowledgement) must be there.
                self.assertIn("queued", p, (tensor, it, p))
                self.assertIn("push", p, (tensor, it, p))
                self.assertIn("pull", p, (tensor, it, p))
                # The version needs this worker's gradient: sending began before it arrived.
                self.assertLessEqual(p["push"][0], p["pull"][0], (tensor, it, p))
                self.assertAlmostEqual(p["queued"][1], p["push"][0], places=3)
                if "aggregate" in p:
                    self.assertAlmostEqual(p["aggregate"][0], p["push"][1], places=3)
                    self.assertAlmostEqual(p["aggregate"][1], p["pull"][0], places=3)


def test_main(module, worker_main):
    """The command line of this directory's tests: BUILD_DIR, then either the
    tests of `module` or, after --worker, one worker process (worker_main's
    arguments)."""
    module.BUILD = os.path.abspath(sys.argv[1])
    sys.path.insert(0, os.path.join(module.BUILD, "lib", "python"))
    if len(sys.argv) > 2 and sys.argv[2] == "--worker":
        worker_main(*sys.argv[3:])
        sys.exit(0)
    unittest.main(module=module, argv=[sys.argv[0]], verbosity=2)


if __name__ == "__main__":
    test_main(sys.modules[__name__], worker_main)
