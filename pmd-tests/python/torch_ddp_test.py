#!/usr/bin/python3
"""mercury.torch's DDP features against real jobs: ps-server and two PyTorch
worker processes over net_memif, a model with a BatchNorm layer and a module
that only the first micro-batch of each step uses.

With optimizer sum (the trainer's SGD): each step is two micro-batches, the
first inside no_sync(); the step's last backward() must leave in .grad the
rank-order average of the two ranks' accumulated gradients bit for bit (the
module used only by the first micro-batch included: its gradient from the
accumulating pass, not zeros), synchronize() then has nothing to wait for, a
second backward pass is refused without touching .grad, and step() without a
pass that pushed is refused; torch.cuda.amp.GradScaler's calls (on this CPU
machine a pass-through: it disables itself without CUDA) and clip_grad_norm_
go between backward() and optimizer.step(); buffers="average" makes every
BatchNorm statistic the ranks' average each step, starting from rank 0's.
The same script with its SGD handed to the servers' sgd under
update="at_step" gives the same parameters bit for bit (torch 1.13's CUDA
GradScaler, disabled here, passes step() through to the servers).
With the servers' optimizer (sgd): the script's torch SGD handed to the
servers and a StepLR halving its rate each step, backward_passes_per_step=2
and buffers="broadcast" give the same parameters as the reference's
arithmetic at each step's rate, and every rank's BatchNorm statistics are
rank 0's (with buffers="average", the ranks' average); state_dict() holds the servers' state; then a GradScaler's step and
a clip_grad_norm_ after the push are refused (the servers applied the
gradient as pushed; the errors name update="at_step"). Refused too: an
optimizer of another kind than the job's, a bad K, no_sync() with K > 1,
update="at_step" with sum.

Each worker computes what every step must produce from both ranks' data with
a reference copy of the model (the per-rank BatchNorm statistics emulated).

Usage: torch_ddp_test.py BUILD_DIR
(in worker mode: torch_ddp_test.py BUILD_DIR --worker JOB NODE OPTIMIZER)
"""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from torch_api_test import run_torch_job  # noqa: E402  (ps-server and two workers)
from worker_api_test import test_main  # noqa: E402

BUILD = None
LR = 0.125  # a power of two: lr * g is exact
STEPS = 3
CLIP = 0.5
# With the servers' optimizer: DistributedModel's buffers= (the test case sets it for
# the worker processes it starts).
BUFFERS = os.environ.get("TORCH_DDP_TEST_BUFFERS", "broadcast")
# With the servers' sgd: the sum script's steps (no_sync(), the GradScaler's calls,
# clip_grad_norm_) with its SGD handed to the servers under update="at_step".
AT_STEP = os.environ.get("TORCH_DDP_TEST_AT_STEP") == "1"


def make_model(torch):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(6, 5)
            self.bn = torch.nn.BatchNorm1d(5)
            self.fc2 = torch.nn.Linear(5, 3)
            self.extra = torch.nn.Linear(6, 3)  # only when asked: a gradient in one pass

        def forward(self, x, extra):
            h = self.fc2(torch.tanh(self.bn(self.fc1(x))))
            return h + self.extra(x) if extra else h

    torch.manual_seed(4)
    return Net()


def micro_batches(torch, rank, step):
    """Rank `rank`'s two micro-batches of `step`: (x, y, uses extra)."""
    g = torch.Generator().manual_seed(100 * step + rank)
    return [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g), j == 0)
            for j in range(2)]


def accumulate(torch, model, rank, step):
    """The gradient two micro-batches accumulate (each loss halved), as every rank does."""
    for x, y, extra in micro_batches(torch, rank, step):
        (torch.nn.functional.cross_entropy(model(x, extra), y) / 2).backward()


def buffers_of(model):
    return [b for b in model.buffers() if b.dtype.is_floating_point]


