#!/usr/bin/python3
"""ResNet-18 training through Mercury beside DistributedDataParallel over gloo, on the same
machine, interleaved (benchmarks/peers/README.md, "peers: ResNet-18 training").

  benchmarks/peers/resnet18_bench.py [--build build] [--trials 5] [--steps 12] [--warmup 2]
                                     [--comm-rounds 3] [--workers 4] [--variants LIST]
                                     [--csv FILE]

torchvision's ResNet-18 (random init) on the digits set upscaled to 32x32, batch 32 per
rank, momentum SGD (lr 0.05, 0.9), `--workers` ranks (resnet18_rank.py). Each trial runs
the variants in a random order:
  mercury       mercury.torch over one ps-server (2 shards, memif, the peers job of
                peers_bench.py) with the servers' momentum, float32 on the wire
  mercury_bf16  the same with wire_dtype=torch.bfloat16 (float32 master parameters on the
                servers, the gradients and parameters bfloat16 on the wire)
  ddp           DistributedDataParallel over gloo, float32
  ddp_bf16      the same with bf16_compress_hook (where torch runs it over gloo; a
                variant that fails is reported as not run, with its error: torch 1.13's
                wants CUDA and NCCL)
  ddp_fp16      the same with fp16_compress_hook
Rank r trains on its own shard of the training set, in both systems. Per variant:
images/s (ranks x 32 / the slowest rank's median step time), the step time against
max(compute, communication, CPU bound) (each measured on every rank at once before
training, once every rank has joined: forward and backward with no communication, every
parameter gradient's transfer with no compute, the slowest rank's; the CPU bound is the
job's CPU time, every rank's process and the ps-server's, of one compute step and one
communication round, over the CPUs: where ranks, server and communication threads share
the CPUs, a step needs both), and rank 0's test accuracy
after the same steps; medians [min, max] over the trials, and the ratio to ddp per trial.
`make eval` runs it as its ResNet-18 experiment (benchmarks/eval/eval.py, run_variant).

Needs Debian's python3-torch and python3-torchvision (.ci/setup); run with /usr/bin/python3.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from peers_bench import free_port, memif_job  # noqa: E402

RANK = os.path.join(HERE, "resnet18_rank.py")
VARIANTS = ("mercury", "mercury_bf16", "ddp", "ddp_bf16", "ddp_fp16")
# A DDP compress hook that torch cannot run over gloo is reported as not run, with its error.
OPTIONAL = ("ddp_bf16", "ddp_fp16")
TRAINING = "{sync: bsp, optimizer: momentum, learning_rate: 0.05, momentum: 0.9}"
LOCAL_BATCH = 32  # resnet18_rank.py's
FIELDS = ("images_per_s", "step_s", "compute_s", "comm_s", "cpu_bound_s", "bound_s",
          "ratio_to_bound", "accuracy")


def common(steps, warmup, comm_rounds):
    return ["--steps", str(steps), "--warmup", str(warmup), "--comm-rounds", str(comm_rounds)]


def run_mercury(build, workers, wire, args):
    python = os.path.join(os.path.abspath(build), "lib", "python")
    if python not in sys.path:
        sys.path.insert(0, python)
    from mercury.launch import run_job

    os.makedirs("/tmp/mercury-peers", exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(memif_job(workers, "resnet18%d" % os.getpid(), training=TRAINING))
        job = f.name
    lines = []
    try:
        status = run_job(
            job, lambda node, rank: ["/usr/bin/python3", RANK, "mercury", "--job", job,
                                     "--node", node, "--rank", str(rank), "--world",
                                     str(workers), "--wire", wire] + args,
            server_bin=os.path.join(build, "apps", "ps-server"),
            env=dict(os.environ, PYTHONPATH=python),
            echo=lambda node, line: lines.append((node, line)), timeout_s=3600)
    finally:
        os.unlink(job)
    results = [json.loads(line) for node, line in lines if line.startswith("{")]
    if any(s != 0 for s in status.values()) or len(results) != workers:
        return None, "\n".join(f"{n}: {l}" for n, l in lines[-40:])
    return results, ""


def run_ddp(workers, hook, args):
    port = free_port()
    procs = [subprocess.Popen(["/usr/bin/python3", RANK, "ddp", "--rank", str(r), "--world",
                               str(workers), "--port", str(port), "--hook", hook] + args,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              cwd=ROOT)
             for r in range(workers)]
    results, errors = [], []
    for p in procs:
        out, _ = p.communicate(timeout=3600)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if p.returncode != 0 or not lines:
            errors.append(out.strip().splitlines()[-1] if out.strip() else "exit %d" %
                          p.returncode)
        else:
            results.append(json.loads(lines[-1]))
    if errors:
        return None, errors[0]
    return results, ""


def figures(results, workers):
    """One run's figures (FIELDS): images/s over the slowest rank's median step, that step,
    the slowest rank's compute and communication alone, the CPU bound (the job's CPU time
    of a compute step and of a communication round, every rank's process and the
    ps-server's, over the CPUs: a step needs both on the same CPUs), the bound
    max(compute, communication, CPU bound), the step over the bound, and rank 0's test
    accuracy."""
    step = max(statistics.median(r["steps"]) for r in results)
    r0 = next(r for r in results if r["rank"] == 0)
    compute = max(r["compute"] for r in results)
    comm = max(r["comm"] for r in results)
    cpu_bound = sum(r["compute_cpu"] + r["comm_cpu"] + r["compute_cpu_server"] +
                    r["comm_cpu_server"] for r in results) / r0["cpus"]
    bound = max(compute, comm, cpu_bound)
    return {"images_per_s": workers * LOCAL_BATCH / step, "step_s": step,
            "compute_s": compute, "comm_s": comm, "cpu_bound_s": cpu_bound, "bound_s": bound,
            "ratio_to_bound": step / bound, "accuracy": r0["accuracy"]}


def run_variant(variant, build, workers=4, steps=12, warmup=2, comm_rounds=3):
    """One run of `variant`: (its figures, "") or (None, why it failed)."""
    args = common(steps, warmup, comm_rounds)
    if variant.startswith("mercury"):
        res, err = run_mercury(build, workers,
                               "bfloat16" if variant == "mercury_bf16" else "float32", args)
    else:
        res, err = run_ddp(workers, {"ddp_bf16": "bf16", "ddp_fp16": "fp16"}.get(variant, "none"),
                           args)
    return (figures(res, workers), "") if res is not None else (None, err)


def summary(xs, fmt="%.3f"):
    return (fmt + " [" + fmt + ", " + fmt + "]") % (statistics.median(xs), min(xs), max(xs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--comm-rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--csv", help="also write every trial's figures here")
    a = ap.parse_args()
    try:
        import torch  # noqa: F401
        import torchvision  # noqa: F401
    except ImportError as e:
        sys.exit("resnet18_bench: needs Debian's python3-torch and python3-torchvision "
                 "(.ci/setup), run with /usr/bin/python3: %s" % e)
    variants = [v for v in a.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        sys.exit("resnet18_bench: unknown variants %s (known: %s)" % (sorted(unknown),
                                                                    ", ".join(VARIANTS)))
    got = {v: [] for v in variants}
    not_run = {}
    for t in range(a.trials):
        order = [v for v in variants if v not in not_run]
        random.shuffle(order)
        trial = {}
        for v in order:
            f, err = run_variant(v, a.build, a.workers, a.steps, a.warmup, a.comm_rounds)
            if f is None:
                if v in OPTIONAL:
                    not_run[v] = err
                    print("trial %d %-13s not run: %s" % (t + 1, v, err), flush=True)
                    continue
                sys.exit("resnet18_bench: %s failed:\n%s" % (v, err))
            trial[v] = f
            print("trial %d %-13s %7.1f images/s  step %.3f s  compute %.3f s  comm %.3f s  "
                  "CPU bound %.3f s  accuracy %.3f"
                  % (t + 1, v, f["images_per_s"], f["step_s"], f["compute_s"], f["comm_s"],
                     f["cpu_bound_s"], f["accuracy"]), flush=True)
        for v, f in trial.items():
            f["vs_ddp"] = (f["images_per_s"] / trial["ddp"]["images_per_s"]
                           if "ddp" in trial else float("nan"))
            got[v].append(f)
    print("\n| variant | images/s | s/step | compute s | comm s | CPU bound s | "
          "max(compute, comm, CPU) s | step / bound | images/s vs ddp | test accuracy |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for v in variants:
        if v in not_run or not got[v]:
            print("| %s | not run: %s | | | | | | | | |" % (v, not_run.get(v, "")))
            continue

        def col(k, fmt="%.3f"):
            return summary([x[k] for x in got[v]], fmt)
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            v, col("images_per_s", "%.1f"), col("step_s"), col("compute_s"), col("comm_s"),
            col("cpu_bound_s"), col("bound_s"), col("ratio_to_bound", "%.2f"),
            col("vs_ddp", "%.2fx"),
            col("accuracy")))
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("variant,trial," + ",".join(FIELDS) + ",ratio_to_ddp\n")
            for v in variants:
                for i, x in enumerate(got[v]):
                    f.write("%s,%d,%s,%.3f\n" % (v, i + 1, ",".join("%.4f" % x[k] for k in FIELDS),
                                                x["vs_ddp"]))


if __name__ == "__main__":
    main()
