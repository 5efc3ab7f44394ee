#!/usr/bin/python3
"""The trace-driven trainer end to end: ps-demo runs ps-server and four
`ps-worker --trace` processes over net_memif (config/memif.yaml with sockets
and the EAL file prefix made unique to this run, optimizer sum), on
MobileNet-v2's tensors and compute trace scaled down, 2 comm-only and 3 trace
rounds. Every worker must report every comm-only round's aggregates (their
digests) and its final parameters exact, and an iteration time no shorter than its compute
time (compute is part of every round after the first, which is its backward pass alone:
correctness bounds, not speed targets); ps-demo must print the job's line. The same job with no comm-only
rounds (--comm-rounds 0): none run, the final parameters are still exact, and
every worker and ps-demo say the communication was not measured. Then the same
job under psplus with rank 3 a 4x straggler (--verify none, the only choice
there; no comm-only rounds): every rank runs its trace rounds, round 1 with its
forward pass (a straggler's lag starts there), the straggler's
iteration is at least 4x its compute and rank 0 is not held to the straggler's
pace. Then the refusals that need
no EAL: a trace that does not match the model (file and line named),
--compute-scale and --verify none without --trace, and --trace under an
asynchronous mode with checks.

  trace_job_test.py PS_DEMO PS_WORKER CONFIG_DIR
"""
import os
import re
import subprocess
import sys
import tempfile

COMM_ROUNDS = 2
ROUNDS = 3
SCALE = "0.05"
NUM = r"([0-9.]+)"


def check(cond, what, failures):
    if not cond:
        print("FAILED: " + what)
        failures.append(what)


def run_demo(cmd):
    print(" ".join(cmd))
    try:
        run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=240)
        out, code = run.stdout, run.returncode
    except subprocess.TimeoutExpired as e:
        # (bytes even with text=True)
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        code = -1
        print("ps-demo timed out")
    print(out, end="")
    return out, code


def iteration_line(w, out, measured=True):
    """Worker w's summary: iteration and compute (groups 1 and 2), with the bound when the
    communication was measured, or saying it was not (--comm-rounds 0)."""
    if not measured:
        return re.search(r"\[%s\] %s: iteration %s s, compute %s s, communication not measured "
                         r"\(--comm-rounds 0\)" % (w, w, NUM, NUM), out)
    return re.search(r"\[%s\] %s: iteration %s s, compute %s s, communication %s s, lower "
                     r"bound %s s, ratio %s" % (w, w, NUM, NUM, NUM, NUM, NUM), out)


def forward_backward(trace):
    """The trace's forward and backward compute in seconds at SCALE."""
    fwd = bwd = 0.0
    with open(trace) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                fields = line.split()
                fwd += float(fields[1]) * 1e-6 * float(SCALE)
                bwd += float(fields[2]) * 1e-6 * float(SCALE)
    return fwd, bwd


