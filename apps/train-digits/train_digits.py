#!/usr/bin/python3
"""train-digits: a real model trained through Mercury, end to end.

A small CNN learns scikit-learn's bundled digits set (1797 8x8 images, no
download) in 4 worker processes and one ps-server over shared memory, BSP,
with the optimizer the job file names applied by the server (mercury.torch).

    /usr/bin/python3 apps/train-digits/train_digits.py [--job config/digits.yaml]
        [--epochs N] [--batch B] [--target ACC] [--losses DIR]

launches the job (ps-server, then one worker process per worker node, each a
fork of this one, which loaded torch and the data once) and prints, per epoch,
the training loss, the test accuracy, the time and the images per second, then
a one-line verdict. Started by a launcher instead (srun, torchrun, mpirun, or
`python3 -m mercury.launch`), it is one worker of the job: the job file is
--job's, else $MERCURY_JOB, and the node $MERCURY_NODE's or the one the
launcher's rank maps to (docs/cluster.md), so it needs no Mercury argument:

    torchrun --standalone --nproc-per-node=4 apps/train-digits/train_digits.py \
        --job config/digits.yaml      (beside a ps-server started apart)

The other modes:

    --node wN        one worker of the job, named
    --single         the same training in this one process with the same global
                     batches and torch's optimizer of the same kind (the
                     reference the test compares the distributed loss curve with)
    --single --exact the job's arithmetic in one process: each worker's local
                     gradient, summed in rank order, times 1/W, and the server's
                     update formula (docs/agg.md), so every step's losses are
                     the distributed run's bit for bit
    --ddp            the same training with torch.nn.parallel.DistributedDataParallel
                     over gloo instead of Mercury: one process per worker node of
                     the job (on loopback TCP), torch's optimizer of the job's kind
                     on every rank (the peer a user would run instead)

For the evaluation (benchmarks/eval): --compute-ms MS sleeps MS milliseconds at the
start of every step, standing for an accelerator's forward and backward pass;
--straggler RANK,F (repeatable) makes that rank's sleep F times longer; --curve FILE
makes rank 0 write one CSV line per epoch: epoch, its steps so far, its training
seconds so far (evaluation excluded), the training loss and the test accuracy;
--curve-every K adds a line every K steps within the epochs, with the test accuracy
of the parameters rank 0 held then (evaluated after training) and no training loss;
--end-with-rank0 ends the job once rank 0 has trained its epochs: the other workers
stop at their next step (under asp, ssp and psplus a straggler would otherwise train
its own epochs on alone; under bsp every rank ends with rank 0 anyway).

Half precision on the wire: --wire-dtype bfloat16|float16 wraps the model with
DistributedModel(wire_dtype=...), as a DDP user of bf16_compress_hook would: the
float32 model's gradients travel rounded into that dtype, the servers keep float32
master parameters, and the parameters come back rounded once (docs/python.md, "Half
precision and staging").

A lost worker (docs/membership.md): --kill RANK,STEP makes that rank's process kill
itself (SIGKILL) right after the backward pass of its step STEP (counted from 0 over
the run), its gradients on their way to the servers; under asp, ssp and psplus the
others train their epochs on without it, and the launch counts that one death as
expected. With --losses, every worker also writes the wall-clock time at the end of
each of its steps to NODE.times, and the killed one the time of its death to
NODE.killed (what benchmarks/membership/survivors.py measures the survivors' loss
with). --max-restarts K starts a worker that died again (mercury.launch, at most K
times per worker; --kill acts in a worker's first process only): under asp, ssp and
psplus the new process joins the running job with every chunk's newest version and
goes on from step joined_version (the slowest rank's steps when it joined, from which
its pushes count) of its own batches, to the end of its epochs (docs/membership.md,
"Joining"); under bsp with training.on_worker_loss wait it joins at the step in
progress, joined_version. A spare worker of the job file (`spare: true`) is started with
the others and waits: once it takes a removed rank over it trains that rank's batches
from joined_version on, and a job that ends without needing it releases it (a line
"wN: released: ...", status 0; docs/membership.md, "Spare workers").

What a DDP script does around its optimizer (docs/python.md, "Moving from DDP"), the
same code under Mercury, --ddp and --single [--exact]: --accumulate K (K micro-batches
per step, no_sync() or with --backward-passes backward_passes_per_step=K), --lr LR and
--schedule (warm-up, then cosine: with a server-side optimizer the script's torch
optimizer, of the job's kind, is handed to the servers, which take its rate), --clip
NORM and --amp (bf16 autocast and a GradScaler) with training.optimizer sum (a local
optimizer, --local-optimizer KIND) or, with a server-side optimizer, --at-step
(DistributedModel(update="at_step"): the servers average, the script unscales, clips
or skips, its optimizer's step() sends the final gradient to the servers' optimizer;
--exact computes the same); --losses then also writes what the optimizer's
side did (clipped and skipped steps, the scale, the last learning rate) to NODE.steps.
--checkpoint FILE: rank 0 saves the model (under Mercury with the servers' state) and
that side (optimizer, scaler, schedule) after every epoch; --stop-after E stops after
epoch E as if interrupted; --resume FILE goes on from the file's epoch.

Data: the 1797 images, scaled to [0, 1], split once (seed 0) into 1437 for
training and 360 for testing. Worker r of W owns training samples r, r+W,
r+2W, ... (its shard) and reshuffles it every epoch; step k of an epoch is
every worker's k-th local batch of B/W images, and the global batch of step k
is those local batches in rank order, which is what --single trains on.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def load_job(job: str):
    """The job file through Mercury's C++ loader (mercury.load_job): the same
    checks and defaults as every other process of the job."""
    import mercury

    return mercury.load_job(job)


def digits() -> Tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (load_digits' images and targets), read from the file it
    ships: importing sklearn (scipy, joblib, ...) costs 0.8 s of CPU, and every worker
    process of a job pays it at once."""
    import gzip
    import importlib.util

    spec = importlib.util.find_spec("sklearn")  # locates the package, imports nothing
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz" \
        if spec and spec.submodule_search_locations else None
    if path is None or not path.exists():
        from sklearn.datasets import load_digits  # another layout: its own reader

        d = load_digits()
        return d.images, d.target
    with gzip.open(path) as f:
        data = np.loadtxt(f, delimiter=",")  # 64 pixels, then the digit, per line
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


