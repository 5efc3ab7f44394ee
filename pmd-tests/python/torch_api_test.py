#!/usr/bin/python3
"""mercury.torch against real jobs: ps-server and two PyTorch worker processes
over net_memif, once with the server's optimizer (sgd) and once with a local
one (optimizer sum).

Each worker trains a small model for a few steps on data it can regenerate
for every rank, so it computes what every step must produce and checks the
parameters bit for bit: with sgd, the server's arithmetic
(p - lr * ((g0 + g1) * 1/2)); with sum, torch's SGD applied to the averaged
gradient the servers return. Halfway, model.set_lr() halves the rate: the
servers' (a versioned setting from that step's version on) or the local
optimizer's. It also checks what the integration refuses or
repairs: a first forward pass under no_grad, a second backward pass in one
step (UsageError), a backward pass that raised half-way (completed with
zeros at the next forward, with a warning), a parameter with no gradient
(zeros pushed), a dropped Handle whose temporary buffers must survive until
its transfer completes, and the timeline's trainer rows.

Usage: torch_api_test.py BUILD_DIR
(in worker mode: torch_api_test.py BUILD_DIR --worker JOB NODE)
"""
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from worker_api_test import JOB, test_main  # noqa: E402  (the two-worker memif job)

BUILD = None
LR = 0.125  # a power of two: lr * g is exact
STEPS = 4
SET_LR_AT = 2  # model.set_lr(LR / 2) before this step


def make_model(torch):
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def batch(torch, rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


def local_gradients(torch, model, rank, step):
    """Rank `rank`'s gradients at `step` from `model`'s parameters."""
    model.zero_grad()
    x, y = batch(torch, rank, step)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def worker_main(job, node, optimizer):
    import copy
    import gc
    import warnings

    import numpy as np
    import torch

    import mercury
    import mercury.torch

    torch.set_num_threads(1)
    w = mercury.Worker(job, node, timeline=os.path.join(os.path.dirname(job), "timeline"))
    rank = w.rank
    assert w.optimizer == optimizer
    net = make_model(torch)
    reference = copy.deepcopy(net)  # the parameters every step must produce
    if rank != 0:
        with torch.no_grad():
            for p in net.parameters():
                p.fill_(7.0)  # version 0 must replace them with rank 0's
    unused = torch.nn.Linear(2, 2)  # never called: its gradient is pushed as zeros
    model_with_unused = torch.nn.ModuleDict({"net": net, "unused": unused})

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model_with_unused

        def forward(self, x):
            return self.inner["net"](x)

    module = Wrapped()
    if optimizer == "sum":
        try:
            mercury.torch.DistributedModel(module, w)
            raise AssertionError("sum without a local optimizer was not refused")
        except mercury.UsageError as e:
            assert "local optimizer" in str(e), e
        local = torch.optim.SGD(module.parameters(), lr=LR)
        model = mercury.torch.DistributedModel(module, w, local)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)
    else:
        try:
            mercury.torch.DistributedModel(module, w, torch.optim.Adam(module.parameters()))
            raise AssertionError("an optimizer of another kind than the servers' was not refused")
        except mercury.UsageError as e:
            assert "hand the servers a torch.optim.SGD" in str(e), e
        model = mercury.torch.DistributedModel(module, w)
        # No optimizer handed: model.optimizer holds the job file's values.
        assert isinstance(model.optimizer, mercury.torch.ServerOptimizer), model.optimizer
        assert model.optimizer.param_groups[0]["lr"] == LR, model.optimizer.param_groups
    unused_before = [p.detach().clone() for p in unused.parameters()]

    with torch.no_grad():  # the first call (declare and start) under no_grad
        model(batch(torch, rank, 0)[0])
    for a, b in zip(net.parameters(), reference.parameters()):
        assert torch.equal(a, b), "version 0 is not rank 0's parameters"

    for step in range(STEPS):
        if step == SET_LR_AT:
            model.set_lr(LR * 0.5)  # the servers' rate from this step on (sum: the local one)
        lr = LR if step < SET_LR_AT else LR * 0.5
        model.zero_grad()
        x, y = batch(torch, rank, step)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if step == 0:
            try:
                loss.backward()  # graph freed: autograd raises before any hook
            except RuntimeError:
                pass
            loss2 = torch.nn.functional.cross_entropy(model.module(x), y)
            try:
                loss2.backward()  # a second backward pass in this step
                raise AssertionError("a second backward pass in one step was not refused")
            except mercury.UsageError as e:
                assert "second gradient" in str(e), e
        model.step()
        # What the step must have produced, from every rank's gradient.
        grads = [local_gradients(torch, reference, r, step) for r in range(2)]
        with torch.no_grad():
            for i, p in enumerate(reference.parameters()):
                avg = (grads[0][i] + grads[1][i]) * 0.5
                if optimizer == "sum":
                    p.grad = avg
                else:
                    p.copy_(p - torch.tensor(lr, dtype=torch.float32) * avg)
        if optimizer == "sum":
            for group in ref_opt.param_groups:
                group["lr"] = lr
            ref_opt.step()
        model.synchronize()
        for a, b in zip(net.parameters(), reference.parameters()):
            assert torch.equal(a, b), f"step {step}: parameters differ from the reference"

    # A backward pass that raises half-way: the next forward completes it with zeros.
    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.clone()

        @staticmethod
        def backward(ctx, g):
            raise RuntimeError("boom")

    model.zero_grad()
    x, y = batch(torch, rank, STEPS)
    # Boom is the first operation, so its backward comes last: the layers'
    # gradients are pushed before it raises, and the pass never ends.
    loss = torch.nn.functional.cross_entropy(model(Boom.apply(x.requires_grad_())), y)
    try:
        loss.backward()
        raise AssertionError("Boom did not raise")
    except RuntimeError as e:
        assert "boom" in str(e), e
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(x)
    assert any("did not finish" in str(c.message) for c in caught), [str(c.message) for c in caught]
    model.step()
    model.synchronize()
    if optimizer == "sgd":
        for a, b in zip(unused.parameters(), unused_before):
            assert torch.equal(a, b), "plain SGD moved a parameter whose gradient was zero"

    # A dropped handle keeps its temporary buffers until its transfer completes.
    key = w.key("inner.net.0.bias")
    w.push(key, np.full(5, 0.0, np.float32))  # handle and gradient dropped at once
    gc.collect()
    litter = [np.full(5, np.nan, np.float32) for _ in range(1000)]  # reuse freed memory
    w.pull(key).wait()
    declared = model._out[key].numpy()  # the parameters, or with sum the averaged gradient
    assert not np.isnan(declared).any(), "a dropped gradient's memory was freed and reused"
    del litter

    w.barrier()
    w.shutdown()
    print(f"{node}: every check passed", flush=True)


