#!/usr/bin/python3
"""The evaluation: both papers' experiments in one command (docs/evaluation.md).

  benchmarks/eval/eval.py [--build build] [--out docs] [--work BUILD/eval] [--trials 5]
                          [--quick] [--only sched,bandwidth,sync,ddp,resnet18] [--fresh]
                          [--page-only]

`make eval` runs it and regenerates docs/evaluation.md, its plots and a copy of its data
(docs/evaluation/); `make eval-quick` runs one small point of every experiment into
BUILD/eval-quick (the test `eval_quick` does the same and checks what it wrote).

Every run is appended to its CSV in the work directory as soon as it ends, so an
interrupted evaluation resumes where it stopped (--fresh starts over); the variants of
an experiment run interleaved, in a random order per trial. The page is written from
those CSVs alone (--page-only rewrites it without running anything).

1. sched: the trace-driven trainer (ps-worker --trace, config/traces/) for five models,
   4 workers and one server over net_memif, every link rate-limited by the link emulator;
   strict priority (Mercury) against FIFO (a classical PS: store-and-forward per tensor)
   and partitioning with credit (P3/ByteScheduler: store-and-forward per partition) at its
   default and at the best setting of a sweep, and the ablation FIFO with Mercury's
   immediate aggregation. 10 and 25 Gbit/s
   links are emulated at LINK_EMULATED_GBPS with compute scaled by the same factor
   (docs/link-emulator.md), so every ratio is the real link's.
2. bandwidth: the same trainer while every link's rate halves and comes back
   (link.rate_steps); partitioning keeps the setting tuned at the full rate.
3. sync: the digits CNN (apps/train-digits) trained by 4 workers under bsp, asp, ssp and
   psplus with 0, 1 and 2 stragglers; time per iteration, iterations and time to a target
   test accuracy.
4. ddp: the same digits training with torch's DistributedDataParallel over gloo and with
   mercury.torch, interleaved: time per iteration and images per second.
5. resnet18: torchvision's ResNet-18 on the digits set upscaled to 32x32, Mercury (float32
   and bfloat16 on the wire) against DDP over gloo (float32 and its compress hooks),
   interleaved (benchmarks/peers/resnet18_bench.py): images per second, the step against
   max(compute, communication, CPU bound), test accuracy after the same steps.
"""
from __future__ import annotations

import argparse
import csv
import functools
import glob
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "peers"))
from peers_bench import memif_job  # noqa: E402  (the memif job file of the benchmarks)
import resnet18_bench  # noqa: E402  (the ResNet-18 runs: resnet18_bench.run_variant)

WORKERS = 4
MODELS = ["resnet50", "vgg16", "alexnet", "inception_v3", "mobilenet_v2"]
# One accelerator for every model: the traces are this machine's CPU (batch 16); a GPU of
# the papers' class runs ResNet-50's training step in about 0.1 s, so the traces are
# multiplied by GPU_SCALE (the models keep this CPU's proportions to one another).
GPU_SCALE = 0.1 / 5.8396
# The emulated links run at LINK_EMULATED_GBPS, at most about half of what this host's
# memif stack carries through the server with four workers (docs/link-emulator.md); a
# real link of R Gbit/s is emulated with time scaled by R / LINK_EMULATED_GBPS.
LINK_EMULATED_GBPS = 2.0
# The models run at each link rate (25 Gbit/s multiplies compute by 12.5 here, so its runs
# time fewer rounds: Settings).
LINKS = {10: MODELS, 25: MODELS}
DEFAULT_PARTITION = (4 << 20, 8 << 20)  # network.partition_bytes, credit_bytes defaults
SWEEP = [(512 << 10, 2 << 20), (2 << 20, 2 << 20), (2 << 20, 8 << 20), (8 << 20, 32 << 20)]
# Each scheduling variant: the job's network.scheduler and training.aggregation. The
# baselines are what they model: a classical PS (ps-lite) sends a tensor's aggregate back
# only once the whole tensor is aggregated, P3 and ByteScheduler a partition's once the
# whole partition is; fifo_chunk is the ablation, FIFO with Mercury's immediate per-chunk
# aggregation, which says how much of the speed-up each half of the design gives.
VARIANTS = ["strict", "fifo", "partition", "partition_best", "fifo_chunk"]
VARIANT_LABEL = {"strict": "strict (Mercury)", "fifo": "FIFO (classical PS)",
                 "partition": "partition default", "partition_best": "partition best",
                 "fifo_chunk": "FIFO, immediate aggregation"}
VARIANT_JOB = {"strict": ("strict", "chunk"), "fifo": ("fifo", "tensor"),
               "partition": ("partition", "tensor"), "partition_best": ("partition", "tensor"),
               "fifo_chunk": ("fifo", "chunk")}

MODES = ["bsp", "asp", "ssp", "psplus"]
SSP_BOUND = 2
STRAGGLERS = {0: [], 1: ["3,4"], 2: ["3,4", "2,2"]}  # stragglers -> rank,slowdown
TARGET_ACCURACY = 0.90
# SGD with the learning rate scaled linearly with the batch an update averages (Goyal et
# al.): an asynchronous update is one worker's batch of 16, a BSP update the global 64.
# PS+ runs with its staleness rule lr / sqrt(1 + s) and the base rate ASYNC_LR x sqrt(W):
# an update s = W - 1 versions stale takes ASP's step, a fresh one (s = 0) sqrt(W) times
# it. PS+'s updates are fresher than ASP's (its workers compute from the newest versions
# the servers send them), so its steps are between the two (sync.csv's staleness).
# Under the rule lr / (1 + s) with base ASYNC_LR x W, those fresh updates take
# W times ASP's step: the digits model then collapsed in the last epoch of most runs
# (test accuracy 0.95 -> 0.4-0.6).
ASYNC_LR = 0.1
PSPLUS_RULE = "inverse_sqrt"
# The modes on the models' traces: one straggler (rank 3, 4x), the 10 Gbit/s scale. A
# 4x straggler's round of VGG-16 is 14 s of emulated compute here, Inception-v3's 2.5 s:
# the models that fit the evaluation's time are the one whose compute and communication
# are close, the one whose communication dominates, and the small one.
SYNC_MODELS = ["resnet50", "alexnet", "mobilenet_v2"]
SYNC_MODEL_STRAGGLER = "3,4"
# ps-demo prints the iteration to the millisecond: two within that of each other are a
# tie (the compute-bound rows, where every scheduler runs at the compute's pace).
ITERATION_RESOLUTION_S = 0.001
# The issue's aim for the whole `make eval` on this machine, in minutes of runs.
EVAL_AIM_MIN = 45

# The aggregation column says what ran (VARIANT_JOB): a work directory from before the
# baselines' store-and-forward has other columns, and is refused rather than mixed in.
SCHED_FIELDS = ["link_gbps", "model", "variant", "aggregation", "partition_bytes", "credit_bytes", "trial",
                "iteration_s", "compute_s", "communication_s", "bound_s", "ratio"]
# Only strict's runs measure the bound (comm-only rounds): the sweep's rows have no ratio, and
# the others' rows in sched.csv leave communication_s, bound_s and ratio empty.
SWEEP_FIELDS = ["link_gbps", "model", "aggregation", "partition_bytes", "credit_bytes", "iteration_s"]
SYNC_FIELDS = ["stragglers", "mode", "trial", "iteration_s", "steps_to_target",
               "seconds_to_target", "final_accuracy", "staleness"]
CURVE_FIELDS = ["stragglers", "mode", "trial", "epoch", "steps", "seconds", "loss", "accuracy"]
DDP_FIELDS = ["system", "trial", "iteration_s", "images_per_s", "final_accuracy"]
# One row per ResNet-18 run: resnet18_bench.FIELDS, or `not_run` with torch's reason.
RESNET18_FIELDS = ["variant", "trial", *resnet18_bench.FIELDS, "not_run"]
# One row per variant: its test accuracy after resnet18_accuracy_steps (one run: the
# training is deterministic, every trial of a variant ends at the same accuracy).
RESNET18_ACCURACY_FIELDS = ["variant", "steps", "accuracy"]
RESNET18_LABEL = {"mercury": "Mercury, float32 on the wire",
                  "mercury_bf16": "Mercury, bfloat16 on the wire",
                  "ddp": "DDP over gloo, float32",
                  "ddp_bf16": "DDP over gloo, bf16_compress_hook",
                  "ddp_fp16": "DDP over gloo, fp16_compress_hook"}
BANDWIDTH_FIELDS = ["variant", "aggregation", "trial", "round", "start_s", "iteration_s"]
SHARED_FIELDS = ["variant", "aggregation", "partition_bytes", "credit_bytes", "trial",
                 "iteration_s", "other_rounds", "other_iteration_s"]
# The means of the rounds (sync_model_run): named so that a work directory holding the
# medians of an earlier version is refused rather than mixed in.
SYNC_MODEL_FIELDS = ["model", "mode", "trial", "iteration_mean_s", "straggler_iteration_mean_s"]


class Settings:
    """What one evaluation runs: the full one or the quick one."""

    def variants(self, link: int) -> list[str]:
        return [v for v in VARIANTS if v != "fifo_chunk" or link == self.sweep_link]

    def __init__(self, quick: bool, trials: int) -> None:
        self.quick = quick
        self.trials = 1 if quick else trials
        self.links = {10: ["mobilenet_v2"]} if quick else LINKS
        self.models = [m for m in MODELS if any(m in ms for ms in self.links.values())]
        self.sweep = SWEEP[:1] if quick else SWEEP
        self.sweep_link = 10                         # the sweep runs at this rate only
        # The ablation (fifo_chunk) runs at the sweep's rate only.
        # Trace rounds: round 1 starts the pipeline (its backward pass alone: the forward
        # would find every parameter in place), round 2 is timed; the trials give the
        # spread. At 25 Gbit/s compute runs 12.5x slower than the real one (VGG-16's
        # iteration takes 9 s), and strict runs 1 comm-only round of each kind there.
        self.rounds = 2
        self.comm_rounds_25 = 1
        # Strict's runs measure the lower bound (comm-only rounds, burst and streamed);
        # the others need only their iteration (no comm-only rounds: their untimed trace
        # round 1 is their warm-up as it is strict's).
        self.comm_rounds = 1 if quick else 2
        self.stragglers = {1: STRAGGLERS[1]} if quick else STRAGGLERS
        self.sync_epochs = 2 if quick else 8
        self.sync_compute_ms = 10.0
        # Rank 0's test accuracy every sync_curve_every steps (an epoch is 22): the
        # iterations and the time to the target are read at that grain.
        self.sync_curve_every = 2
        # The trace-driven trainers under each mode with one straggler, rank 0's median of
        # the rounds after the first: under SSP a fast worker reaches the straggler's pace
        # only once its bound's slack is used (AlexNet: from its 10th round), which these
        # rounds do not show (the reading says so).
        self.sync_models = ["mobilenet_v2"] if quick else SYNC_MODELS
        self.sync_model_rounds = 3 if quick else 6
        self.ddp_epochs = 2 if quick else 5
        # ResNet-18 against DDP: every variant (the quick run: one of each system) per trial,
        # resnet18_steps timed steps after resnet18_warmup (4 epochs of 11 steps in all).
        self.resnet18_variants = (["mercury_bf16", "ddp"] if quick
                                  else list(resnet18_bench.VARIANTS))
        self.resnet18_steps = 2 if quick else 40
        self.resnet18_warmup = 1 if quick else 4
        self.resnet18_comm_rounds = 1 if quick else 3
        # Test accuracy after 20 epochs (220 steps): at 4 epochs the digits are half
        # learned and an accuracy moves by points with the rounding of the sums (DDP with
        # fp16_compress_hook and without differ by 3). None in the quick run.
        self.resnet18_accuracy_steps = 0 if quick else 216
        self.timeline_model = "mobilenet_v2" if quick else "resnet50"
        # The bandwidth experiment: the rate halves at step_down_s after the job starts
        # and comes back at step_up_s; the trainer runs bandwidth_rounds trace rounds.
        self.bandwidth_model = "mobilenet_v2" if quick else "resnet50"
        self.bandwidth_rounds = 6 if quick else 14
        self.step_down_s = 1.5 if quick else 4.0
        self.step_up_s = 2.5 if quick else 8.0
        # The shared link: the measured job (shared_model, shared_rounds trace rounds) and a
        # second job (strict priority on shared_other_model) on the same wires.
        self.shared_model = "mobilenet_v2" if quick else "resnet50"
        self.shared_other_model = "mobilenet_v2" if quick else "resnet50"
        self.shared_rounds = 3 if quick else 8