@functools.lru_cache(maxsize=1)  # the launcher's copy is its forked workers'
def dataset() -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    images, target = digits()
    x = (images / 16.0).astype(np.float32)[:, None, :, :]  # N x 1 x 8 x 8
    y = target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    train, test = order[:1437], order[1437:]
    return x[train], y[train], x[test], y[test]


def make_model():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),    # 16 x 4 x 4
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 32 x 2 x 2
        nn.Flatten(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))


def local_batches(rank: int, workers: int, epoch: int, local: int, n: int) -> List[np.ndarray]:
    """Worker `rank`'s batches of `epoch`: indices into the training set."""
    shard = np.arange(rank, n, workers)
    shard = shard[np.random.default_rng(1000 * epoch + rank).permutation(len(shard))]
    steps = (n // workers) // local
    return [shard[k * local:(k + 1) * local] for k in range(steps)]


def local_optimizer(training: Dict, params):
    """The job's optimizer as torch runs it (for --single), or None (server-side)."""
    import torch

    kind = training.get("optimizer", "sgd")
    lr = float(training.get("learning_rate", 0.01))
    wd = float(training.get("weight_decay", 0.0))
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=wd)
    if kind == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=float(training.get("momentum", 0.9)),
                               weight_decay=wd)
    if kind in ("adam", "adamw"):
        return (torch.optim.AdamW if kind == "adamw" else torch.optim.Adam)(
            params, lr=lr, betas=(float(training.get("beta1", 0.9)),
                                  float(training.get("beta2", 0.999))),
            eps=float(training.get("epsilon", 1e-8)), weight_decay=wd)
    raise SystemExit(f"train-digits: --single cannot reproduce optimizer {kind!r}")


class ServerArithmetic:
    """The update the servers apply to each parameter (lib/agg/optimizer.h, docs/agg.md),
    one float32 operation at a time as the server rounds them: g = the local gradients
    summed in rank order, times 1/W; with weight decay wd (L2) g = g + wd * p; then
    sgd p = p - lr * g; momentum u = mu * u + g, p = p - lr * u; adam m = b1 * m +
    (1 - b1) * g, v = b2 * v + (1 - b2) * (g * g), p = p - (a * m) / (sqrt(v * c2) + eps)
    with a = lr / (1 - b1^t), c2 = 1 / (1 - b2^t) rounded once from double; adamw the
    same without the L2 term and p = p * (1 - lr * wd) before the step; sum writes g into
    each .grad, as the workers do with what the servers return. set() changes a
    hyperparameter from the next step on, as a versioned setting does on the servers."""

    KINDS = ("sgd", "momentum", "adam", "adamw", "sum")

    def __init__(self, training: Dict, params, workers: int) -> None:
        import torch

        self.kind = training.get("optimizer", "sgd")
        if self.kind not in self.KINDS:
            raise SystemExit(f"train-digits: --exact reproduces {', '.join(self.KINDS)}, "
                             f"not {self.kind}")
        self.params = list(params)
        self.inv_n = torch.tensor(1.0, dtype=torch.float32) / workers
        self.t = 0
        self.values: Dict[str, object] = {}
        self.set(learning_rate=training.get("learning_rate", 0.01),
                 momentum=training.get("momentum", 0.9),
                 weight_decay=training.get("weight_decay", 0.0),
                 beta1=training.get("beta1", 0.9), beta2=training.get("beta2", 0.999),
                 epsilon=training.get("epsilon", 1e-8))
        self.s0 = [torch.zeros_like(p) for p in self.params]  # momentum's u, Adam's m
        self.s1 = [torch.zeros_like(p) for p in self.params]  # Adam's v

    def set(self, **values: float) -> None:
        """Hyperparameters as the servers hold them: float32."""
        import torch

        for name, v in values.items():
            self.values[name] = torch.tensor(float(v), dtype=torch.float32)

    def step(self, grads_by_rank) -> None:
        import torch

        f32 = functools.partial(torch.tensor, dtype=torch.float32)
        h = self.values
        lr, wd = h["learning_rate"], h["weight_decay"]
        self.t += 1
        adam = self.kind in ("adam", "adamw")
        l2 = self.kind not in ("adamw", "sum") and float(wd) != 0.0
        decoupled = self.kind == "adamw" and float(wd) != 0.0
        if adam:
            one = f32(1.0)
            b1, b2 = h["beta1"], h["beta2"]
            a = f32(float(lr) / (1.0 - float(b1) ** self.t))
            c2 = f32(1.0 / (1.0 - float(b2) ** self.t))
            d = f32(1.0 - float(lr) * float(wd))
        with torch.no_grad():
            for i, p in enumerate(self.params):
                g = grads_by_rank[0][i].clone()
                for r in range(1, len(grads_by_rank)):
                    g = g + grads_by_rank[r][i]
                g = g * self.inv_n
                if self.kind == "sum":
                    p.grad = g
                    continue
                if l2:
                    g = g + wd * p
                if self.kind == "sgd":
                    p.copy_(p - lr * g)
                elif self.kind == "momentum":
                    self.s0[i] = h["momentum"] * self.s0[i] + g
                    p.copy_(p - lr * self.s0[i])
                else:
                    self.s0[i] = b1 * self.s0[i] + (one - b1) * g
                    self.s1[i] = b2 * self.s1[i] + (one - b2) * (g * g)
                    q = (a * self.s0[i]) / (torch.sqrt(self.s1[i] * c2) + h["epsilon"])
                    p.copy_((p * d if decoupled else p) - q)