def run_torch_job(case, script, build, name, optimizer, lr, check=None, extra_yaml="",
                  argv_tail=None):
    """ps-server and two processes of `script` (BUILD --worker JOB NODE OPTIMIZER, or
    argv_tail's words instead of OPTIMIZER) on the two-worker job with `optimizer` (at
    learning rate `lr` unless sum) and `extra_yaml`'s lines: asserts on `case` that each
    exits 0 saying every check passed; check(tmp, node) runs then."""
    from mercury.launch import run_job

    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "job.yaml")
        text = JOB.format(name=name, tmp=tmp)
        text = text.replace("optimizer: sum", "optimizer: " + optimizer +
                            ("" if optimizer == "sum" else f", learning_rate: {lr}"))
        with open(job, "w") as f:
            f.write(text + extra_yaml)
        tail = argv_tail or [optimizer]
        lines = []
        status = run_job(
            job, lambda node, rank: [sys.executable, script, build, "--worker", job, node,
                                     *tail],
            server_bin=os.path.join(build, "apps", "ps-server"),
            echo=lambda node, line: lines.append(f"{node}: {line}"), timeout_s=120)
        out = "\n".join(lines)
        case.assertEqual(status, {"w0": 0, "w1": 0, "server0": 0}, out)
        for node in ("w0", "w1"):
            case.assertIn(f"{node}: {node}: every check passed", out)
            if check:
                check(tmp, node)


class TorchIntegration(unittest.TestCase):
    def run_job(self, optimizer):
        import json

        def timeline(tmp, node):
            with open(os.path.join(tmp, "timeline", node + ".json")) as f:
                events = json.load(f)["traceEvents"]
            rows = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
            tracks = {rows[e["tid"]] for e in events if e["ph"] == "X"}
            self.assertLessEqual({"forward", "backward", "inner.net.0.weight"}, tracks)
            if optimizer == "sgd":
                self.assertIn("wait", set(rows.values()))

        run_torch_job(self, __file__, BUILD, "pytorch-" + optimizer, optimizer, LR, timeline)

    def test_server_side_sgd(self):
        self.run_job("sgd")

    def test_local_optimizer_with_sum(self):
        self.run_job("sum")


if __name__ == "__main__":
    test_main(sys.modules[__name__], worker_main)