def main():
    ps_demo, ps_worker, config_dir = sys.argv[1:4]
    model = os.path.join(config_dir, "models", "mobilenet_v2.txt")
    trace = os.path.join(config_dir, "traces", "mobilenet_v2.txt")
    failures = []
    with tempfile.TemporaryDirectory(prefix="trace-memif-") as tmp:
        text = open(os.path.join(config_dir, "memif.yaml")).read()
        text = text.replace("/tmp/mercury/", tmp + "/")
        text = re.sub(r"(\n  name:) memif", r"\1 trmemif%d" % os.getpid(), text)
        text = re.sub(r"(\n  optimizer:) sgd", r"\1 sum", text)
        text = re.sub(r"\n  learning_rate: [^\n]*", "", text)  # sum has none
        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as f:
            f.write(text)
        cmd = [ps_demo, "--config", job, "--model", model, "--trace", trace, "--compute-scale",
               SCALE, "--comm-rounds", str(COMM_ROUNDS), "--rounds", str(ROUNDS)]
        out, code = run_demo(cmd)
        check(code == 0, "ps-demo exit %d" % code, failures)
        fwd, bwd = forward_backward(trace)
        for r in range(4):
            w = "w%d" % r
            comm = re.findall(r"\[%s\] %s comm round +\d+: +%s s" % (w, w, NUM), out)
            check(len(comm) == COMM_ROUNDS,
                  "%s: %d of %d comm-only rounds" % (w, len(comm), COMM_ROUNDS), failures)
            streamed = re.findall(r"\[%s\] %s streamed comm round +\d+: +%s s" % (w, w, NUM), out)
            check(len(streamed) == COMM_ROUNDS,
                  "%s: %d of %d streamed comm-only rounds" % (w, len(streamed), COMM_ROUNDS),
                  failures)
            check("[%s] %s: comm-only rounds 1-%d and the last streamed round: every aggregate "
                  "exact" % (w, w, COMM_ROUNDS) in out, "%s: the comm-only rounds exact" % w,
                  failures)
            rounds = re.findall(r"\[%s\] %s trace round +\d+: +%s s" % (w, w, NUM), out)
            check(len(rounds) == ROUNDS, "%s: %d of %d trace rounds" % (w, len(rounds), ROUNDS),
                  failures)
            check("[%s] %s: final parameters exact" % (w, w) in out,
                  "%s: final parameters exact" % w, failures)
            m = iteration_line(w, out)
            check(m is not None, "%s: the iteration line" % w, failures)
            if m:
                iteration, compute = float(m.group(1)), float(m.group(2))
                check(compute > 0, "%s: compute %s > 0" % (w, compute), failures)
                # Printed to the millisecond: allow the rounding.
                check(iteration >= compute - 0.0015,
                      "%s: iteration %.3f s >= compute %.3f s" % (w, iteration, compute), failures)
                for t in rounds[1:]:
                    check(float(t) >= compute - 0.0015,
                          "%s: a trace round of %s s >= compute %.3f s" % (w, t, compute), failures)
                # Round 1 is its backward pass alone (its forward would overlap nothing).
                if rounds:
                    check(bwd - 0.0015 <= float(rounds[0]) < bwd + fwd / 2,
                          "%s: round 1 %s s is the backward pass alone (%.3f s, forward %.3f s)"
                          % (w, rounds[0], bwd, fwd), failures)
        check(re.search(r"ps-demo: job: iteration %s s, compute %s s, communication %s s, lower "
                        r"bound %s s, ratio %s" % (NUM, NUM, NUM, NUM, NUM), out) is not None,
              "ps-demo's job line", failures)

        # No comm-only rounds: the trace rounds alone, still exact; no bound.
        out, code = run_demo([ps_demo, "--config", job, "--model", model, "--trace", trace,
                              "--compute-scale", SCALE, "--comm-rounds", "0", "--rounds", "2"])
        check(code == 0, "--comm-rounds 0: ps-demo exit %d" % code, failures)
        check(re.search(r"comm round +\d+:", out) is None,
              "--comm-rounds 0: no comm-only round ran", failures)
        for r in range(4):
            w = "w%d" % r
            rounds = re.findall(r"\[%s\] %s trace round +\d+: +%s s" % (w, w, NUM), out)
            check(len(rounds) == 2, "--comm-rounds 0: %s: %d of 2 trace rounds" % (w, len(rounds)),
                  failures)
            check("[%s] %s: final parameters exact" % (w, w) in out,
                  "--comm-rounds 0: %s: final parameters exact" % w, failures)
            check(iteration_line(w, out, measured=False) is not None,
                  "--comm-rounds 0: %s's iteration line says the communication was not measured"
                  % w, failures)
            check("[%s] %s: done, 0 comm-only and 2 trace rounds, every aggregate exact" % (w, w)
                  in out, "--comm-rounds 0: %s's closing line" % w, failures)
        check(re.search(r"ps-demo: job: iteration %s s, compute %s s, communication not measured "
                        r"\(--comm-rounds 0\)" % (NUM, NUM), out) is not None,
              "--comm-rounds 0: ps-demo's job line", failures)

        # PS+ with a 4x straggler: the trace trainer under an asynchronous mode.
        ps_text = re.sub(r"\n  sync: bsp", "\n  sync: psplus", open(job).read())
        ps_text = re.sub(r"(\n  optimizer:) sum", r"\1 sgd\n  learning_rate: 0.0625", ps_text)
        ps_job = os.path.join(tmp, "psplus.yaml")
        with open(ps_job, "w") as f:
            f.write(ps_text)
        ps_rounds = 4
        out, code = run_demo([ps_demo, "--config", ps_job, "--model", model, "--trace", trace,
                              "--compute-scale", SCALE, "--comm-rounds", "0", "--rounds",
                              str(ps_rounds), "--straggler", "3,4", "--verify", "none"])
        check(code == 0, "psplus: ps-demo exit %d" % code, failures)
        check("nothing checked (--verify none)" in out, "psplus: ps-demo says nothing was checked",
              failures)
        its = {}
        for r in range(4):
            w = "w%d" % r
            rounds = re.findall(r"\[%s\] %s trace round +\d+: +%s s" % (w, w, NUM), out)
            check(len(rounds) == ps_rounds,
                  "psplus: %s: %d of %d trace rounds" % (w, len(rounds), ps_rounds), failures)
            m = iteration_line(w, out, measured=False)
            check(m is not None, "psplus: %s: the iteration line" % w, failures)
            if m:
                its[w] = (float(m.group(1)), float(m.group(2)))
                # With a straggler round 1 computes its forward pass too (it sets the lag).
                if rounds:
                    check(float(rounds[0]) >= its[w][1] - 0.0015,
                          "psplus: %s: round 1 %s s >= its compute %.3f s (forward not skipped)"
                          % (w, rounds[0], its[w][1]), failures)
        if len(its) == 4:
            check(abs(its["w3"][1] - 4 * its["w0"][1]) <= 0.002,
                  "psplus: the straggler's compute %.3f s is 4x rank 0's %.3f s" % (
                      its["w3"][1], its["w0"][1]), failures)
            check(its["w3"][0] >= its["w3"][1] - 0.0015,
                  "psplus: the straggler's iteration %.3f s >= its compute %.3f s" % its["w3"],
                  failures)
            # Under BSP rank 0 would wait for the straggler's gradients every round.
            check(its["w0"][0] < 0.75 * its["w3"][0],
                  "psplus: rank 0's iteration %.3f s is not held to the straggler's %.3f s" % (
                      its["w0"][0], its["w3"][0]), failures)
        asp_job = os.path.join(tmp, "asp.yaml")
        with open(asp_job, "w") as f:
            f.write(ps_text.replace("sync: psplus", "sync: asp"))
        bad = subprocess.run([ps_worker, "--check", "--config", asp_job, "--node", "w0", "--model",
                              model, "--trace", trace], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        print(bad.stdout, end="")
        check(bad.returncode == 1 and "--trace checks the aggregates of bsp jobs only; training.sync "
              "is asp: time it with --verify none" in bad.stdout,
              "--trace under asp with checks refused", failures)

    # Refusals, before anything starts.
    def check_only(*args):
        run = subprocess.run([ps_worker, "--check", "--config",
                              os.path.join(config_dir, "memif.yaml"), "--node", "w0", *args],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print(run.stdout, end="")
        return run

    resnet_trace = os.path.join(config_dir, "traces", "resnet50.txt")
    bad = check_only("--model", model, "--trace", resnet_trace)
    check(bad.returncode == 1 and re.search(
        r"resnet50\.txt:\d+: tensor 'conv1\.weight' is not the model's next, "
        r"'features\.0\.0\.weight' at .*mobilenet_v2\.txt:2", bad.stdout) is not None,
          "a mismatched trace refused naming file and line", failures)
    bad = check_only("--compute-scale", "2")
    check(bad.returncode == 1 and "--compute-scale needs --trace" in bad.stdout,
          "--compute-scale without --trace refused", failures)
    bad = check_only("--verify", "none")
    check(bad.returncode == 1 and "--verify none goes with --trace" in bad.stdout,
          "--verify none without --trace refused", failures)
    good = check_only("--model", model, "--trace", trace)
    check(good.returncode == 0 and re.search(r"mobilenet_v2\.txt: ok \(\d+ layers", good.stdout),
          "--check accepts the matching trace", failures)
    print("%d failures" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