@functools.cache
def code_version() -> str:
    """The commit the runs come from ('+changes' when the code in the work tree differs
    from it; '?' outside a git checkout)."""
    sha = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    if not sha:
        return "?"
    changed = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no",
                              "--", "lib", "apps", "benchmarks", "config", "meson.build"],
                             capture_output=True, text=True).stdout.strip()
    return sha + ("+changes" if changed else "")


def codes_path(work: str) -> str:
    """Beside the CSVs: for each, the code versions its runs were recorded with."""
    return os.path.join(work, "code.json")


def read_codes(work: str) -> dict[str, list[str]]:
    try:
        with open(codes_path(work)) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


class Table:
    """A CSV of runs, appended run by run; the keys of the rows already there. Each run
    added notes the code version it ran with (code.json beside the CSV)."""

    def __init__(self, path: str, fields: list[str]) -> None:
        self.path, self.fields = path, fields
        self.rows: list[dict] = []
        if os.path.exists(path):
            with open(path) as f:
                self.rows = list(csv.DictReader(f))
            if self.rows and list(self.rows[0].keys()) != fields:
                sys.exit(f"eval: {path} has other columns than {fields}: move it away or "
                         "run with --fresh")

    def has(self, **key) -> bool:
        return any(all(str(r[k]) == str(v) for k, v in key.items()) for r in self.rows)

    def add(self, row: dict) -> None:
        new = not os.path.exists(self.path)
        with open(self.path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.fields)
            if new:
                w.writeheader()
            w.writerow(row)
        self.rows.append({k: str(v) for k, v in row.items()})
        work, name = os.path.split(self.path)
        codes = read_codes(work)
        if code_version() not in codes.setdefault(name, []):
            codes[name].append(code_version())
            with open(codes_path(work), "w") as f:
                json.dump(codes, f, indent=1, sort_keys=True)

    def select(self, **key) -> list[dict]:
        return [r for r in self.rows if all(str(r[k]) == str(v) for k, v in key.items())]