class Recipe:
    """What a DDP training script does around its optimizer (--accumulate, --clip, --amp,
    --local-optimizer, --lr, --schedule): each step's batch in K micro-batches whose
    gradients accumulate, the loss scaled (a GradScaler; bf16 autocast of the forward
    pass), then, once the averaged gradient is in .grad, unscaled, clipped and applied by
    the trainer's optimizer, whose learning rate follows a warm-up and cosine schedule.
    The same code runs under Mercury, DDP and the one-process reference. Without those
    flags it is the plain step: one backward pass of the batch's loss."""

    def __init__(self, args, training: Dict, params, steps: int, optimizer: bool,
                 servers: bool = False) -> None:
        """optimizer: whether this process steps a torch optimizer (under Mercury, only
        with training.optimizer sum; then SGD at the job's rate unless told otherwise).
        servers: the servers apply the job's optimizer (under Mercury, or --exact's
        arithmetic); with --lr or --schedule the script still makes its torch optimizer,
        of the job's kind, and hands it to them: its learning rate, which the schedule
        drives, is theirs (DistributedModel's settings, ServerArithmetic.set)."""
        self.k = args.accumulate
        self.clip = args.clip
        self.amp = args.amp
        self.clipped = self.skipped = 0
        self.opt = self.scaler = self.sched = None
        if not optimizer and not (servers and (args.lr or args.schedule or args.at_step)):
            return
        kind = training.get("optimizer", "sgd")
        self.opt = local_optimizer(dict(training, optimizer=args.local_optimizer or (
            "sgd" if kind == "sum" else kind), learning_rate=args.lr or training.get(
                "learning_rate", 0.01)), params)
        if args.amp:
            from cpu_grad_scaler import CpuGradScaler

            # A scale that overflows at first and again after each growth: the steps
            # skipped, and the back-off, are part of what the runs must agree on.
            self.scaler = CpuGradScaler(init_scale=2.0 ** 127, growth_interval=8)
        if args.schedule:
            import warnings
            from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

            warm = max(1, steps // 10)
            warnings.filterwarnings("ignore", "The epoch parameter", UserWarning)
            self.sched = SequentialLR(self.opt, [
                LinearLR(self.opt, start_factor=0.1, total_iters=warm),
                CosineAnnealingLR(self.opt, T_max=steps - warm)], milestones=[warm])

    def backward(self, net, xb, yb) -> float:
        """One micro-batch's forward and backward pass; returns its loss."""
        import contextlib

        import torch
        import torch.nn.functional as F

        cast = torch.autocast("cpu", dtype=torch.bfloat16) if self.amp else \
            contextlib.nullcontext()
        with cast:
            loss = F.cross_entropy(net(torch.from_numpy(xb)), torch.from_numpy(yb))
        scaled = loss / self.k if self.k > 1 else loss
        (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        return loss.item()

    def step(self, params) -> None:
        """The optimizer's step on the averaged gradient in .grad, as a DDP script takes it."""
        import torch

        if self.scaler:
            self.scaler.unscale_(self.opt)
        if self.clip:
            norm = torch.nn.utils.clip_grad_norm_(params, self.clip)
            self.clipped += int(norm > self.clip)
        if self.scaler:
            before = self.scaler.get_scale()
            self.scaler.step(self.opt)
            self.scaler.update()
            self.skipped += int(self.scaler.get_scale() < before)
        else:
            self.opt.step()
        if self.sched:
            self.sched.step()
        self.opt.zero_grad()

    def server_values(self) -> Dict[str, float]:
        """The handed optimizer's hyperparameters as the servers name them (what
        DistributedModel sends before a step's first push)."""
        group = self.opt.param_groups[0]
        values = {"learning_rate": group["lr"], "weight_decay": group.get("weight_decay", 0.0)}
        if "momentum" in group:
            values["momentum"] = group["momentum"]
        if "betas" in group:
            values["beta1"], values["beta2"] = group["betas"]
        if "eps" in group:
            values["epsilon"] = group["eps"]
        return values

    def state_dict(self) -> Dict:
        """What a checkpoint holds of the optimizer's side."""
        return {"optimizer": self.opt.state_dict() if self.opt else None,
                "scaler": self.scaler.state_dict() if self.scaler else None,
                "schedule": self.sched.state_dict() if self.sched else None,
                "clipped": self.clipped, "skipped": self.skipped}

    def load_state_dict(self, state: Dict) -> None:
        for part, name in ((self.opt, "optimizer"), (self.scaler, "scaler"),
                           (self.sched, "schedule")):
            if (part is None) != (state[name] is None):
                raise SystemExit(f"train-digits: --resume: the checkpoint's {name} does not "
                                 "match this run's flags")
            if part is not None:
                part.load_state_dict(state[name])
        self.clipped, self.skipped = state["clipped"], state["skipped"]

    def summary(self) -> str:
        scale = self.scaler.get_scale() if self.scaler else 1.0
        lr = self.opt.param_groups[0]["lr"] if self.opt else 0.0
        return f"clipped {self.clipped} skipped {self.skipped} scale {scale:g} lr {lr:.9e}"


def evaluate(model, x: np.ndarray, y: np.ndarray, xt: np.ndarray, yt: np.ndarray):
    import torch
    import torch.nn.functional as F

    with torch.no_grad():
        loss = F.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y)).item()
        acc = (model(torch.from_numpy(xt)).argmax(1).numpy() == yt).mean()
    return loss, float(acc)