def worker_main(job, node, optimizer):
    import copy

    import torch

    import mercury
    import mercury.torch

    torch.set_num_threads(1)
    w = mercury.Worker(job, node)
    rank = w.rank
    net = make_model(torch)
    reference = copy.deepcopy(net)
    synced = list(net.parameters()) + buffers_of(net)
    if rank != 0:
        with torch.no_grad():
            for t in synced:
                t.fill_(7.0)  # version 0 must replace them with rank 0's

    def refused(what, make, text):
        try:
            make()
        except mercury.UsageError as e:
            assert text in str(e), (what, str(e))
        else:
            raise AssertionError(f"{what} was not refused")

    # The script of optimizer sum: its SGD local, or the servers' at step.
    script = optimizer == "sum" or AT_STEP
    local = torch.optim.SGD(net.parameters(), lr=LR) if script else None
    refused("K = 0", lambda: mercury.torch.DistributedModel(
        net, w, local, backward_passes_per_step=0), "backward_passes_per_step")
    refused("buffers='bogus'", lambda: mercury.torch.DistributedModel(
        net, w, local, buffers="bogus"), "buffers must be")
    refused("update='bogus'", lambda: w.declare("x", torch.zeros(3), update="bogus"),
            "update must be one of")
    refused("DistributedModel(update='bogus')", lambda: mercury.torch.DistributedModel(
        net, w, local, update="bogus"), "update must be one of")

    if optimizer == "sum":
        refused("update='at_step' with sum", lambda: mercury.torch.DistributedModel(
            net, w, local, update="at_step"), "is for a server-side optimizer")
        model = mercury.torch.DistributedModel(net, w, local, buffers="average")
    if AT_STEP:
        refused("update='at_step' with wire_dtype", lambda: mercury.torch.DistributedModel(
            net, w, local, update="at_step", wire_dtype=torch.bfloat16), "takes float32")
        model = mercury.torch.DistributedModel(net, w, local, buffers="average",
                                               update="at_step")
    if script:
        ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)
        scaler = torch.cuda.amp.GradScaler(enabled=False)  # what a CPU run of a DDP script gets
    elif optimizer != "sum":
        refused("a handed Adam under sgd", lambda: mercury.torch.DistributedModel(
            net, w, torch.optim.Adam(net.parameters())), "hand the servers a torch.optim.SGD")
        refused("a handed SGD with momentum under sgd", lambda: mercury.torch.DistributedModel(
            net, w, torch.optim.SGD(net.parameters(), lr=LR, momentum=0.5)), "use momentum")
        refused("two param groups", lambda: mercury.torch.DistributedModel(
            net, w, torch.optim.SGD([{"params": [net.fc1.weight]},
                                     {"params": [p for n, p in net.named_parameters()
                                                 if n != "fc1.weight"]}], lr=LR)),
                "2 param groups")
        opt = torch.optim.SGD(net.parameters(), lr=LR)  # what the DDP script made
        model = mercury.torch.DistributedModel(net, w, opt, backward_passes_per_step=2,
                                               buffers=BUFFERS)
        assert model.optimizer is opt
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        refused("no_sync() with K = 2", lambda: model.no_sync().__enter__(), "choose one")

    net.eval()  # in training mode BatchNorm counts even a pass without gradients
    with torch.no_grad():
        model(torch.zeros(2, 6), True)  # declare and start
    net.train()
    for a, b in zip(synced, list(reference.parameters()) + buffers_of(reference)):
        assert torch.equal(a, b), "version 0 is not rank 0's parameters and buffers"

    for step in range(STEPS):
        # The reference: both ranks' accumulated gradients, each from the step's
        # common buffers, and the BatchNorm statistics each rank ends with.
        start = [b.clone() for b in buffers_of(reference)]
        grads, stats = [], []
        for r in range(2):
            with torch.no_grad():
                for b, s in zip(buffers_of(reference), start):
                    b.copy_(s)
            reference.zero_grad()
            accumulate(torch, reference, r, step)
            grads.append([p.grad.clone() for p in reference.parameters()])
            stats.append([b.clone() for b in buffers_of(reference)])
        half = torch.tensor(0.5)
        average = [(g0 + g1) * half for g0, g1 in zip(*grads)]

        model.zero_grad()
        batches = micro_batches(torch, rank, step)
        if script:
            x, y, extra = batches[0]
            with model.no_sync():
                loss = torch.nn.functional.cross_entropy(model(x, extra), y) / 2
                scaler.scale(loss).backward()
            if step == 0:
                refused("step() after an accumulating pass", model.step, "without a backward")
            x, y, extra = batches[1]
            loss = torch.nn.functional.cross_entropy(model(x, extra), y) / 2
            scaler.scale(loss).backward()
            # DDP's contract: after backward() .grad is the average, bit for bit.
            for i, (p, want) in enumerate(zip(net.parameters(), average)):
                assert torch.equal(p.grad, want), f"step {step}: .grad {i} is not the average"
            model.synchronize()  # nothing in flight
            for b, s0, s1 in zip(buffers_of(net), *stats):
                assert torch.equal(b, (s0 + s1) * half), f"step {step}: buffers not averaged"
            if step == 0:
                before = [p.grad.clone() for p in net.parameters()]
                net.eval()  # a forward pass that leaves the BatchNorm statistics alone
                loss2 = torch.nn.functional.cross_entropy(model.module(x, extra), y)
                net.train()
                refused("a second backward pass", loss2.backward, "second gradient")
                for a, b in zip(net.parameters(), before):
                    assert torch.equal(a.grad, b), "a refused backward pass changed .grad"
            scaler.unscale_(local)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            scaler.step(local)
            scaler.update()
            local.zero_grad()
            with torch.no_grad():
                for p, g in zip(reference.parameters(), average):
                    p.grad = g
                ref_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), CLIP)
                assert torch.equal(norm, ref_norm), (norm, ref_norm)
                ref_opt.step()
                for b, s0, s1 in zip(buffers_of(reference), *stats):
                    b.copy_((s0 + s1) * half)
        else:
            for x, y, extra in batches:  # the model counts the passes
                (torch.nn.functional.cross_entropy(model(x, extra), y) / 2).backward()
            opt.step()  # the servers' (nothing applied here)
            sched.step()  # the next step's rate, sent before its first push
            with torch.no_grad():
                lr = torch.tensor(LR * 0.5 ** step)  # powers of two: the products are exact
                for p, g in zip(reference.parameters(), average):
                    p.copy_(p - lr * g)
                for b, s0, s1 in zip(buffers_of(reference), *stats):
                    # rank 0's on every rank, or the ranks' average
                    b.copy_(s0 if BUFFERS == "broadcast" else (s0 + s1) * half)
        model.synchronize()
        for i, (a, b) in enumerate(zip(net.parameters(), reference.parameters())):
            assert torch.equal(a, b), f"step {step}: parameter {i} differs from the reference"
        for i, (a, b) in enumerate(zip(buffers_of(net), buffers_of(reference))):
            assert torch.equal(a, b), f"step {step}: buffer {i} differs from the reference"
    if script:
        assert norm > CLIP, "clip_grad_norm_ never clipped: the test checks nothing"
    if AT_STEP:
        # A step ended without an update: state_dict() is refused before it ends (only
        # the saving rank would end it), skip_step() leaves every parameter as it was
        # (the servers applied nothing; the marker's NaNs would show), and the servers'
        # state is then at one step boundary.
        before = [p.detach().clone() for p in net.parameters()]
        x, y, extra = micro_batches(torch, rank, STEPS)[1]
        torch.nn.functional.cross_entropy(model(x, extra), y).backward()
        refused("state_dict() before step()", model.state_dict, "skip_step() first")
        model.skip_step()
        refused("a second skip_step()", model.skip_step, "without a backward pass")
        model.synchronize()
        for i, (a, b) in enumerate(zip(net.parameters(), before)):
            assert torch.equal(a, b), f"parameter {i} changed in a skipped step"
        servers = model.state_dict()["_extra_state"]["servers"]
        assert servers is not None and bytes(servers[:4].tolist()) == b"MSTA", \
            "no servers' state after a skipped step"
    elif optimizer != "sum":
        # The servers' state, as a checkpoint holds it: a job's state file.
        servers = model.state_dict()["_extra_state"]["servers"]
        assert servers is not None and servers.numel() > 64, "no servers' state in state_dict()"
        assert bytes(servers[:4].tolist()) == b"MSTA", "the state is not a state file"
        # What acts on the averaged gradient after backward() cannot act here: a last
        # step, scaled as a GradScaler scales it, is refused at the optimizer's step.
        sys.path.insert(0, os.path.join(ROOT, "apps", "train-digits"))
        from cpu_grad_scaler import CpuGradScaler

        scaler = CpuGradScaler(init_scale=2.0 ** 4)
        for x, y, extra in micro_batches(torch, rank, STEPS):
            scaler.scale(torch.nn.functional.cross_entropy(model(x, extra), y) / 2).backward()
        # The refusal names the option that makes both work.
        refused("a GradScaler's step", lambda: scaler.step(opt), 'update="at_step"')
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-6)
        refused("clip_grad_norm_ after the push", opt.step, 'update="at_step"')
    w.barrier()
    w.shutdown()
    print(f"{node}: every check passed", flush=True)


class TorchDdp(unittest.TestCase):
    def run_job(self, optimizer, **env):
        """The job, its worker processes given `env` (TORCH_DDP_TEST_* variables)."""
        os.environ.update(env)
        try:
            run_torch_job(self, __file__, BUILD, "pytorch-ddp-" + optimizer, optimizer, LR)
        finally:
            for name in env:
                del os.environ[name]

    def test_local_optimizer_with_sum(self):
        self.run_job("sum")

    def test_server_side_sgd(self):
        self.run_job("sgd")

    def test_server_side_sgd_at_step(self):
        """The sum script's steps, the SGD handed to the servers: the same parameters."""
        self.run_job("sgd", TORCH_DDP_TEST_AT_STEP="1")

    def test_server_side_sgd_averaging_the_buffers(self):
        self.run_job("sgd", TORCH_DDP_TEST_BUFFERS="average")


if __name__ == "__main__":
    test_main(sys.modules[__name__], worker_main)