class Progress:
    """One line per run: what ran, its result, the time so far and an estimate of the rest."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.t0 = total, 0, time.monotonic()

    def line(self, what: str, result: str) -> None:
        self.done += 1
        spent = time.monotonic() - self.t0
        left = spent / self.done * (self.total - self.done)
        print(f"[eval {self.done:3d}/{self.total}] {what}: {result}  "
              f"({spent / 60:.1f} min, about {left / 60:.1f} min left)", flush=True)


def fail(what: str, proc: subprocess.CompletedProcess) -> None:
    sys.exit(f"eval: {what} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}"
             f"{proc.stderr[-2000:]}")


# ---- 1. scheduling -------------------------------------------------------------------

def scale_of(link_gbps: float) -> float:
    """How many times slower than real the emulated link and the compute run."""
    return link_gbps / LINK_EMULATED_GBPS


def sched_run(a, st: Settings, link_gbps: float, model: str, variant: str,
              partition: tuple[int, int] | None, timeline: str = "",
              steps: list[tuple[float, float]] | None = None, rounds: int = 0,
              comm_rounds: int | None = None, wire: str = "", sync: str = "bsp",
              straggler: str = "") -> dict:
    """One trace-driven ps-demo job of `variant`; `sync` (with its SSP_BOUND or
    PSPLUS_RULE) and `straggler` (ps-demo's RANK,F) for the modes' runs. Only strict's
    runs measure the lower bound (comm-only rounds) unless `comm_rounds` says otherwise:
    the others' communication_s, bound_s and ratio are None."""
    if comm_rounds is None:
        comm_rounds = 0 if variant != "strict" else \
            st.comm_rounds_25 if link_gbps == 25 else st.comm_rounds
    scheduler, aggregation = VARIANT_JOB[variant]
    extra = {"ssp": ", staleness_bound: %d" % SSP_BOUND,
             "psplus": ", staleness_lr: %s" % PSPLUS_RULE}.get(sync, "")
    network = "scheduler: %s" % scheduler
    if partition:
        network += ", partition_bytes: %d, credit_bytes: %d" % partition
    name = "ev%s%d" % (scheduler[0], os.getpid() % 100000)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        link = "rate_gbps: %g" % LINK_EMULATED_GBPS
        if steps:
            link += ", rate_steps: [%s]" % ", ".join(
                "{at_s: %g, rate_gbps: %g}" % step for step in steps)
        if wire:
            link += ", shared_wire: %s" % wire
        f.write(memif_job(WORKERS, name, training="{sync: %s, aggregation: %s, optimizer: "
                          "sgd, learning_rate: 0.0625%s}" % (sync, aggregation, extra),
                          network=network, link=link))
        job = f.name
    env = dict(os.environ)
    if timeline:
        env["MERCURY_TIMELINE"] = timeline
    try:
        r = subprocess.run(
            [os.path.join(a.build, "apps", "ps-demo"), "--config", job,
             "--model", os.path.join(ROOT, "config", "models", model + ".txt"),
             "--trace", os.path.join(ROOT, "config", "traces", model + ".txt"),
             "--compute-scale", "%.6g" % (GPU_SCALE * scale_of(link_gbps)),
             "--rounds", str(rounds or st.rounds),
             "--comm-rounds", str(comm_rounds),
             "--verify", "none", *(["--straggler", straggler] if straggler else [])],
            capture_output=True, text=True, timeout=1800, cwd=ROOT, env=env)
    finally:
        os.unlink(job)
    m = re.search(r"ps-demo: job: iteration ([\d.]+) s, compute ([\d.]+) s, communication "
                  r"(?:([\d.]+) s, lower bound ([\d.]+) s, ratio ([\d.]+)|not measured)",
                  r.stdout)
    if r.returncode != 0 or not m or (m.group(3) is None) != (comm_rounds == 0):
        fail(f"the {model} job with {variant} ({scheduler}, aggregation {aggregation})", r)
    it, cp, cm, lb, ratio = (None if x is None else float(x) for x in m.groups())
    return {"iteration_s": it, "compute_s": cp, "communication_s": cm, "bound_s": lb,
            "ratio": ratio, "stdout": r.stdout}


def trace_layers(model: str) -> list[tuple[str, float, float, list[str]]]:
    """config/traces/MODEL.txt's layers in forward order: name, forward and backward
    compute in this CPU's seconds, and the tensors the layer owns."""
    layers = []
    with open(os.path.join(ROOT, "config", "traces", model + ".txt")) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                name, fwd, bwd, *tensors = line.split()
                layers.append((name, float(fwd) * 1e-6, float(bwd) * 1e-6, tensors))
    return layers


def dependency_bound(model: str, link_gbps: float) -> tuple[float, str]:
    """A lower bound on the iteration that counts the layers' order, in emulated seconds,
    and the layer that sets it. Layer i's gradient is ready once the backward pass has
    computed the layers from the last down to i; its parameters and those of every layer
    before it (all ready later) must then cross the link before the forward pass can reach
    layer i, and the forward from layer i to the end follows. So, for any scheduler,
    iteration >= ready(i) + wire(layers 0..i) + forward(layers i..end), with the wire time
    the payload alone at the emulated line rate (no header, no latency). Layer 0 gives
    compute plus its own transfer, the last layer about the communication time; a large
    layer late in the forward pass (AlexNet's classifier) can give more than both."""
    scale = GPU_SCALE * scale_of(link_gbps)
    sizes = {}
    with open(os.path.join(ROOT, "config", "models", model + ".txt")) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                name, count = line.split()[:2]
                sizes[name] = 4 * int(count)
    # (name, forward s, backward s, bytes), in forward order
    layers = [(name, fwd * scale, bwd * scale, sum(sizes[t] for t in tensors))
              for name, fwd, bwd, tensors in trace_layers(model)]
    best, which, prefix = 0.0, "", 0
    for i, (name, _, _, size) in enumerate(layers):
        prefix += size
        ready = sum(b for _, _, b, _ in layers[i:])
        forward = sum(f for _, f, _, _ in layers[i:])
        t = ready + prefix * 8 / (LINK_EMULATED_GBPS * 1e9) + forward
        if t > best:
            best, which = t, name
    return best, which


def best_partition(sweep: Table, link_gbps: float, model: str) -> tuple[int, int]:
    rows = sweep.select(link_gbps=link_gbps, model=model)
    best = min(rows, key=lambda r: float(r["iteration_s"]))
    return int(best["partition_bytes"]), int(best["credit_bytes"])


def run_sched(a, st: Settings, out: str, progress: Progress) -> None:
    sweep = Table(os.path.join(out, "sweep.csv"), SWEEP_FIELDS)
    table = Table(os.path.join(out, "sched.csv"), SCHED_FIELDS)
    for link in [st.sweep_link]:
        for model in st.links[link]:
            for part in st.sweep:
                if sweep.has(link_gbps=link, model=model, partition_bytes=part[0],
                              credit_bytes=part[1]):
                    continue
                r = sched_run(a, st, link, model, "partition", part)  # as partition_best runs
                sweep.add({"link_gbps": link, "model": model,
                           "aggregation": VARIANT_JOB["partition"][1], "partition_bytes": part[0],
                           "credit_bytes": part[1], "iteration_s": r["iteration_s"]})
                progress.line(f"sweep {link}G {model} partition {mib(part[0])}/{mib(part[1])}",
                              f"iteration {r['iteration_s']:.3f} s")
    for trial in range(1, st.trials + 1):
        for link, models in st.links.items():
            for model in models:
                variants = st.variants(link)
                random.Random(f"{trial}-{link}-{model}").shuffle(variants)
                for v in variants:
                    if table.has(link_gbps=link, model=model, variant=v, trial=trial):
                        continue
                    part = None
                    if v == "partition":
                        part = DEFAULT_PARTITION
                    elif v == "partition_best":
                        part = best_partition(sweep, st.sweep_link, model)
                    r = sched_run(a, st, link, model, v, part)
                    r.pop("stdout")
                    table.add({"link_gbps": link, "model": model, "variant": v,
                               "aggregation": VARIANT_JOB[v][1],
                               "partition_bytes": part[0] if part else 0,
                               "credit_bytes": part[1] if part else 0, "trial": trial, **r})
                    progress.line(f"sched {link}G {model} {v} trial {trial}",
                                  f"iteration {r['iteration_s']:.3f} s" + (
                                      f", bound {r['bound_s']:.3f} s, ratio {r['ratio']:.3f}"
                                      if r["bound_s"] is not None else ""))


def run_timelines(a, st: Settings, out: str, progress: Progress) -> None:
    """One run per scheduler with every worker's timeline, for the picture."""
    for v in ["strict", "fifo", "partition"]:
        path = os.path.join(out, "timeline-%s.json" % v)
        if os.path.exists(path):
            continue
        with tempfile.TemporaryDirectory() as tl:
            r = sched_run(a, st, st.sweep_link, st.timeline_model, v,
                          DEFAULT_PARTITION if v == "partition" else None, timeline=tl,
                          comm_rounds=0)
            shutil.copyfile(os.path.join(tl, "w0.json"), path)
        progress.line(f"timeline {st.timeline_model} {v}", f"iteration {r['iteration_s']:.3f} s")


def round_times(stdout: str) -> tuple[list[float], list[float]]:
    """Worker 0's rounds in order: the seconds each started after the first began (comm-only,
    streamed and trace rounds, back to back), and the trace rounds' durations."""
    starts, traces, t = [], [], 0.0
    for kind, secs in re.findall(r"\[w0\] w0 (comm|streamed comm|trace) round +\d+: +([\d.]+) s",
                                 stdout):
        if kind == "trace":
            starts.append(t)
            traces.append(float(secs))
        t += float(secs)
    return starts, traces


def against_baselines(st: Settings, table: Table, tag: str):
    """(trial, variant) for strict priority, FIFO and the tuned partitioning, in a random
    order per trial, without the runs `table` already has."""
    for trial in range(1, st.trials + 1):
        variants = ["strict", "fifo", "partition_best"]
        random.Random(f"{tag}-{trial}").shuffle(variants)
        for v in variants:
            if not table.has(variant=v, trial=trial):
                yield trial, v


def run_bandwidth(a, st: Settings, out: str, progress: Progress) -> None:
    """The link's rate steps down to half and back up while the trainer runs
    (link.rate_steps): strict priority against FIFO and partitioning tuned at the full rate."""
    table = Table(os.path.join(out, "bandwidth.csv"), BANDWIDTH_FIELDS)
    sweep = Table(os.path.join(out, "sweep.csv"), SWEEP_FIELDS)
    low = LINK_EMULATED_GBPS / 2
    steps = [(st.step_down_s, low), (st.step_up_s, LINK_EMULATED_GBPS)]
    for trial, v in against_baselines(st, table, "bw"):
        part = best_partition(sweep, st.sweep_link, st.bandwidth_model) \
            if v == "partition_best" else None
        r = sched_run(a, st, st.sweep_link, st.bandwidth_model, v, part,
                      steps=steps, rounds=st.bandwidth_rounds, comm_rounds=0)
        starts, traces = round_times(r["stdout"])
        for k, (t0, secs) in enumerate(zip(starts, traces)):
            table.add({"variant": v, "aggregation": VARIANT_JOB[v][1], "trial": trial,
                       "round": k + 1,
                       "start_s": "%.3f" % t0, "iteration_s": secs})
        progress.line(f"bandwidth {st.bandwidth_model} {v} trial {trial}",
                      f"{len(traces)} rounds, median {statistics.median(traces):.3f} s")


class SecondJob:
    """Another training job on the same wires (link.shared_wire): strict priority on
    st.shared_other_model, trace-driven, running until stopped; `running` is set once its
    workers compute (their first trace round is over)."""

    def __init__(self, a, st: Settings, link_gbps: float, wire: str) -> None:
        model = st.shared_other_model
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write(memif_job(WORKERS, "evb%d" % (os.getpid() % 100000),
                              training="{sync: bsp, aggregation: chunk, optimizer: sgd, "
                              "learning_rate: 0.0625}", network="scheduler: strict",
                              link="rate_gbps: %g, shared_wire: %s" % (LINK_EMULATED_GBPS, wire)))
            self.job = f.name
        self.proc = subprocess.Popen(
            [os.path.join(a.build, "apps", "ps-demo"), "--config", self.job,
             "--model", os.path.join(ROOT, "config", "models", model + ".txt"),
             "--trace", os.path.join(ROOT, "config", "traces", model + ".txt"),
             "--compute-scale", "%.6g" % (GPU_SCALE * scale_of(link_gbps)),
             "--rounds", "100000", "--comm-rounds", "0", "--verify", "none"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        self.running = threading.Event()
        self.rounds: list[tuple[float, float]] = []  # worker 0's: (when it ended, seconds)
        self.tail: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.tail = (self.tail + [line])[-40:]
            m = re.search(r"\[w0\] w0 trace round +\d+: +([\d.]+) s", line)
            if m:
                self.rounds.append((time.monotonic(), float(m.group(1))))
                self.running.set()

    def wait_running(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.running.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                sys.exit("eval: the second job did not start:\n" + "".join(self.tail))

    def rounds_between(self, t0: float, t1: float) -> list[float]:
        """Worker 0's trace rounds that ended between monotonic times t0 and t1."""
        return [secs for t, secs in list(self.rounds) if t0 <= t <= t1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(10)
        os.unlink(self.job)


def run_shared(a, st: Settings, out: str, progress: Progress) -> None:
    """A second job shares every link (link.shared_wire) while the measured one runs:
    strict priority against FIFO and partitioning tuned for the link alone."""
    table = Table(os.path.join(out, "shared.csv"), SHARED_FIELDS)
    sweep = Table(os.path.join(out, "sweep.csv"), SWEEP_FIELDS)
    for trial, v in against_baselines(st, table, "shared"):
        wire = "ev%d-%d-%s" % (os.getpid() % 100000, trial, v.replace("_", ""))
        part = best_partition(sweep, st.sweep_link, st.shared_model) \
            if v == "partition_best" else None
        other = SecondJob(a, st, st.sweep_link, wire)
        try:
            other.wait_running()
            t0 = time.monotonic()
            r = sched_run(a, st, st.sweep_link, st.shared_model, v, part,
                          rounds=st.shared_rounds, comm_rounds=0, wire=wire)
            during = other.rounds_between(t0, time.monotonic())
        finally:
            other.stop()
            for leftover in glob.glob("/dev/shm/mercury-wire-%s.*" % wire):
                os.unlink(leftover)  # a process killed before it removed its wire
        table.add({"variant": v, "aggregation": VARIANT_JOB[v][1],
                   "partition_bytes": part[0] if part else 0,
                   "credit_bytes": part[1] if part else 0, "trial": trial,
                   "iteration_s": r["iteration_s"], "other_rounds": len(during),
                   "other_iteration_s": statistics.median(during) if during else ""})
        progress.line(f"shared link {st.shared_model} {v} trial {trial}",
                      f"iteration {r['iteration_s']:.3f} s; the other job's "
                      + (f"{statistics.median(during):.3f} s over {len(during)} rounds"
                         if during else "rounds: none ended meanwhile"))


# ---- 2. synchronisation --------------------------------------------------------------

def digits_job(tmp: str, name: str, mode: str, training: str = "") -> str:
    extra = {"ssp": "staleness_bound: %d, " % SSP_BOUND,
             "psplus": "staleness_lr: %s, " % PSPLUS_RULE}.get(mode, "")
    lr = {"bsp": ASYNC_LR * WORKERS, "psplus": ASYNC_LR * math.sqrt(WORKERS)}.get(mode, ASYNC_LR)
    path = os.path.join(tmp, name + ".yaml")
    with open(path, "w") as f:
        f.write(memif_job(WORKERS, name, training=training or "{sync: %s, %soptimizer: sgd, "
                          "learning_rate: %g}" % (mode, extra, lr)))
    return path


def digits(a, args: list[str], curve: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, os.path.join(ROOT, "apps", "train-digits",
                                                     "train_digits.py"),
                        "--build", a.build, "--curve", curve,
                        "--target", str(TARGET_ACCURACY), *args],
                       capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if not os.path.exists(curve) or os.path.getsize(curve) == 0:
        fail("train-digits " + " ".join(args), r)
    return r


def read_curve(path: str) -> list[tuple[int, int, float, float | None, float]]:
    """train-digits' --curve lines in step order: epoch, steps, seconds, training loss
    (None on the lines --curve-every adds within an epoch) and test accuracy."""
    with open(path) as f:
        return [(int(e), int(s), float(t), float(loss) if loss else None, float(acc))
                for e, s, t, loss, acc in csv.reader(f)]


def server_staleness(output: str) -> float:
    """The versions behind an update was on average when the server applied it, from
    ps-server's closing line (train-digits echoes it; no stale update: 0)."""
    lines = [l for l in output.splitlines() if ": stopped; " in l]
    if not lines:
        raise RuntimeError("eval: train-digits printed no ps-server closing line:\n" + output)
    m = re.search(r"([0-9.]+) versions behind on average", lines[-1])
    return float(m.group(1)) if m else 0.0


def per_iteration(curve) -> float:
    """The median over epochs after the first of the epoch's seconds per step (from the
    epochs' last lines, the ones with a training loss)."""
    curve = [c for c in curve if c[3] is not None]
    steps = [(curve[i][1] - curve[i - 1][1], curve[i][2] - curve[i - 1][2])
             for i in range(1, len(curve))] or [(curve[0][1], curve[0][2])]
    return statistics.median(t / n for n, t in steps)


def run_sync(a, st: Settings, out: str, progress: Progress) -> None:
    table = Table(os.path.join(out, "sync.csv"), SYNC_FIELDS)
    curves = Table(os.path.join(out, "sync_curves.csv"), CURVE_FIELDS)
    for trial in range(1, st.trials + 1):
        for k, specs in st.stragglers.items():
            modes = list(MODES)
            random.Random(f"{trial}-{k}").shuffle(modes)
            for mode in modes:
                if table.has(stragglers=k, mode=mode, trial=trial):
                    continue
                with tempfile.TemporaryDirectory() as tmp:
                    job = digits_job(tmp, "evs%d" % (os.getpid() % 100000), mode)
                    curve_path = os.path.join(tmp, "curve.csv")
                    args = ["--job", job, "--epochs", str(st.sync_epochs),
                            "--compute-ms", "%g" % st.sync_compute_ms,
                            "--curve-every", str(st.sync_curve_every), "--end-with-rank0"]
                    for s in specs:
                        args += ["--straggler", s]
                    r = digits(a, args, curve_path)
                    curve = read_curve(curve_path)
                reached = [c for c in curve if c[4] >= TARGET_ACCURACY]
                row = {"stragglers": k, "mode": mode, "trial": trial,
                       "iteration_s": "%.5f" % per_iteration(curve),
                       "steps_to_target": reached[0][1] if reached else "",
                       "seconds_to_target": "%.3f" % reached[0][2] if reached else "",
                       "final_accuracy": curve[-1][4],
                       "staleness": "%.2f" % server_staleness(r.stdout)}
                for c in curve:
                    curves.add({"stragglers": k, "mode": mode, "trial": trial, "epoch": c[0],
                                "steps": c[1], "seconds": c[2],
                                "loss": "" if c[3] is None else c[3], "accuracy": c[4]})
                table.add(row)
                progress.line(f"sync {k} straggler(s) {mode} trial {trial}",
                              f"{float(row['iteration_s']) * 1000:.1f} ms/iter, target "
                              + (f"after {row['steps_to_target']} steps, "
                                 f"{row['seconds_to_target']} s" if reached else "not reached")
                              + f", final accuracy {curve[-1][4]:.3f}, updates "
                              f"{row['staleness']} versions behind")


def sync_model_run(a, st: Settings, model: str, mode: str) -> dict:
    """One model's trace under `mode`, strict priority, rank 3 a 4x straggler: rank 0's
    and the straggler's iteration, each the mean of its trace rounds after the first (under
    psplus a model whose communication dominates alternates rounds that wait seconds for
    their parameters with fast ones, and the median would show only the fast ones)."""
    r = sched_run(a, st, st.sweep_link, model, "strict", None, rounds=st.sync_model_rounds,
                  comm_rounds=0, sync=mode, straggler=SYNC_MODEL_STRAGGLER)
    its = dict(re.findall(r"\[(w\d+)\] \1: iteration: median of trace rounds? [\d-]+ "
                          r"\[[\d.]+, [\d.]+\], mean ([\d.]+),", r["stdout"]))
    straggler = "w" + SYNC_MODEL_STRAGGLER.split(",")[0]
    if "w0" not in its or straggler not in its:
        sys.exit(f"eval: the {model} trace under {mode} with a straggler printed no iteration "
                 f"for w0 or {straggler}:\n{r['stdout'][-3000:]}")
    return {"iteration_mean_s": float(its["w0"]),
            "straggler_iteration_mean_s": float(its[straggler])}


def run_sync_models(a, st: Settings, out: str, progress: Progress) -> None:
    table = Table(os.path.join(out, "sync_models.csv"), SYNC_MODEL_FIELDS)
    for trial in range(1, st.trials + 1):
        for model in st.sync_models:
            modes = list(MODES)
            random.Random(f"models-{trial}-{model}").shuffle(modes)
            for mode in modes:
                if table.has(model=model, mode=mode, trial=trial):
                    continue
                r = sync_model_run(a, st, model, mode)
                table.add({"model": model, "mode": mode, "trial": trial, **r})
                progress.line(f"sync {model} {mode} trial {trial}",
                              f"rank 0 {r['iteration_mean_s']:.3f} s, the straggler "
                              f"{r['straggler_iteration_mean_s']:.3f} s per iteration")


# ---- 3. against DDP ------------------------------------------------------------------

def run_ddp(a, st: Settings, out: str, progress: Progress) -> None:
    table = Table(os.path.join(out, "ddp.csv"), DDP_FIELDS)
    batch = 64
    for trial in range(1, st.trials + 1):
        systems = ["mercury", "ddp"]
        random.Random(trial).shuffle(systems)
        for system in systems:
            if table.has(system=system, trial=trial):
                continue
            with tempfile.TemporaryDirectory() as tmp:
                # config/digits.yaml's training (make demo's), in both systems.
                job = digits_job(tmp, "evd%d" % (os.getpid() % 100000), "bsp",
                                 "{sync: bsp, optimizer: momentum, learning_rate: 0.1, "
                                 "momentum: 0.9}")
                curve_path = os.path.join(tmp, "curve.csv")
                args = ["--job", job, "--epochs", str(st.ddp_epochs), "--batch", str(batch)]
                digits(a, args + (["--ddp"] if system == "ddp" else []), curve_path)
                curve = read_curve(curve_path)
            it = per_iteration(curve)
            table.add({"system": system, "trial": trial, "iteration_s": "%.7f" % it,
                       "images_per_s": "%.0f" % (batch / it), "final_accuracy": curve[-1][4]})
            progress.line(f"ddp {system} trial {trial}",
                          f"{it * 1000:.2f} ms/iter, {batch / it:.0f} images/s")


# ---- 5. ResNet-18 against DDP --------------------------------------------------------

def run_resnet18(a, st: Settings, out: str, progress: Progress) -> None:
    table = Table(os.path.join(out, "resnet18.csv"), RESNET18_FIELDS)
    for trial in range(1, st.trials + 1):
        variants = list(st.resnet18_variants)
        random.Random(f"resnet18-{trial}").shuffle(variants)
        for v in variants:
            # A variant torch could not run is not tried again.
            if table.has(variant=v, trial=trial) or \
                    any(r["not_run"] for r in table.select(variant=v)):
                continue
            f, err = resnet18_bench.run_variant(v, a.build, WORKERS, st.resnet18_steps,
                                                st.resnet18_warmup, st.resnet18_comm_rounds)
            if f is None:
                if v not in resnet18_bench.OPTIONAL:
                    sys.exit(f"eval: ResNet-18 {v} failed:\n{err}")
                why = (err.strip().splitlines() or ["no output"])[-1]
                table.add({"variant": v, "trial": trial,
                           **{k: "" for k in resnet18_bench.FIELDS}, "not_run": why})
                progress.line(f"resnet18 {v} trial {trial}", f"not run: {why}")
                continue
            table.add({"variant": v, "trial": trial,
                       **{k: "%.5f" % f[k] for k in resnet18_bench.FIELDS}, "not_run": ""})
            progress.line(f"resnet18 {v} trial {trial}",
                          f"{f['images_per_s']:.1f} images/s, step {f['step_s']:.3f} s "
                          f"against max(compute, communication, CPU) {f['bound_s']:.3f} s, "
                          f"accuracy {f['accuracy']:.3f}")
    if st.resnet18_accuracy_steps == 0:
        return
    acc = Table(os.path.join(out, "resnet18_accuracy.csv"), RESNET18_ACCURACY_FIELDS)
    for v in st.resnet18_variants:
        if acc.has(variant=v) or any(r["not_run"] for r in table.select(variant=v)):
            continue
        f, err = resnet18_bench.run_variant(v, a.build, WORKERS, st.resnet18_accuracy_steps,
                                            st.resnet18_warmup, 1)
        if f is None:
            sys.exit(f"eval: ResNet-18 {v}, the accuracy run, failed:\n{err}")
        acc.add({"variant": v, "steps": st.resnet18_accuracy_steps + st.resnet18_warmup,
                 "accuracy": "%.5f" % f["accuracy"]})
        progress.line(f"resnet18 {v} accuracy",
                      f"{f['accuracy']:.3f} after "
                      f"{st.resnet18_accuracy_steps + st.resnet18_warmup} steps")


# ---- the page ------------------------------------------------------------------------

def mib(b: int) -> str:
    return "%g MiB" % (b / (1 << 20)) if b >= (1 << 20) else "%g KiB" % (b / 1024)


def med(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


def cell(xs: list[float], fmt: str = "%.3f") -> str:
    if not xs:
        return "-"
    m, lo, hi = med(xs)
    return (fmt + " [" + fmt + ", " + fmt + "]") % (m, lo, hi)


def sched_section(out: str, img: str, st: Settings, plots: list[str]) -> tuple[list[str], dict]:
    table = Table(os.path.join(out, "sched.csv"), SCHED_FIELDS)
    sweep = Table(os.path.join(out, "sweep.csv"), SWEEP_FIELDS)
    lines, facts = [], {}
    for link, models in st.links.items():
        lines += ["", f"### {link} Gbit/s links (emulated at {LINK_EMULATED_GBPS:g} Gbit/s, "
                      f"every time x{scale_of(link):g})", "",
                  "Iteration time in emulated seconds (divide by %g for the real link), median "
                  "[min, max] over the trials; speed-up = the baseline's iteration over strict "
                  "priority's, per trial; ratio = iteration / max(compute, communication) of "
                  "the same run; dependency ratio = iteration / the larger of that bound and "
                  "the bound that counts the layers' order (the reading, \"The bound\"; where "
                  "it is the larger, the layer that sets it and its value follow).%s" % (
                      scale_of(link), "" if "fifo_chunk" in st.variants(link)
                      else " The ablation runs at %d Gbit/s only." % st.sweep_link), "",
                  "| model | compute | strict (Mercury) | FIFO (classical PS) | partition default | "
                  "partition best | FIFO, immediate aggregation | strict vs FIFO | strict vs "
                  "best partition | strict vs FIFO, immediate | strict's ratio to the bound | "
                  "strict's dependency ratio |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for model in models:
            rows = {v: table.select(link_gbps=link, model=model, variant=v) for v in VARIANTS}
            if not rows["strict"]:
                continue
            it = {v: {int(r["trial"]): float(r["iteration_s"]) for r in rows[v]} for v in VARIANTS}

            def speedup(base: str) -> list[float]:
                return [it[base][t] / it["strict"][t] for t in it["strict"] if t in it[base]]

            best = best_partition(sweep, st.sweep_link, model) if sweep.select(
                link_gbps=st.sweep_link, model=model) else None
            comp = [float(r["compute_s"]) for r in rows["strict"]]
            ratio = [float(r["ratio"]) for r in rows["strict"]]
            dep, dep_layer = dependency_bound(model, link)
            dep_ratio = [float(r["iteration_s"]) / max(float(r["bound_s"]), dep)
                         for r in rows["strict"]]
            dep_note = (f" ({dep_layer}: {dep:.3f})" if dep > statistics.median(
                float(r["bound_s"]) for r in rows["strict"]) else "")
            lines.append(
                f"| {model} | {statistics.median(comp):.3f} | {cell(list(it['strict'].values()))}"
                f" | {cell(list(it['fifo'].values()))} | {cell(list(it['partition'].values()))}"
                f" | {cell(list(it['partition_best'].values()))}"
                + (f" ({mib(best[0])} / {mib(best[1])})" if best else "")
                + f" | {cell(list(it['fifo_chunk'].values()))}"
                f" | {cell(speedup('fifo'), '%.2fx')} | {cell(speedup('partition_best'), '%.2fx')}"
                f" | {cell(speedup('fifo_chunk'), '%.2fx')} | {cell(ratio)}"
                f" | {cell(dep_ratio)}{dep_note} |")
            facts[(link, model)] = {
                "fifo": statistics.median(speedup("fifo")) if speedup("fifo") else math.nan,
                "best": statistics.median(speedup("partition_best"))
                if speedup("partition_best") else math.nan,
                "default": statistics.median(speedup("partition"))
                if speedup("partition") else math.nan,
                "fifo_chunk": statistics.median(speedup("fifo_chunk"))
                if speedup("fifo_chunk") else math.nan,
                "strict_s": statistics.median(it["strict"].values()),
                "ratio": statistics.median(ratio),
                "dep_ratio": statistics.median(dep_ratio),
                "comm_over_compute": statistics.median(
                    float(r["communication_s"]) / float(r["compute_s"]) for r in rows["strict"]),
            }
        png = plot_sched(img, table, link, st)
        if png:
            plots.append(png)
            lines += ["", f"![iteration time per scheduler, {link} Gbit/s]"
                          f"(evaluation/{os.path.basename(png)})"]
    if sweep.rows:
        lines += ["", f"The partition sweep at {st.sweep_link} Gbit/s (one run per setting, "
                      "partition size / credit; iteration in emulated seconds); the best of "
                      "each model is its `partition best` at every rate:", "",
                  "| link | model | " + " | ".join(f"{mib(p)} / {mib(c)}" for p, c in st.sweep)
                  + " |", "| --- | --- | " + " | ".join("---" for _ in st.sweep) + " |"]
        for link in [st.sweep_link]:
            for model in st.links[link]:
                vals = []
                for p, c in st.sweep:
                    r = sweep.select(link_gbps=link, model=model, partition_bytes=p,
                                     credit_bytes=c)
                    vals.append("%.3f" % float(r[0]["iteration_s"]) if r else "-")
                lines.append(f"| {link} | {model} | " + " | ".join(vals) + " |")
    return lines, facts


def plot_sched(img: str, table: Table, link: int, st: Settings) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [m for m in st.links[link] if table.select(link_gbps=link, model=m,
                                                         variant="strict")]
    if not models:
        return ""
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.16
    variants = st.variants(link)
    for i, v in enumerate(variants):
        meds, los, his = [], [], []
        for m in models:
            bound = statistics.median(float(r["bound_s"]) for r in
                                      table.select(link_gbps=link, model=m, variant="strict"))
            xs = [float(r["iteration_s"]) / bound for r in
                  table.select(link_gbps=link, model=m, variant=v)] or [math.nan]
            md, lo, hi = med(xs)
            meds.append(md)
            los.append(md - lo)
            his.append(hi - md)
        ax.bar([j + (i - (len(variants) - 1) / 2) * width for j in range(len(models))], meds,
               width, yerr=[los, his], capsize=2, label=VARIANT_LABEL[v])
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels(models)
    ax.set_ylabel("iteration / strict's lower bound")
    ax.set_title(f"{WORKERS} workers, {link} Gbit/s links (emulated)")
    ax.legend()
    fig.tight_layout()
    path = os.path.join(img, f"sched-{link}g.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_timelines(out: str, img: str) -> str:
    """One iteration of worker 0 per scheduler: each tensor's push and pull (first layer at
    the top) and the trainer's compute below."""
    import json

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(v, os.path.join(out, "timeline-%s.json" % v)) for v in ["strict", "fifo",
                                                                     "partition"]]
    runs = [(v, p) for v, p in runs if os.path.exists(p)]
    if not runs:
        return ""
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 3.2 * len(runs)), sharex=False)
    axes = axes if len(runs) > 1 else [axes]
    for ax, (v, path) in zip(axes, runs):
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        rows = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
        order = {}
        for e in events:
            if e["name"] == "thread_sort_index":
                order[e["tid"]] = e["args"]["sort_index"]
        spans = [e for e in events if e.get("ph") == "X"]
        # ps-worker --trace's compute rows are named forward, backward and wait (a span per
        # layer); every other row is a tensor's.
        compute = {"forward": "tab:green", "backward": "tab:gray", "wait": "tab:red"}
        tensor_spans = [e for e in spans if rows.get(e["tid"]) not in compute]
        last = max(e["args"].get("iteration", 0) for e in tensor_spans)
        it = last - 1  # the last trace round whose successor exists
        mine = [e for e in tensor_spans if e["args"].get("iteration") == it]
        t0 = min(e["ts"] for e in mine if e["name"] == "push")
        t1 = max(e["ts"] + e["dur"] for e in mine if e["name"] == "pull")
        tids = sorted({e["tid"] for e in mine}, key=lambda t: order.get(t, t))
        y = {t: i for i, t in enumerate(tids)}
        for e in mine:
            if e["name"] in ("push", "pull"):
                ax.barh(y[e["tid"]], e["dur"] / 1000, left=(e["ts"] - t0) / 1000, height=0.8,
                        color="tab:blue" if e["name"] == "push" else "tab:orange")
        pad = (t1 - t0) * 0.6
        base = len(tids) + max(3, len(tids) // 8)  # the trainer row, apart from the tensors
        for e in spans:
            kind = rows.get(e["tid"])
            if kind in compute and t0 - pad <= e["ts"] <= t1 + pad:
                ax.barh(base, e["dur"] / 1000, left=(e["ts"] - t0) / 1000, height=3,
                        color=compute[kind])
        ax.set_ylim(base + 3, -1)
        ax.set_yticks([0, len(tids) - 1, base])
        ax.set_yticklabels(["first layer", "last layer", "trainer"])
        ax.set_title(f"{VARIANT_LABEL[v]}: worker 0, iteration {it} (blue push, orange pull; trainer: grey "
                     "backward, green forward, red waiting)", fontsize=9)
        ax.set_xlabel("ms from the iteration's first push")
    fig.tight_layout()
    png = os.path.join(img, "timeline.png")
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png


BANDWIDTH_MARGIN_S = 1.0  # worker 0's clock starts up to this long after the link's


def bandwidth_section(out: str, img: str, st: Settings, plots: list[str]) -> list[str]:
    table = Table(os.path.join(out, "bandwidth.csv"), BANDWIDTH_FIELDS)
    if not table.rows:
        return []
    variants = ["strict", "fifo", "partition_best"]

    def phase(r: dict) -> str:
        # Round times count from worker 0's first round (a trace round: these runs have no
        # comm-only rounds), which begins after the link's clock started (the job's start, then version 0 and a barrier): a round is
        # classed only where that offset, up to BANDWIDTH_MARGIN_S, cannot move it across a
        # step.
        if r["round"] == "1":
            return ""  # its backward pass alone, no iteration (docs/trace-trainer.md)
        t0 = float(r["start_s"])
        t1 = t0 + float(r["iteration_s"])
        if t1 + BANDWIDTH_MARGIN_S <= st.step_down_s or t0 >= st.step_up_s:
            return "full"
        if t0 >= st.step_down_s and t1 + BANDWIDTH_MARGIN_S <= st.step_up_s:
            return "half"
        return ""

    by = {v: {} for v in variants}
    for r in table.rows:
        by[r["variant"]].setdefault((int(r["trial"]), phase(r)), []).append(float(r["iteration_s"]))
    lines = ["", "| scheduler | full rate: s per iteration | half rate: s per iteration | "
             "half / full | strict's speed-up at half rate |", "| --- | --- | --- | --- | --- |"]
    trials = sorted({int(r["trial"]) for r in table.rows})

    def per_trial(v: str, ph: str) -> dict:
        return {t: statistics.median(by[v][(t, ph)]) for t in trials if (t, ph) in by[v]}

    for v in variants:
        full, half = per_trial(v, "full"), per_trial(v, "half")
        ratio = [half[t] / full[t] for t in trials if t in full and t in half]
        strict_half = per_trial("strict", "half")
        speed = [half[t] / strict_half[t] for t in trials if t in half and t in strict_half]
        lines.append(f"| {VARIANT_LABEL[v]} | {cell(list(full.values()))} | "
                     f"{cell(list(half.values()))} | {cell(ratio, '%.2fx')} | "
                     f"{cell(speed, '%.2fx') if v != 'strict' else '-'} |")
    png = plot_bandwidth(img, table, st)
    if png:
        plots.append(png)
        lines += ["", f"![iteration time while the rate steps](evaluation/{os.path.basename(png)})"]
    return lines


def shared_section(out: str, st: Settings) -> list[str]:
    table = Table(os.path.join(out, "shared.csv"), SHARED_FIELDS)
    if not table.rows:
        return ["", "(not run)"]
    sched = Table(os.path.join(out, "sched.csv"), SCHED_FIELDS)
    variants = ["strict", "fifo", "partition_best"]
    trials = sorted({int(r["trial"]) for r in table.rows})
    shared = {v: {int(r["trial"]): float(r["iteration_s"]) for r in table.select(variant=v)}
              for v in variants}
    lines = ["", "| scheduler | alone: s per iteration | sharing: s per iteration | "
             "sharing / alone (medians) | strict's speed-up while sharing | the second job's "
             "s per iteration meanwhile |", "| --- | --- | --- | --- | --- | --- |"]
    for v in variants:
        alone = [float(r["iteration_s"]) for r in sched.select(
            link_gbps=st.sweep_link, model=st.shared_model, variant=v)]
        mine = list(shared[v].values())
        speed = [shared[v][t] / shared["strict"][t] for t in trials
                 if t in shared[v] and t in shared["strict"]]
        other = [float(r["other_iteration_s"]) for r in table.select(variant=v)
                 if r["other_iteration_s"]]
        ratio = "%.2fx" % (statistics.median(mine) / statistics.median(alone)) \
            if alone and mine else "-"
        lines.append(f"| {VARIANT_LABEL[v]} | {cell(alone) if alone else '-'} | {cell(mine)} | "
                     f"{ratio} | {cell(speed, '%.2fx') if v != 'strict' else '-'} | "
                     f"{cell(other) if other else '-'} |")
    return lines


def plot_bandwidth(img: str, table: Table, st: Settings) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    for v in ["strict", "fifo", "partition_best"]:
        rows = [r for r in table.rows if r["variant"] == v and r["trial"] == "1"
                and r["round"] != "1"]  # round 1: its backward pass alone
        if rows:
            ax.plot([float(r["start_s"]) for r in rows], [float(r["iteration_s"]) for r in rows],
                    marker="o", label=VARIANT_LABEL[v])
    ax.axvspan(st.step_down_s, st.step_up_s, color="grey", alpha=0.2,
               label=f"{LINK_EMULATED_GBPS / 2:g} Gbit/s (job clock)")
    ax.set_xlabel("worker 0's seconds since its first round")
    ax.set_ylabel("iteration (s)")
    ax.set_title(f"{st.bandwidth_model}, trial 1: the link's rate halves, then comes back")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(img, "bandwidth.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def sync_section(out: str, img: str, st: Settings, plots: list[str]) -> tuple[list[str], dict]:
    table = Table(os.path.join(out, "sync.csv"), SYNC_FIELDS)
    lines = ["", "Per straggler setting and mode, median [min, max] over the trials: rank 0's "
             "(a fast worker's) time per iteration, its iterations and training seconds until "
             f"its parameters first reached {TARGET_ACCURACY} test accuracy (the parameters it "
             f"held every {st.sync_curve_every} of its steps, copied then and evaluated after "
             "training; an epoch is 22 steps), its final accuracy, the time to the target "
             "against BSP's in the same trial, and how many versions behind the server found an "
             "update on average (the version of its chunk then minus the version the gradient "
             "came from, over every worker's updates; ps-server's closing line).", "",
             "| stragglers | mode | ms per iteration | iterations to target | seconds to target "
             "| final accuracy | BSP's time to target / this mode's | versions behind |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    facts = {}
    for k in st.stragglers:
        bsp = {int(r["trial"]): r for r in table.select(stragglers=k, mode="bsp")}
        for mode in MODES:
            rows = table.select(stragglers=k, mode=mode)
            if not rows:
                continue
            reached = [r for r in rows if r["seconds_to_target"]]
            speed = [float(bsp[int(r["trial"])]["seconds_to_target"]) /
                     float(r["seconds_to_target"]) for r in reached
                     if int(r["trial"]) in bsp and bsp[int(r["trial"])]["seconds_to_target"]]
            steps = [float(r["steps_to_target"]) for r in reached]
            lines.append(
                f"| {k} | {mode} | {cell([float(r['iteration_s']) * 1000 for r in rows], '%.1f')}"
                f" | {cell(steps, '%.0f')} ({len(reached)}/{len(rows)} reached) | "
                f"{cell([float(r['seconds_to_target']) for r in reached], '%.2f')} | "
                f"{cell([float(r['final_accuracy']) for r in rows], '%.3f')} | "
                f"{cell(speed, '%.2fx')} | "
                f"{cell([float(r['staleness']) for r in rows], '%.2f')} |")
            facts[(k, mode)] = {"speed": statistics.median(speed) if speed else math.nan,
                                "staleness": statistics.median(float(r["staleness"])
                                                               for r in rows),
                                "steps": statistics.median(steps) if steps else math.nan,
                                "steps_range": (min(steps), max(steps)) if steps else None,
                                "reached": len(reached), "runs": len(rows)}
    png = plot_sync(out, img, st)
    if png:
        plots.append(png)
        lines += ["", f"![test accuracy against training time](evaluation/{os.path.basename(png)})"]
    return lines, facts


def trace_compute(model: str, link_gbps: float) -> float:
    """The trace's forward and backward compute, in emulated seconds at this link's scale."""
    total = sum(fwd + bwd for _, fwd, bwd, _ in trace_layers(model))
    return total * GPU_SCALE * scale_of(link_gbps)


def sync_models_section(out: str, st: Settings) -> list[str]:
    table = Table(os.path.join(out, "sync_models.csv"), SYNC_MODEL_FIELDS)
    if not table.rows:
        return ["", "(not run)"]
    rank, factor = SYNC_MODEL_STRAGGLER.split(",")
    # Every mode's run lasts the straggler's rounds (the job ends when every rank has run
    # them): the models left out are named with what one of its rounds computes.
    left_out = [f"{m} ({trace_compute(m, st.sweep_link) * float(factor):.1f} s)"
                for m in MODELS if m not in st.sync_models]
    lines = ["", f"The trace-driven trainer (section 1) under each mode: {WORKERS} ps-worker "
             f"processes, strict priority, the {st.sweep_link} Gbit/s scale of section 1 (every "
             f"time x{scale_of(st.sweep_link):g}), rank {rank} a {factor}x straggler (each of "
             f"its layers computes {factor} times longer), {st.sync_model_rounds} trace rounds, "
             "SSP with staleness_bound "
             f"{SSP_BOUND}, PS+ with staleness_lr {PSPLUS_RULE}. Per model and mode, median "
             "[min, max] over the trials of rank 0's (a fast worker's) iteration in emulated "
             "seconds (the mean of its trace rounds after the first: what they cost in all); "
             "the last columns: the straggler's own iteration under PS+, and how much less "
             "time PS+'s iteration takes than BSP's in the same trial."
             + (f" Every run lasts the straggler's {st.sync_model_rounds} rounds, in every "
                "mode; left out for the evaluation's time are the models whose straggler "
                "computes longest per round: " + ", ".join(left_out) + " (eval.py, "
                "SYNC_MODELS)." if left_out else ""),
             "",
             "| model | compute (the straggler's) | BSP | ASP | SSP | PS+ | the straggler under "
             "PS+ | PS+ against BSP: time per iteration saved |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for model in st.sync_models:
        by = {m: {int(r["trial"]): r for r in table.select(model=model, mode=m)} for m in MODES}
        if not any(by.values()):
            continue
        c = trace_compute(model, st.sweep_link)
        cells = [cell([float(r["iteration_mean_s"]) for r in by[m].values()]) if by[m] else "-"
                 for m in MODES]
        saved = [100 * (1 - float(by["psplus"][t]["iteration_mean_s"]) /
                        float(by["bsp"][t]["iteration_mean_s"]))
                 for t in by["psplus"] if t in by["bsp"]]
        strag = [float(r["straggler_iteration_mean_s"]) for r in by["psplus"].values()]
        lines.append(f"| {model} | {c:.3f} ({c * float(factor):.3f}) | {' | '.join(cells)} | "
                     f"{cell(strag) if strag else '-'} | "
                     f"{cell(saved, '%.0f %%') if saved else '-'} |")
    return lines


def plot_sync(out: str, img: str, st: Settings) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = Table(os.path.join(out, "sync_curves.csv"), CURVE_FIELDS)
    if not curves.rows:
        return ""
    ks = list(st.stragglers)
    fig, axes = plt.subplots(1, len(ks), figsize=(4.5 * len(ks), 3.6), squeeze=False)
    for ax, k in zip(axes[0], ks):
        for mode in MODES:
            rows = curves.select(stragglers=k, mode=mode, trial=1)
            if rows:
                ax.plot([float(r["seconds"]) for r in rows], [float(r["accuracy"]) for r in rows],
                        marker=".", label=mode)
        ax.axhline(TARGET_ACCURACY, color="black", linewidth=0.8, linestyle="--")
        ax.set_title(f"{k} straggler(s), trial 1")
        ax.set_xlabel("rank 0's training seconds")
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0, 1)
        ax.legend()
    fig.tight_layout()
    path = os.path.join(img, "sync.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ddp_section(out: str) -> tuple[list[str], dict]:
    table = Table(os.path.join(out, "ddp.csv"), DDP_FIELDS)
    by = {s: {int(r["trial"]): r for r in table.select(system=s)} for s in ["mercury", "ddp"]}
    if not by["mercury"]:
        return [], {}
    ratio = [float(by["ddp"][t]["iteration_s"]) / float(by["mercury"][t]["iteration_s"])
             for t in by["mercury"] if t in by["ddp"]]
    lines = ["", "| system | ms per iteration | images per second | final accuracy |",
             "| --- | --- | --- | --- |"]
    for s, label in [("mercury", "Mercury (mercury.torch, BSP, server-side momentum)"),
                     ("ddp", "DistributedDataParallel over gloo (torch's momentum SGD)")]:
        rows = list(by[s].values())
        lines.append(f"| {label} | {cell([float(r['iteration_s']) * 1000 for r in rows], '%.2f')}"
                     f" | {cell([float(r['images_per_s']) for r in rows], '%.0f')} | "
                     f"{cell([float(r['final_accuracy']) for r in rows], '%.3f')} |")
    lines += ["", f"DDP's time per iteration over Mercury's, per trial: {cell(ratio, '%.2fx')}."]
    return lines, {"ddp_over_mercury": statistics.median(ratio) if ratio else math.nan}


def resnet18_section(out: str) -> tuple[list[str], dict]:
    """The ResNet-18 table, and per Mercury variant the median over the trials of its
    images per second over DDP's (float32) and of its test accuracy less DDP's."""
    table = Table(os.path.join(out, "resnet18.csv"), RESNET18_FIELDS)
    by = {v: {int(r["trial"]): r for r in table.select(variant=v)}
          for v in resnet18_bench.VARIANTS}
    # The accuracy after the accuracy run's steps where it ran, else after the trials'.
    acc = {r["variant"]: (float(r["accuracy"]), int(r["steps"])) for r in
           Table(os.path.join(out, "resnet18_accuracy.csv"), RESNET18_ACCURACY_FIELDS).rows}
    ddp = {t: r for t, r in by["ddp"].items() if not r["not_run"]}
    if not any(by.values()):
        return [], {}
    lines = ["", "| variant | images per second | s per step | compute | communication | "
             "CPU bound | max(compute, communication, CPU bound) | step / bound | images per "
             "second over DDP's (per trial) | test accuracy after the trials' steps | test "
             "accuracy after the accuracy run's |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    facts = {}
    for v in resnet18_bench.VARIANTS:
        rows = list(by[v].values())
        if not rows:
            continue
        why = next((r["not_run"] for r in rows if r["not_run"]), "")
        if why:
            lines.append(f"| {RESNET18_LABEL[v]} | not run: {why} | | | | | | | | | |")
            continue

        def col(k: str, fmt: str = "%.3f") -> str:
            return cell([float(r[k]) for r in rows], fmt)
        over = [float(r["images_per_s"]) / float(ddp[t]["images_per_s"])
                for t, r in by[v].items() if t in ddp]
        lines.append(f"| {RESNET18_LABEL[v]} | {col('images_per_s', '%.1f')} | "
                     f"{col('step_s')} | {col('compute_s')} | {col('comm_s')} | "
                     f"{col('cpu_bound_s')} | {col('bound_s')} | "
                     f"{col('ratio_to_bound', '%.2f')} | "
                     f"{cell(over, '%.2fx')} | {col('accuracy')} | "
                     + (f"{acc[v][0]:.3f} ({acc[v][1]} steps)" if v in acc else "not run")
                     + " |")
        if v.startswith("mercury") and over:
            if v in acc and "ddp" in acc:
                gap, steps = acc[v][0] - acc["ddp"][0], acc[v][1]
            else:
                gap = statistics.median(float(r["accuracy"]) for r in rows) - \
                    statistics.median(float(r["accuracy"]) for r in ddp.values())
                steps = 0
            facts[v] = {"over_ddp": statistics.median(over), "accuracy_gap": gap,
                        "accuracy_steps": steps}
    return lines, facts


def resnet18_goals(facts: dict) -> list[str]:
    """The issue's ResNet-18 goals, each with its figure and whether it holds."""
    out = []
    for v, aim in [("mercury", 1.3), ("mercury_bf16", 1.5)]:
        if v in facts:
            x = facts[v]["over_ddp"]
            out.append(f"* ResNet-18, {WORKERS} workers: {RESNET18_LABEL[v]} >= {aim:g}x DDP's "
                       f"(float32) images per second: {x:.2f}x, "
                       + ("**met**" if x >= aim else "**not met**") + ".")
    if facts:
        gaps = ", ".join(f"{RESNET18_LABEL[v]} {100 * f['accuracy_gap']:+.1f} points"
                         for v, f in facts.items())
        held = all(abs(f["accuracy_gap"]) <= 0.01 for f in facts.values())
        steps = {f["accuracy_steps"] for f in facts.values()}
        after = (f"after {steps.pop()} steps, one run each" if len(steps) == 1 and 0 not in steps
                 else "after the trials' steps, medians")
        out.append("* ResNet-18: test accuracy after the same steps within 1 % of DDP's "
                   f"(float32; {after}): {gaps}, " + ("**met**" if held else "**not met**")
                   + ".")
    return out


def resnet18_text(st: Settings) -> str:
    return (
        "torchvision's ResNet-18 (random init, 10 classes) trained on the digits set upscaled "
        "to 32x32 (bilinear, the gray channel three times; nothing downloaded), batch 32 per "
        f"rank, momentum SGD (learning rate 0.05, momentum 0.9), {WORKERS} worker processes "
        "each on its own shard of the training set, "
        f"{st.resnet18_steps} timed steps after {st.resnet18_warmup} "
        "(`benchmarks/peers/resnet18_bench.py`, one rank is `resnet18_rank.py`): Mercury "
        "(mercury.torch, one ps-server with 2 shards over net_memif, the servers' momentum, "
        "BatchNorm buffers broadcast from rank 0) with float32 on the wire and with bfloat16 "
        "on the wire (`wire_dtype=torch.bfloat16`: float32 master parameters and momentum on "
        "the servers), against `DistributedDataParallel` over gloo on loopback TCP (torch's "
        "momentum SGD, buffers broadcast) in float32 and with its `bf16_compress_hook` and "
        "`fp16_compress_hook`, in a random order per trial. Per variant: images per second "
        f"({WORKERS} x 32 over the slowest rank's median step), the step against max(compute, "
        "communication, CPU bound), each measured on every rank at once before training, "
        f"once every rank has joined (forward and backward alone, median of "
        f"{st.resnet18_comm_rounds} steps; every parameter gradient's transfer alone, median "
        f"of {st.resnet18_comm_rounds} rounds; the slowest rank's; the CPU bound is the "
        "job's CPU time, every rank's process and the ps-server's, of one compute step and "
        "one communication round over the CPUs: where the ranks, the server and the "
        "communication threads share the CPUs, a step needs both), and rank 0's accuracy on the "
        "360 test images after the same steps, and after "
        f"{st.resnet18_accuracy_steps + st.resnet18_warmup} steps (20 epochs) in one more run "
        "of each variant (its accuracy run: the training is deterministic, so one run is its "
        "accuracy; at 4 epochs the digits are half learned and an accuracy moves by points "
        "with the rounding of the sums). A variant torch cannot run over gloo is listed "
        "as not run, with torch's error. `make eval` runs it with the rest "
        "(`eval.py --only resnet18` runs this experiment alone into the same records and "
        "rewrites the page from all of them).")


# Each experiment's parts in the order they run; a part is named after its function.
EXPERIMENTS = {"sched": [run_sched, run_timelines], "bandwidth": [run_bandwidth, run_shared],
               "sync": [run_sync, run_sync_models], "ddp": [run_ddp],
               "resnet18": [run_resnet18]}
PARTS = [run.__name__.removeprefix("run_") for runs in EXPERIMENTS.values() for run in runs]


def times_path(work: str) -> str:
    """Beside the CSVs: the wall seconds each part's runs took, summed over the
    invocations that ran them (a resumed evaluation adds to them)."""
    return os.path.join(work, "times.json")


def read_times(work: str) -> dict[str, float]:
    try:
        with open(times_path(work)) as f:
            return {k: float(v) for k, v in json.load(f).items()}
    except FileNotFoundError:
        return {}


def add_time(work: str, part: str, seconds: float) -> None:
    times = read_times(work)
    times[part] = times.get(part, 0.0) + seconds
    with open(times_path(work) + ".tmp", "w") as f:
        json.dump(times, f, indent=1, sort_keys=True)
    os.replace(times_path(work) + ".tmp", times_path(work))


def runs_time(out: str) -> str:
    """The wall time the runs took, in all and by part ('' when not recorded)."""
    times = read_times(out)
    if not times:
        return ""
    parts = ", ".join(f"{p.replace('_', ' ')} {times[p] / 60:.1f}" for p in PARTS if p in times)
    return f" The runs took {sum(times.values()) / 60:.1f} min of wall time ({parts})."


def runs_code(out: str) -> str:
    """Which code recorded the runs: one version for every CSV, or each CSV's."""
    codes = {name: v for name, v in sorted(read_codes(out).items())
             if os.path.exists(os.path.join(out, name))}
    if not codes:
        return "the code of its runs was not recorded"
    by_code: dict[tuple[str, ...], list[str]] = {}
    for name, v in codes.items():
        by_code.setdefault(tuple(v), []).append(name)
    if len(by_code) == 1:
        return "its runs by code " + " and ".join(next(iter(by_code)))
    return "its runs by code " + "; ".join(f"{' and '.join(v)} ({', '.join(names)})"
                                           for v, names in by_code.items())


def setting_lines(st: Settings, out: str) -> list[str]:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions = []
    for pkg in ["libdpdk"]:
        r = subprocess.run(["pkg-config", "--modversion", pkg], capture_output=True, text=True)
        versions.append(f"DPDK {r.stdout.strip() or '?'}")
    try:
        import torch
        versions.append(f"torch {torch.__version__}")
    except ImportError:
        pass
    git = code_version()
    return [f"* **Machine**: {os.cpu_count()} CPUs ({cpu}), "
            f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, Linux "
            f"{platform.release()}; {', '.join(versions)}; Python {platform.python_version()}; "
            f"page written by code {git} at "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} from the runs in its CSVs, "
            f"{runs_code(out)}.{runs_time(out)}",
            f"* **Trials**: {st.trials} per point, variants interleaved in a random order per "
            "trial; every figure is the median with [min, max].",
            f"* **Scaling**: the traces are this CPU's compute at batch 16 "
            f"(config/traces/); one accelerator for every model runs ResNet-50's step in 0.1 "
            f"s, so every trace is multiplied by {GPU_SCALE:.5f}. A link of R Gbit/s is "
            f"emulated at {LINK_EMULATED_GBPS:g} Gbit/s by the link emulator on every TX "
            f"queue (each worker's link and the server's port towards it), and compute is "
            f"multiplied by the same R / {LINK_EMULATED_GBPS:g} (x{scale_of(10):g} for 10 "
            f"Gbit/s, x{scale_of(25):g} for 25), so every ratio is the real link's and every "
            "time is that many times the real one (docs/link-emulator.md)."]


def verdict(holds: bool, *facts: dict) -> str:
    """Met only when it holds and every trial reached the target."""
    if holds and all(f["reached"] == f["runs"] for f in facts):
        return "**met**"
    return "**not met**"


def reached_note(f: dict, who: str = "PS+") -> str:
    """What a time-to-accuracy median leaves out: the trials that never got there."""
    if f["reached"] == f["runs"]:
        return ""
    return (f": the median is over the {f['reached']} of {f['runs']} trials in which {who} "
            f"reached the target; in the others it did not within the run")


def goals(sched: dict, sync: dict, ddp: dict, st: Settings,
          times: dict[str, float] | None = None) -> list[str]:
    """The issue's goals, each with its figure and whether it holds; `times`, the full
    evaluation's recorded wall time by part (read_times), judges its own duration."""
    out = []
    if sched:
        # The model where communication dominates: the largest communication / compute.
        link = st.sweep_link
        cands = {m: f for (l, m), f in sched.items() if l == link}
        if cands:
            model = max(cands, key=lambda m: cands[m]["comm_over_compute"])
            f = cands[model]
            out.append(f"* Strict priority >= 2x FIFO on the model where communication "
                       f"dominates ({model}, {link} Gbit/s): {f['fifo']:.3f}x, "
                       + ("**met**" if f["fifo"] >= 2 else "**not met**") + ".")
            out.append(f"* Strict priority >= 1.5x the best-tuned partitioning there: "
                       f"{f['best']:.3f}x, " + ("**met**" if f["best"] >= 1.5 else "**not met**")
                       + ".")
        slower = [f"{m} at {l}G ({f['fifo']:.2f}x FIFO, {f['best']:.2f}x best partition"
                  + (f", {f['fifo_chunk']:.2f}x FIFO with immediate aggregation"
                     if not math.isnan(f["fifo_chunk"]) else "") + ")"
                  for (l, m), f in sched.items()
                  if any(x < 1 - ITERATION_RESOLUTION_S / f["strict_s"] - 1e-9
                         for x in (f["fifo"], f["best"], f["fifo_chunk"]))]
        out.append("* Never slower than any baseline on any model (medians; a speed-up below "
                   "1x by at most the 1 ms to which an iteration is timed is a tie): "
                   + ("**met**." if not slower else "**not met**: " + "; ".join(slower) + "."))
        far = [f"{m} at {l}G ({f['ratio']:.3f})" for (l, m), f in sched.items()
               if f["ratio"] > 1.05]
        out.append("* Within 5 % of the lower bound max(compute, communication) on every "
                   "model: " + ("**met**." if not far else "**not met**: " + "; ".join(far) + "."))
        dep_far = [f"{m} at {l}G ({f['dep_ratio']:.3f})" for (l, m), f in sched.items()
                   if f["dep_ratio"] > 1.05]
        worst = max(sched.items(), key=lambda kv: kv[1]["dep_ratio"])
        out.append("* Within 5 % of the lower bound that also counts the layers' order "
                   "(section 1): " + (f"**met** (at most {worst[1]['dep_ratio']:.3f}, "
                                      f"{worst[0][1]} at {worst[0][0]}G)." if not dep_far else
                                      "**not met**: " + "; ".join(dep_far) + "."))
    if sync:
        k = 1 if 1 in st.stragglers else max(st.stragglers)  # one 4x straggler
        ps = sync.get((k, "psplus"), {})
        asp = sync.get((k, "asp"), {})
        if ps:
            if math.isnan(ps["speed"]):
                out.append(f"* PS+ >= 2x faster to the target accuracy than BSP with a 4x "
                           f"straggler: **not judged**: PS+ or BSP did not reach "
                           f"{TARGET_ACCURACY} in {st.sync_epochs} epochs in any trial.")
            else:
                out.append(f"* PS+ >= 2x faster to the target accuracy than BSP with a 4x "
                           f"straggler: {ps['speed']:.2f}x, "
                           + verdict(ps["speed"] >= 2, ps) + reached_note(ps) + ".")
        if ps and asp:
            if math.isnan(ps["steps"]) or math.isnan(asp["steps"]):
                out.append("* PS+ needs fewer iterations than ASP to the target: **not judged**: "
                           + ("PS+" if math.isnan(ps["steps"]) else "ASP")
                           + f" did not reach {TARGET_ACCURACY} in any trial.")
            else:
                (a, b), (c, d) = ps["steps_range"], asp["steps_range"]
                overlap = (f"; the trials' ranges overlap ([{a:.0f}, {b:.0f}] against "
                           f"[{c:.0f}, {d:.0f}]), so which median is lower changes from run "
                           "to run" if a <= d and c <= b else "")
                out.append(f"* PS+ needs fewer iterations than ASP to the target (with a 4x "
                           f"straggler): {ps['steps']:.0f} against {asp['steps']:.0f} "
                           f"(medians; rank 0's accuracy checked every {st.sync_curve_every} "
                           "steps: section 3), "
                           + verdict(ps["steps"] < asp["steps"], ps, asp)
                           + reached_note(ps) + reached_note(asp, "ASP") + overlap + ".")
    if ddp:
        v = ddp["ddp_over_mercury"]
        out.append(f"* mercury.torch faster per iteration than DDP over gloo on the same model: "
                   f"DDP takes {v:.2f}x Mercury's time, "
                   + ("**met**" if v > 1 else "**not met**") + ".")
    if times is not None and not st.quick:
        total = sum(times.values()) / 60
        missing = [p for p in PARTS if p not in times]
        out.append(f"* `make eval` under about {EVAL_AIM_MIN} minutes on this machine: "
                   + (f"**not judged**: the wall time of {', '.join(missing)} was not recorded."
                      if missing else f"{total:.1f} min of runs (the setting line has them by "
                      "part), " + ("**met**." if total <= EVAL_AIM_MIN else "**not met**.")))
    return out


def write_page(out: str, top: str, st: Settings) -> None:
    """Writes TOP/evaluation.md, its plots and a copy of the data in TOP/evaluation/."""
    page = os.path.join(top, "evaluation.md")
    img = os.path.join(top, "evaluation")
    os.makedirs(img, exist_ok=True)
    for name in ["sched.csv", "sweep.csv", "bandwidth.csv", "shared.csv", "sync.csv",
                 "sync_curves.csv", "sync_models.csv", "ddp.csv", "resnet18.csv",
                 "resnet18_accuracy.csv"]:
        if os.path.exists(os.path.join(out, name)) and \
                os.path.abspath(out) != os.path.abspath(img):
            shutil.copyfile(os.path.join(out, name), os.path.join(img, name))
    plots: list[str] = []
    sched_lines, sched = sched_section(out, img, st, plots)
    tl = plot_timelines(out, img)
    bandwidth_lines = bandwidth_section(out, img, st, plots)
    sync_lines, sync = sync_section(out, img, st, plots)
    ddp_lines, ddp = ddp_section(out)
    resnet18_lines, resnet18 = resnet18_section(out)
    text = [
        "# Evaluation",
        "",
        "Both papers' experiments on this machine, regenerated by `make eval` "
        "(`benchmarks/eval/eval.py`; this page, its data in `evaluation/*.csv` and its plots "
        "are its output, nothing here is typed in by hand). `make eval-quick` runs one small "
        "point of each experiment (the test `eval_quick`).",
        "",
        "## Setting",
        "",
        *setting_lines(st, out),
        "",
        "## Goals",
        "",
        *goals(sched, sync, ddp, st, read_times(out)),
        *resnet18_goals(resnet18),
        "",
        "## 1. Scheduling: strict priority against FIFO and partitioning (Mercury's experiment)",
        "",
        f"The trace-driven trainer (`ps-worker --trace`, docs/trace-trainer.md) on each "
        f"model's trace, {WORKERS} ps-worker processes and one ps-server (2 shards) over "
        "net_memif, BSP with the server's SGD; strict's runs measure the lower bound, "
        f"max(compute, communication), with {st.comm_rounds} burst and {st.comm_rounds} "
        f"streamed communication-only rounds ({st.comm_rounds_25} and {st.comm_rounds_25} at "
        f"25 Gbit/s; the other variants run none and are compared with strict's bound: "
        "their untimed trace round 1 is their warm-up, as it is strict's: the memif "
        "links' buffers are mapped in and read once at start, docs/net.md), "
        f"then runs {st.rounds} trace rounds and times "
        + ("round 2" if st.rounds == 2 else f"the median of rounds 2-{st.rounds}") +
        " (round 1, its backward pass alone, starts the pipeline: its forward pass would "
        "find every parameter in place, docs/trace-trainer.md; "
        "at 25 Gbit/s compute runs 12.5 times slower than real; the slowest "
        "rank's; `--verify none`: the tests check the aggregates, "
        "these runs only time them). The variants are the job file's `network.scheduler` "
        "and `training.aggregation` (docs/config.md): **strict** (Mercury: strict priority, "
        "each chunk's aggregate sent back as soon as its last packet is in); **FIFO** (a "
        "classical PS such as ps-lite: tensors in the order the backward pass produces them, "
        "and a tensor's aggregate sent back only once the whole tensor is aggregated, "
        "`aggregation: tensor`); **partition** (P3/ByteScheduler: partitions by priority "
        "under a credit, each partition's aggregate sent back once the whole partition is in) "
        f"at its defaults ({mib(DEFAULT_PARTITION[0])} / {mib(DEFAULT_PARTITION[1])}) and "
        "at the best setting of the sweep below for that model and link; and the ablation "
        "**FIFO, immediate aggregation** (FIFO order with Mercury's per-chunk aggregation), "
        "which separates what priority gives from what immediate aggregation gives.",
        *sched_lines,
        "",
        "One iteration of worker 0 under each scheduler "
        f"({st.timeline_model}, {st.sweep_link} Gbit/s, the timeline of docs/worker.md):",
        "",
        f"![one iteration per scheduler](evaluation/{os.path.basename(tl)})" if tl else
        "(no timeline run)",
        "",
        "## 2. Changing bandwidth",
        "",
        f"{st.bandwidth_model} at 10 Gbit/s as above, {st.bandwidth_rounds} trace rounds, "
        "while the link emulator halves every link's rate "
        f"{st.step_down_s:g} s after the job started and restores it at {st.step_up_s:g} s "
        "(the job file's `link.rate_steps`, docs/link-emulator.md): strict priority, FIFO, and "
        "partitioning with the setting the sweep chose at the full rate, not re-tuned. Per "
        "scheduler, the median iteration of the rounds wholly at each rate (worker 0's; rounds "
        "that may straddle a step are left out, and round 1, its backward pass alone), "
        "median [min, max] over the trials.",
        *bandwidth_lines,
        "",
        "### A second job on the same links",
        "",
        f"{st.shared_model} at 10 Gbit/s as above ({st.shared_rounds} trace rounds) while a "
        "second training job runs on the same wires: "
        f"{WORKERS} more ps-worker processes and another ps-server, strict priority, "
        f"{st.shared_other_model}'s trace, started first and stopped after the measured job "
        "ends. Every TX direction of the measured job (each worker's link to the server and "
        "the server's port towards each worker) is serialised on the same emulated wire as "
        "the second job's same direction (`link.shared_wire`, docs/link-emulator.md): one "
        "drop-tail FIFO at the line rate in front of both jobs' frames, as when two jobs "
        "share their hosts' NICs. Partitioning keeps the setting the sweep chose for the "
        "link alone; nothing is re-tuned. Per scheduler, median [min, max] over the trials: "
        "the measured job's iteration alone (its runs in section 1) and while sharing, and "
        "the second job's iteration over the same time (worker 0's trace rounds that ended "
        "while the measured job ran).",
        *shared_section(out, st),
        "",
        "## 3. Synchronisation: BSP, ASP, SSP and PS+ with stragglers (PS+'s experiment)",
        "",
        f"The digits CNN (`apps/train-digits`, docs/python.md) trained through mercury.torch "
        f"by {WORKERS} worker processes, local batch 16 (global 64), the server's SGD with "
        f"the learning rate scaled linearly with the batch an update averages: "
        f"{ASYNC_LR:g} for an ASP or SSP update (one worker's 16 images), "
        f"{ASYNC_LR * WORKERS:g} for BSP's (the global 64), and for PS+ the base rate "
        f"{ASYNC_LR * math.sqrt(WORKERS):g} under its rule lr / sqrt(1 + staleness) "
        f"(`staleness_lr: {PSPLUS_RULE}`): an update {WORKERS - 1} versions stale takes "
        f"ASP's step, a fresh one {math.sqrt(WORKERS):g}x it, so PS+'s steps are larger where "
        "its updates are fresher than ASP's (the table's last column; with lr / (1 + "
        "staleness) and base 0.4 the fresh updates at the end of a run, when "
        "the other workers have stopped, took 4x ASP's step and the model collapsed in the "
        "last epoch of most runs); no momentum; "
        f"rank 0 trains {st.sync_epochs} epochs and the job ends with them "
        "(`--end-with-rank0`: the other workers stop at their next step, so a straggler "
        "does not train on alone; the staleness column counts the updates until then); "
        "every step sleeps "
        f"{st.sync_compute_ms:g} ms standing for an accelerator's compute, and a straggler "
        "sleeps that times its factor: 1 straggler is rank 3 at 4x, 2 stragglers are rank 3 "
        f"at 4x and rank 2 at 2x. SSP with staleness_bound {SSP_BOUND}.",
        *sync_lines,
        "",
        "### The models, trace-driven, with one straggler",
        *sync_models_section(out, st),
        "",
        "## 4. Against DistributedDataParallel",
        "",
        f"The same digits training, no emulated compute, global batch 64 over {WORKERS} "
        f"processes, {st.ddp_epochs} epochs: Mercury (ps-server and mercury.torch) against "
        "`torch.nn.parallel.DistributedDataParallel` over gloo on loopback TCP "
        "(`train_digits.py --ddp`), interleaved; time per iteration = the median over "
        "epochs after the first of the epoch's time over its steps, on rank 0.",
        *ddp_lines,
        "",
        "## 5. ResNet-18 against DistributedDataParallel",
        "",
        resnet18_text(st),
        *resnet18_lines,
        "",
        "## Reading",
        "",
        *READING[:READING_SYNC_AT],
        *sync_reading(sync, st),
        *READING[READING_SYNC_AT:],
        "",
    ]
    with open(page, "w") as f:
        f.write("\n".join(text))
    print(f"eval: wrote {page} and {len(plots) + (1 if tl else 0)} plots in {img}", flush=True)


def sync_reading(sync: dict, st: Settings) -> list[str]:
    """The reading of section 3's digits table, from its medians (one 4x straggler)."""
    k = 1 if 1 in st.stragglers else max(st.stragglers)
    ps, asp = sync.get((k, "psplus")), sync.get((k, "asp"))
    if not ps or not asp:
        return []
    text = ("* **PS+ and ASP** do not wait for stragglers (BSP runs at the straggler's pace); "
            "their price is staleness. PS+'s "
            "workers are sent the newest versions as their links have room and compute from "
            "the newest they hold (mercury.torch marks what each module reads as its gradients' "
            "base, `Worker.mark_read`), so with a 4x straggler its updates reached the servers "
            f"{ps['staleness']:.2f} versions behind on average against ASP's "
            f"{asp['staleness']:.2f} (the table's last column), and its rule scales each "
            "step by that staleness.")
    if not math.isnan(ps["steps"]) and not math.isnan(asp["steps"]):
        (a, b), (c, d) = ps["steps_range"], asp["steps_range"]
        text += (f" It needed {ps['steps']:.0f} iterations to the target against ASP's "
                 f"{asp['steps']:.0f} (medians; ranges [{a:.0f}, {b:.0f}] and [{c:.0f}, "
                 f"{d:.0f}]), {100 * (1 - ps['steps'] / asp['steps']):.0f} % fewer; the PS+ "
                 "paper reports up to 37 % fewer, on larger models trained to convergence. "
                 f"Part of it is the step: under lr / sqrt(1 + staleness) with base "
                 f"{ASYNC_LR * math.sqrt(WORKERS):g}, an update fresher than {WORKERS - 1} "
                 f"versions takes a larger step than ASP's {ASYNC_LR:g}, and this page does "
                 "not separate the step from the freshness.")
    text += (" The time to the target is the first check at or above it, the usual "
             "definition, which flatters a noisy curve: BSP's (learning rate "
             f"{ASYNC_LR * WORKERS:g}, no momentum) crosses {TARGET_ACCURACY} and ends its "
             "epochs below it (the final-accuracy column).")
    return [text]


READING = [
    "* **Immediate aggregation** is half of the design: a classical PS sends a tensor back "
    "only once all of it is aggregated, so a large tensor's pull starts after its whole push "
    "and the two cannot overlap; per-chunk aggregation starts the pull of a chunk as soon as "
    "its last packet is in, so push and pull of the same tensor run at once in the two "
    "directions of the link. The column FIFO with immediate aggregation shows that half "
    "alone; what is left between it and strict is priority's.",
    "* **Where strict priority pays**: a model whose communication is comparable to its "
    "compute, with its large tensors late in the forward pass. The next forward pass needs "
    "the first layers first; FIFO returns them last (the backward pass produced them last), "
    "so the trainer waits for the whole model. Strict priority sends the first layers' "
    "packets before everything else in every queue, so the first layers compute while the "
    "rest is on the wire (the timeline shows the pulls ending first-layer first).",
    "* **Where priority cannot**: a model whose compute dwarfs its communication (every "
    "scheduler is at the bound), or whose communication dwarfs its compute: then strict "
    "priority and FIFO with immediate aggregation both sit near the communication time, "
    "since little compute is left to overlap, and the order of the tensors matters only for "
    "the first layers' wait. What the baselines lose there is store-and-forward: a classical "
    "PS cannot start a large tensor's pull before its whole push, and partitioning pays a "
    "start-up exchange per partition on top of its per-partition store-and-forward.",
    "* **The bound** max(compute, communication) assumes that all of one hides the other. "
    "It cannot when the two are close and the largest tensors are the last layers "
    "(AlexNet's classifier at 25 Gbit/s): the backward pass computes before the first "
    "gradient can leave, and the next forward pass needs the classifier's parameters, "
    "which the link carries last, so part of the compute stays outside the communication "
    "time whatever the order. The bound that counts the layers' order says by how much: "
    "layer i's gradient is ready once the backward pass has computed the layers from the "
    "last down to i; then the parameters of layer i and of every layer before it (all "
    "ready later) must cross the link before the forward pass reaches layer i, and the "
    "forward from layer i to the end follows. So no scheduler beats ready(i) + wire(layers "
    "0..i) + forward(layers i..end) for any i (the wire time is the payload alone at the "
    "line rate). Layer 0 gives compute plus one layer's transfer, the last layer the "
    "communication time; for AlexNet at 25 Gbit/s classifier.1 (62 % of the bytes) gives "
    "more than both, and strict priority is measured against it in the last column.",
    "* **What FIFO can lose**: when communication dominates, a classical PS takes about the "
    "communication time plus the pull of its largest tensor (which cannot start before the "
    "tensor's whole push ends) plus the compute it cannot overlap; strict priority takes "
    "about the communication time. For AlexNet, whose classifier.1 is 62 % of the bytes, "
    "that caps strict's speed-up over FIFO near 1.7x at any link rate where communication "
    "dominates; 2x needs a model whose compute and communication are close, so that FIFO "
    "also serialises the compute behind the transfer.",
    "* **Partitioning** needs its partition size and credit tuned per model and link; the "
    "sweep shows how much the setting matters. Strict priority has no knob.",
    "* **A second job on the links**: the wire is shared first come, first served, so "
    "priority orders only a job's own packets; each job still gets the layers it needs first "
    "out of its own share. Against a second strict job, strict priority keeps its lead over "
    "both baselines, and partitioning, tuned for the link alone, loses most: its start-up "
    "exchanges and per-partition store-and-forward leave its share of the wire idle, and the "
    "second job takes that time (the last column: the second job runs faster beside "
    "partitioning than beside strict).",
    "* **The modes on the models** (section 3, trace-driven): ASP keeps a fast worker at its "
    "own pace whatever the straggler does, since it sends a worker only the updates of its "
    "own pushes. SSP sends the same, a worker's answer held while the slowest clock holds "
    "the worker back (docs/server.md, \"SSP's answers\"): until a fast worker has used "
    "its bound's slack it runs at ASP's pace, then at the straggler's (AlexNet's rank 0: "
    "1.38 s per iteration from its 10th round on; the table's rounds 2-6 are still in the "
    "slack). PS+ also owes every worker the newest version of every chunk the others "
    "updated (the eager pull), paid at the lowest priority level as the worker's link has "
    "room, a version made meanwhile merging into the debt (docs/server.md, \"PS+'s eager "
    "pull\"): where compute leaves the links idle the workers get the versions at once; "
    "where the answers to the workers' own pushes fill the links (AlexNet) the versions "
    "wait and PS+ runs at ASP's pace. Sending every version as it was made, at the "
    "tensors' own levels, put up to four versions of the model per round on each downlink "
    "ahead of those answers: on AlexNet a fast worker's rounds that waited seconds for "
    "their parameters alternated with fast ones, so the table gives the mean of the "
    "rounds, which is what they cost, not their median, which showed only the fast ones.",
    "* **Against DDP**: for a model this small a step is a few round trips between "
    "processes on 2 CPUs, not arithmetic; the comparison says which system has less "
    "overhead per step, not which moves bytes faster (benchmarks/peers/README.md).",
    "* **ResNet-18 on 2 CPUs**: four ranks' compute and all of the communication's work "
    "(the server, the workers' net cores, gloo's threads) share the machine's two CPUs, so "
    "a step cannot be shorter than their busy CPU time over the CPUs (the CPU bound): "
    "communication that takes a fifth of DDP's time alone still costs CPU time that the "
    "ranks' compute needed: the table's CPU bound column says how much of each system's "
    "step that is, and the share of it that is communication's is where the two differ. "
    "On a cluster, where each rank has its own "
    "accelerator and the server its own cores, the bound is max(compute, communication), "
    "and that is where the faster communication shows; it was not run here.",
]

# sync_reading()'s bullet goes before this one.
READING_SYNC_AT = next(i for i, b in enumerate(READING)
                       if b.startswith("* **The modes on the models**"))

def runs_recorded(out: str, only: set[str]) -> int:
    """How many of the experiments' runs a resumed evaluation finds done (the progress
    lines' count and estimate are of the rest)."""
    def rows(name: str, fields: list[str]) -> list[dict]:
        return Table(os.path.join(out, name), fields).rows
    n = 0
    if "sched" in only:
        n += len(rows("sweep.csv", SWEEP_FIELDS)) + len(rows("sched.csv", SCHED_FIELDS)) + sum(
            os.path.exists(os.path.join(out, "timeline-%s.json" % v))
            for v in ["strict", "fifo", "partition"])
    if "bandwidth" in only:  # a run per (variant, trial); bandwidth.csv has a row per round
        n += len({(r["variant"], r["trial"]) for r in rows("bandwidth.csv", BANDWIDTH_FIELDS)})
        n += len(rows("shared.csv", SHARED_FIELDS))
    if "sync" in only:
        n += len(rows("sync.csv", SYNC_FIELDS)) + len(rows("sync_models.csv", SYNC_MODEL_FIELDS))
    if "ddp" in only:
        n += len(rows("ddp.csv", DDP_FIELDS))
    if "resnet18" in only:
        n += len(rows("resnet18.csv", RESNET18_FIELDS)) + \
            len(rows("resnet18_accuracy.csv", RESNET18_ACCURACY_FIELDS))
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default="", help="where the page goes: OUT/evaluation.md, its "
                    "plots and data in OUT/evaluation/ (default docs, or BUILD/eval-quick "
                    "with --quick)")
    ap.add_argument("--work", default="", help="where the runs are recorded as they end, "
                    "and resumed from (default BUILD/eval, or BUILD/eval-quick/runs)")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="one small point of every experiment")
    ap.add_argument("--only", default=",".join(EXPERIMENTS))
    ap.add_argument("--fresh", action="store_true", help="delete the recorded runs first")
    ap.add_argument("--page-only", action="store_true", help="rewrite the page from the CSVs")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    if a.trials < 1:
        ap.error("--trials must be at least 1")
    only = set(a.only.split(","))
    unknown = only - set(EXPERIMENTS)
    if unknown:
        ap.error(f"--only: unknown experiment(s) {sorted(unknown)} ({', '.join(EXPERIMENTS)})")
    if "resnet18" in only and not a.page_only:
        try:
            import torchvision  # noqa: F401
        except ImportError as e:
            sys.exit(f"eval: the ResNet-18 experiment needs Debian's python3-torchvision "
                     f"(.ci/setup installs it): {e}")
    st = Settings(a.quick, a.trials)
    top = os.path.abspath(a.out or (os.path.join(a.build, "eval-quick") if a.quick
                                    else os.path.join(ROOT, "docs")))
    out = os.path.abspath(a.work or (os.path.join(a.build, "eval-quick", "runs") if a.quick
                                     else os.path.join(a.build, "eval")))
    if a.fresh and os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out, exist_ok=True)
    for tool in ["apps/ps-demo", "apps/ps-server", "apps/ps-worker/ps-worker",
                 "lib/python/mercury"]:
        if not os.path.exists(os.path.join(a.build, tool)):
            sys.exit(f"eval: no {tool} in {a.build}: build first (make build)")
    if not a.page_only:
        n_sched = len(st.links[st.sweep_link]) * len(st.sweep) + 3 + \
            sum(len(ms) * len(st.variants(l)) for l, ms in st.links.items()) * st.trials
        n_sync = (len(st.stragglers) + len(st.sync_models)) * len(MODES) * st.trials
        total = (n_sched if "sched" in only else 0) + (n_sync if "sync" in only else 0) + \
            (2 * st.trials if "ddp" in only else 0) + \
            (6 * st.trials if "bandwidth" in only else 0) + \
            (len(st.resnet18_variants) * (st.trials + (st.resnet18_accuracy_steps > 0))
             if "resnet18" in only else 0)
        done = runs_recorded(out, only)
        progress = Progress(total - done)
        print(f"eval: {total - done} runs to go" + (f" ({done} recorded before, skipped)"
                                                    if done else "") + f", results in {out}",
              flush=True)
        if "bandwidth" in only and "sched" not in only and \
                not os.path.exists(os.path.join(out, "sweep.csv")):
            sys.exit("eval: the bandwidth experiment needs the sched experiment's sweep "
                     "(run sched first)")
        spent = {}
        for experiment, runs in EXPERIMENTS.items():
            if experiment not in only:
                continue
            for run in runs:
                part = run.__name__.removeprefix("run_")
                t0 = time.monotonic()
                try:
                    run(a, st, out, progress)
                finally:  # an interrupted part's runs stay recorded, and so does their time
                    spent[part] = time.monotonic() - t0
                    add_time(out, part, spent[part])
        print("eval: this invocation's wall time by part: " + ", ".join(
            f"{p.replace('_', ' ')} {s / 60:.1f} min" for p, s in spent.items()) +
            f"; {sum(spent.values()) / 60:.1f} min in all", flush=True)
    write_page(out, top, st)
    return 0


if __name__ == "__main__":
    sys.exit(main())