def compute_seconds(args, rank: int) -> float:
    """The emulated compute of one step on `rank` (--compute-ms, --straggler)."""
    return args.compute_ms / 1000.0 * args.slowdown.get(rank, 1.0)


def train(args, node: str = "") -> int:
    """One worker of the job (node set), one DDP rank (--ddp-rank) or the whole
    job in one process."""
    import torch

    torch.set_num_threads(1)  # 4 trainers and a server share this machine's CPUs
    job = load_job(args.job)
    workers = len(job.workers)
    if args.batch % workers:
        raise SystemExit(f"train-digits: --batch {args.batch} is not a multiple of the "
                         f"{workers} workers")
    local = args.batch // workers
    x, y, xt, yt = dataset()
    model = make_model()
    losses: List[float] = []
    checkpoint = None
    ddp = args.ddp_rank >= 0
    if args.resume:
        # As a DDP script resumes: every rank loads the same file before the job starts
        # (rank 0's parameters are version 0, so the others' would be replaced anyway).
        # Under Mercury the wrapped model's state (with the servers') is loaded below.
        checkpoint = torch.load(args.resume)
        if not node or ddp:
            model.load_state_dict(checkpoint["model"])

    summed = job.training.get("optimizer") == "sum"
    if not summed and (node or args.exact) and (
            args.local_optimizer or ((args.clip or args.amp) and not args.at_step)):
        raise SystemExit("train-digits: --clip and --amp act on the averaged gradient: under "
                         "Mercury they need training.optimizer sum (with --local-optimizer) or "
                         "--at-step (the servers' optimizer applied at the script's step)")
    if args.at_step and summed:
        raise SystemExit("train-digits: --at-step goes with a server-side optimizer, not sum")
    steps_per_epoch = (len(y) // workers) // local
    servers = not summed and ((node and not ddp) or args.exact)
    recipe = Recipe(args, job.training, model.parameters(), args.epochs * steps_per_epoch,
                    optimizer=summed or ddp or (not node and not args.exact), servers=servers)
    if checkpoint:
        recipe.load_state_dict(checkpoint["recipe"])
    if node:
        import mercury
        import mercury.torch

        worker = mercury.Worker(args.job, node)
        net = mercury.torch.DistributedModel(
            model, worker, recipe.opt,
            backward_passes_per_step=args.accumulate if args.backward_passes else 1,
            update="at_step" if args.at_step else "per_chunk",
            wire_dtype=None if args.wire_dtype == "float32" else getattr(torch, args.wire_dtype))
        if checkpoint:
            # The module's parameters and the servers' state: the job resumes from them.
            net.load_state_dict(checkpoint["model"])
        # The job starts at the first forward pass (the declarations, every worker joined,
        # version 0 in the parameters): run one without gradients before the clock starts,
        # so that no rank's training time holds another's start-up.
        try:
            with torch.no_grad():
                net(torch.from_numpy(x[:1]))
        except mercury.SpareReleased as e:
            # A spare worker the job ended without needing (docs/membership.md,
            # "Spare workers"): no failure.
            print(f"{node}: released: {e}", flush=True)
            worker.shutdown()
            return 0
        # A spare's rank is the one it took over, known once the job took it in.
        rank = worker.rank
        if worker.spare:
            print(f"{node}: spare, took over rank {rank}", flush=True)
        if net.joined_version is not None:
            # A new process of a removed rank joined the running job: it goes on from the
            # step it joined at (the slowest rank's; under bsp, with on_worker_loss wait,
            # the step in progress), where its pushes count from.
            joined_step = min(net.joined_version, args.epochs * steps_per_epoch)
            print(f"{node}: joined the running job at version {net.joined_version}: "
                  f"going on from step {joined_step} (epoch {joined_step // steps_per_epoch + 1}"
                  f", batch {joined_step % steps_per_epoch})", flush=True)
            checkpoint = checkpoint or {}
            checkpoint["epoch"] = joined_step // steps_per_epoch
            checkpoint["skip"] = joined_step % steps_per_epoch
    elif ddp:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        rank, worker = args.ddp_rank, None
        node = f"w{rank}"
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.ddp_port}",
                                rank=rank, world_size=workers)
        net = DistributedDataParallel(model)  # averages the local gradients: BSP's g
    else:
        rank, worker = 0, None
        if args.exact:
            server = ServerArithmetic(job.training, model.parameters(), workers)
            if args.at_step:
                # The servers average into .grad; the script's step() applies their
                # optimizer to the final .grad as rank 0 pushes it (x 1/1).
                server = ServerArithmetic(dict(job.training, optimizer="sum"),
                                          model.parameters(), workers)
                apply = ServerArithmetic(job.training, model.parameters(), 1)

                def step_on_the_servers(closure=None):
                    recipe.opt._step_count = getattr(recipe.opt, "_step_count", 0) + 1
                    apply.set(**recipe.server_values())  # as sent before the step's pushes
                    apply.step([[p.grad for p in model.parameters()]])

                recipe.opt.step = step_on_the_servers
        net = model
    rank_losses: List[List[float]] = [[] for _ in range(workers)]  # --exact

    quiet = node and rank != 0
    compute_s = compute_seconds(args, rank)
    curve: List[Tuple] = []  # (epoch, steps, seconds, training loss or None, test accuracy)
    snapshots: List[Tuple] = []  # --curve-every: (epoch, steps, seconds, parameters)
    every = args.curve_every if args.curve and not quiet else 0
    trained_s = 0.0  # training time so far, evaluation excluded
    # --end-with-rank0: a flag in memory every fork of the launcher shares.
    rank0_done = getattr(args, "rank0_done", None) if node and not ddp else None
    step_ends: List[float] = []  # --losses: time.time() at the end of every step
    t_start = time.monotonic()
    first_epoch = checkpoint["epoch"] if checkpoint else 0
    skip = checkpoint.get("skip", 0) if checkpoint else 0  # a joined process's first epoch
    done_steps = first_epoch * steps_per_epoch
    epochs = 0  # trained in this run
    for epoch in range(first_epoch, args.epochs):
        if rank0_done is not None and rank != 0 and rank0_done.value:
            break
        t0 = time.monotonic()
        batches = [local_batches(r, workers, epoch, local, len(y)) for r in range(workers)]
        steps = len(batches[0])
        for k in range(steps):
            if rank0_done is not None and rank != 0 and rank0_done.value:
                break
            if k < skip:
                continue  # trained before this process joined
            if compute_s > 0:
                time.sleep(compute_s)
            if every and k > 0 and (done_steps + k) % every == 0:
                # The parameters this rank holds after done_steps + k steps, copied once
                # they have all arrived (what the coming forward pass waits for anyway:
                # the wait overlapped the compute above, as every step's does) and
                # evaluated after training, so evaluating takes nothing from any rank.
                if node and not ddp:
                    net.synchronize()
                with torch.no_grad():
                    snapshots.append((epoch + 1, done_steps + k,
                                      trained_s + time.monotonic() - t0,
                                      [p.detach().clone() for p in model.parameters()]))
            if args.exact:
                grads = []
                for r in range(workers):
                    model.zero_grad()
                    for part in np.array_split(batches[r][k], recipe.k):
                        rank_losses[r].append(recipe.backward(model, x[part], y[part]))
                    grads.append([p.grad.clone() for p in model.parameters()])
                if not summed and recipe.opt and not args.at_step:
                    server.set(**recipe.server_values())  # the step's settings, as sent
                server.step(grads)  # with sum: the averaged gradient into .grad
                if summed or args.at_step:
                    recipe.step(list(model.parameters()))
                elif recipe.sched:
                    recipe.sched.step()
                continue
            idx = batches[rank][k] if node else np.concatenate([b[k] for b in batches])
            net.zero_grad()
            parts = [idx] if recipe.k == 1 else np.array_split(idx, recipe.k)
            for j, part in enumerate(parts):
                # The first K-1 micro-batches only accumulate (DDP's no_sync(); with
                # --backward-passes the model counts the passes itself).
                accumulating = j + 1 < len(parts) and (node or ddp) and not args.backward_passes
                with net.no_sync() if accumulating else contextlib.nullcontext():
                    losses.append(recipe.backward(net, x[part], y[part]))
            if node and not ddp and not summed and not recipe.opt:
                net.step()  # the servers' optimizer: nothing to do, the next forward waits
            else:
                # A handed optimizer's step() is the servers' (nothing applied here); its
                # schedule moves the rate the next step's settings carry.
                recipe.step(list(model.parameters()))
            if node and args.kill and args.kill[0] == rank and args.kill[1] == done_steps + k \
                    and not os.environ.get("MERCURY_RESTART") and not worker.spare:
                # A lost worker: its pushes of this step are on their way (the hooks
                # handed them to the net core during the backward pass).
                if args.losses:
                    os.makedirs(args.losses, exist_ok=True)
                    with open(os.path.join(args.losses, f"{node}.killed"), "w") as f:
                        f.write(f"{time.time():.6f}\n")
                os.kill(os.getpid(), signal.SIGKILL)
            step_ends.append(time.time())
        skip = 0
        if node and not ddp:
            net.synchronize()  # the epoch's last update is in the parameters
        secs = time.monotonic() - t0
        trained_s += secs
        done_steps += steps
        epochs += 1
        if not quiet:
            train_loss, acc = evaluate(model, x, y, xt, yt)
            curve.append((epoch + 1, done_steps, trained_s, train_loss, acc))
            print(f"epoch {epoch + 1:3d}/{args.epochs}: train loss {train_loss:.4f}  "
                  f"test accuracy {acc:.4f}  {secs:6.2f} s  "
                  f"{steps * args.batch / secs:8.0f} images/s", flush=True)
        if args.checkpoint and rank == 0:
            # A DDP script's checkpoint: the model and the optimizer's side, after the
            # epoch's last update (written whole, then renamed over the last one).
            # Under Mercury the wrapped model's: the servers' state with the module's.
            torch.save({"epoch": epoch + 1,
                        "model": (net if node and not ddp else model).state_dict(),
                        "recipe": recipe.state_dict()}, args.checkpoint + ".tmp")
            os.replace(args.checkpoint + ".tmp", args.checkpoint)
        if epoch + 1 == args.stop_after:
            break

    if rank0_done is not None and rank == 0:
        rank0_done.value = 1
    total = time.monotonic() - t_start
    train_loss, acc = evaluate(model, x, y, xt, yt)
    if args.losses:
        os.makedirs(args.losses, exist_ok=True)
        # --exact writes each emulated worker's losses as that worker would.
        curves = {f"w{r}": rank_losses[r] for r in range(workers)} if args.exact else \
            {node or "single": losses}
        if node:
            np.savetxt(os.path.join(args.losses, f"{node}.times"), np.array(step_ends),
                       fmt="%.6f")
        for name, curve in curves.items():
            np.savetxt(os.path.join(args.losses, f"{name}.txt"), np.array(curve), fmt="%.9e")
            with open(os.path.join(args.losses, f"{name}.result"), "w") as f:
                f.write(f"{acc:.6f} {train_loss:.9e} {total:.3f}\n")
            if recipe.opt:  # what the optimizer's side did: the same on every rank
                with open(os.path.join(args.losses, f"{name}.steps"), "w") as f:
                    f.write(recipe.summary() + "\n")
    if args.curve and not quiet:
        probe = make_model()
        for e, n, secs, params in snapshots:
            with torch.no_grad():
                for p, v in zip(probe.parameters(), params):
                    p.copy_(v)
                acc = (probe(torch.from_numpy(xt)).argmax(1).numpy() == yt).mean()
            curve.append((e, n, secs, None, float(acc)))
        with open(args.curve, "w") as f:
            for e, n, secs, loss, acc in sorted(curve, key=lambda c: c[1]):
                f.write(f"{e},{n},{secs:.4f},{'' if loss is None else '%.6f' % loss},"
                        f"{acc:.4f}\n")
    if ddp:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    if worker is not None:
        worker.barrier()  # nobody leaves before every rank has its last version
        s = worker.stats()
        worker.shutdown()
        if not quiet:
            drops = {"chunks": s["chunks_dropped"], "control": s["control_dropped"], **s["drops"]}
            print(f"{node}: {s['pushes']} pushes, {s['retransmits']} retransmissions, drops: "
                  + (" ".join(f"{k}={v}" for k, v in drops.items() if v) or "none")
                  + (f"; {s['workers_removed']} workers removed from the job"
                     if s["workers_removed"] else "")
                  + (f"; {s['workers_joined']} workers joined the job"
                     if s["workers_joined"] else ""), flush=True)
    if not quiet:
        verdict = "PASS" if acc >= args.target else "FAIL"
        print(f"train-digits: {verdict}: test accuracy {acc:.4f} (target {args.target:g}) after "
              f"{epochs} epochs in {total:.1f} s ({total / max(epochs, 1):.2f} s per epoch), "
              f"{workers} workers" + ("" if node else " emulated in one process") +
              (" (DDP over gloo)" if ddp else ""), flush=True)
    return 0 if acc >= args.target else 1


def launch(args) -> int:
    if args.ddp:
        script = [sys.executable, str(Path(__file__).resolve()), "--job", args.job,
                  "--epochs", str(args.epochs), "--batch", str(args.batch),
                  "--compute-ms", str(args.compute_ms), "--target", str(args.target)]
        for spec in args.straggler:
            script += ["--straggler", spec]
        script += recipe_flags(args)
        if args.losses:
            script += ["--losses", args.losses]
        if args.curve:
            script += ["--curve", args.curve, "--curve-every", str(args.curve_every)]
        return launch_ddp(args, script)
    import torch  # noqa: F401  (here, once: every worker is a fork of this process)
    from mercury.launch import run_job

    if args.end_with_rank0:
        import multiprocessing

        args.rank0_done = multiprocessing.RawValue("b", 0)  # shared with every fork

    dataset()

    def echo(node: str, line: str) -> None:
        # Rank 0's progress speaks for the job, each server's closing line (its
        # aggregations, drops and the staleness of its updates) for the servers;
        # any process's trouble is shown.
        if node == "w0" and line.startswith(("epoch", "train-digits", "w0:")):
            print(line, flush=True)
        elif ": stopped; " in line or "removed from the job" in line or \
                "joined the running job" in line or " took over " in line or \
                ": released: " in line:
            print(line, flush=True)
        elif "rror" in line or "FAIL" in line or "Traceback" in line:
            print(f"{node}: {line}", flush=True)

    print(f"train-digits: {args.job}: ps-server and one trainer process per worker, "
          f"{args.epochs} epochs, global batch {args.batch}", flush=True)
    # Each worker is a fork of this process that runs train(): torch and the data are
    # loaded once, not by every worker at once (4 processes on this machine's 2 CPUs
    # took about 4 s to get there).
    status = run_job(args.job, worker_main=lambda node, rank: train(args, node),
                     server_bin=str(args.server), echo=echo, survive_worker_loss=bool(args.kill),
                     max_restarts=args.max_restarts)
    # --kill: that worker's death is the point (when it is not started again).
    killed = f"w{args.kill[0]}" if args.kill else None
    failed = {n: s for n, s in status.items() if s != 0 and not (n == killed and s == -9)}
    for n, s in failed.items():
        print(f"train-digits: {n} exited with status {s}", file=sys.stderr)
    return 1 if failed else 0


def recipe_flags(args) -> List[str]:
    """The command line of the Recipe's and the checkpoints' flags, for the processes
    --ddp starts."""
    flags = ["--accumulate", str(args.accumulate)]
    for name in ("clip", "local_optimizer", "lr", "checkpoint", "stop_after", "resume"):
        if getattr(args, name):
            flags += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    return flags + [f for f, on in (("--amp", args.amp), ("--schedule", args.schedule)) if on]


def launch_ddp(args, script: List[str]) -> int:
    """One DDP process per worker node of the job, rank 0's progress shown."""
    import socket
    import subprocess

    workers = len(load_job(args.job).workers)
    with socket.socket() as s:  # a free port for gloo's rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"train-digits: {args.job}: DistributedDataParallel over gloo, {workers} processes, "
          f"{args.epochs} epochs, global batch {args.batch}", flush=True)
    procs = [subprocess.Popen([*script, "--ddp-rank", str(r), "--ddp-port", str(port)],
                              stdout=None if r == 0 else subprocess.DEVNULL)
             for r in range(workers)]
    status = [p.wait() for p in procs]
    for r, rc in enumerate(status):
        if rc != 0:
            print(f"train-digits: DDP rank {r} exited with status {rc}", file=sys.stderr)
    return 1 if any(status) else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job", default=None,
                   help="the job file (default: $MERCURY_JOB, else config/digits.yaml)")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch", type=int, default=64, help="global batch (default 64)")
    p.add_argument("--losses", default="", help="write each process's per-step losses here")
    p.add_argument("--node", default="",
                   help="run as this worker of the job (default under a launcher: the one its "
                        "rank maps to)")
    p.add_argument("--single", action="store_true", help="train in this one process")
    p.add_argument("--exact", action="store_true",
                   help="with --single: the servers' arithmetic, bit for bit")
    p.add_argument("--build", default=str(ROOT / "build"), help="Mercury's build directory")
    p.add_argument("--ddp", action="store_true",
                   help="train with DistributedDataParallel over gloo instead of Mercury")
    p.add_argument("--ddp-rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--ddp-port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--compute-ms", type=float, default=0.0,
                   help="sleep this long at the start of each step (emulated compute)")
    p.add_argument("--straggler", action="append", default=[], metavar="RANK,F",
                   help="that rank's emulated compute is F times longer (repeatable)")
    p.add_argument("--curve", default="", help="rank 0 writes its per-epoch curve here (CSV)")
    p.add_argument("--target", type=float, default=0.95,
                   help="the test accuracy the verdict and the exit status ask for (default 0.95)")
    p.add_argument("--curve-every", type=int, default=0, metavar="K",
                   help="with --curve: also the test accuracy of rank 0's parameters every K "
                        "steps")
    p.add_argument("--accumulate", type=int, default=1, metavar="K",
                   help="each step's local batch in K micro-batches: the first K-1 backward "
                        "passes inside no_sync() accumulate, the last one pushes the sum")
    p.add_argument("--backward-passes", action="store_true",
                   help="with --accumulate: DistributedModel(backward_passes_per_step=K) "
                        "instead of no_sync()")
    p.add_argument("--clip", type=float, default=0.0, metavar="NORM",
                   help="clip_grad_norm_ of the averaged gradient before the optimizer's step")
    p.add_argument("--amp", action="store_true",
                   help="bf16 autocast of the forward pass and loss scaling with a GradScaler "
                        "(on CPU, cpu_grad_scaler.CpuGradScaler): the averaged gradient is "
                        "unscaled before clipping, a step whose gradient overflowed is skipped")
    p.add_argument("--at-step", action="store_true",
                   help="with a server-side optimizer: DistributedModel(update='at_step'), so "
                        "--clip and --amp act on the averaged gradient before the servers' "
                        "optimizer applies the result")
    p.add_argument("--local-optimizer", choices=("sgd", "momentum", "adam", "adamw"),
                   help="the trainer's optimizer under training.optimizer sum (default sgd)")
    p.add_argument("--lr", type=float, default=0.0,
                   help="its learning rate (default: the job's, else 0.01)")
    p.add_argument("--schedule", action="store_true",
                   help="warm-up over the first tenth of the steps, then cosine annealing of "
                        "that learning rate")
    p.add_argument("--checkpoint", default="", metavar="FILE",
                   help="rank 0 saves the model and the optimizer's side here after every "
                        "epoch (torch.save)")
    p.add_argument("--stop-after", type=int, default=0, metavar="E",
                   help="stop after epoch E of --epochs (as if interrupted)")
    p.add_argument("--resume", default="", metavar="FILE",
                   help="every rank loads this checkpoint and goes on from its epoch")
    p.add_argument("--end-with-rank0", action="store_true",
                   help="end the job once rank 0 has trained its epochs (the others stop at "
                        "their next step)")
    p.add_argument("--wire-dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="under Mercury: the dtype the gradients and parameters travel in "
                        "(DistributedModel(wire_dtype=...); the servers keep float32)")
    p.add_argument("--kill", default="", metavar="RANK,STEP",
                   help="that rank kills itself (SIGKILL) after the backward pass of its step "
                        "STEP: a lost worker (asp, ssp, psplus go on without it)")
    p.add_argument("--max-restarts", type=int, default=0, metavar="K",
                   help="start a worker that died again, at most K times per worker "
                        "(mercury.launch): under asp, ssp and psplus it joins the running job")
    args = p.parse_args()
    if args.max_restarts < 0:
        p.error("--max-restarts must not be negative")
    if args.epochs < 1 or args.batch < 1:
        p.error("--epochs and --batch must be positive")
    if args.compute_ms < 0:
        p.error("--compute-ms must not be negative")
    if not 0 <= args.target <= 1:
        p.error("--target is a test accuracy, in [0, 1]")
    if args.curve_every < 0:
        p.error("--curve-every must not be negative")
    if args.curve_every and not args.curve:
        p.error("--curve-every needs --curve (the file the points go to)")
    args.slowdown = {}
    for spec in args.straggler:
        try:
            r, f = spec.split(",")
            args.slowdown[int(r)] = float(f)
        except ValueError:
            p.error(f"--straggler {spec!r}: expected RANK,F (e.g. 3,4)")
        if args.slowdown[int(r)] < 1:
            p.error(f"--straggler {spec!r}: F must be at least 1")
    if args.kill:
        try:
            args.kill = tuple(int(v) for v in args.kill.split(","))
            if len(args.kill) != 2 or args.kill[0] < 1 or args.kill[1] < 0:
                raise ValueError
        except ValueError:
            p.error(f"--kill {args.kill!r}: expected RANK,STEP with RANK >= 1 (rank 0 reports "
                    "the job) and STEP >= 0")
        if args.ddp or args.single or args.ddp_rank >= 0:
            p.error("--kill goes with a Mercury job, not --ddp or --single")
    else:
        args.kill = ()
    if args.straggler and args.compute_ms <= 0:
        p.error("--straggler needs --compute-ms (the compute it slows down)")
    if args.end_with_rank0 and (args.ddp or args.single or args.node or args.ddp_rank >= 0):
        p.error("--end-with-rank0 goes with the launched job (its workers share the flag): "
                "not with --ddp, --single or --node")
    if args.ddp and (args.single or args.node):
        p.error("--ddp runs the job's workers itself: not with --single or --node")
    if args.wire_dtype != "float32" and (args.ddp or args.single or args.at_step):
        p.error("--wire-dtype goes with a Mercury job without --at-step (which takes float32 "
                "parameters in place), not --ddp or --single")
    if args.accumulate < 1 or args.accumulate > args.batch:
        p.error("--accumulate K needs 1 <= K <= the batch")
    if args.backward_passes and (args.accumulate < 2 or args.ddp or args.ddp_rank >= 0):
        p.error("--backward-passes goes with --accumulate K > 1, under Mercury")
    if args.clip < 0 or args.lr < 0:
        p.error("--clip and --lr must not be negative")
    if not 0 <= args.stop_after < args.epochs:
        p.error("--stop-after E needs 0 < E < --epochs")
    if args.resume and args.exact:
        p.error("--resume goes with a run that keeps a torch optimizer, not --exact")
    build = Path(args.build)
    args.server = build / "apps" / "ps-server"
    # The build tree's mercury package, unless it is installed (pip install .).
    if (build / "lib" / "python" / "mercury").is_dir():
        sys.path.insert(0, str(build / "lib" / "python"))
    import mercury

    under_launcher = not args.single and not args.ddp and args.ddp_rank < 0 and \
        (args.node or os.environ.get("MERCURY_NODE") or mercury.launcher() is not None)
    if args.job is None:
        args.job = os.environ.get("MERCURY_JOB") or str(ROOT / "config" / "digits.yaml")
    if args.ddp_rank >= 0:
        return train(args)
    if args.exact and not args.single:
        p.error("--exact goes with --single")
    if args.single:
        return train(args)
    if under_launcher:
        # One worker of the job: the node named, or the one the launcher's rank maps to.
        job, node, how = mercury.identify(args.job, args.node or None)
        args.job = job.source
        if not args.node:
            print(f"train-digits: worker {node} of {job.source} ({how})", flush=True)
        return train(args, node)
    if not args.server.exists():
        p.error(f"no ps-server in {build}/apps: build first (make build) or pass --build")
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
