#!/usr/bin/python3
"""mercury.torch with half precision and staging, against real jobs: ps-server and two
PyTorch worker processes over net_memif (the job of worker_api_test.py), each case checking
every step's parameters (or averaged gradients) bit for bit against what it must be:

* `staged`: float32 parameters staged through mercury.staging's CpuStaging (host buffers
  of their own, copies on a side thread, each push when its copy completes, each layer's
  copy in awaited by its forward pre-hook), server-side sgd, with the link emulator
  losing 2 % of the frames: the same parameters as the unstaged path's arithmetic,
  p - lr * ((g0 + g1) * 1/2).
* `bf16_model`: a model converted to bfloat16, used in place (nothing converts on the
  worker): the servers' float32 master parameters (rank 0's widened, minus lr times the
  rank-order average of the widened bfloat16 gradients) rounded once to bfloat16.
* `wire_bf16`: float32 parameters with wire_dtype=torch.bfloat16 (DDP's bf16_compress_hook
  user): the gradients rounded into bfloat16 on the way out, the master parameters
  rounded into bfloat16 on the way back and widened into the float32 parameters.
* `wire_fp16_sum`: float32 parameters, wire_dtype=torch.float16, optimizer sum and a
  local SGD: .grad holds the float32 average of the float16 gradients rounded once to
  float16, widened.

Usage: torch_half_test.py BUILD_DIR
(in worker mode: torch_half_test.py BUILD_DIR --worker JOB NODE CASE)
"""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_api_test import batch, make_model, run_torch_job  # noqa: E402
from worker_api_test import test_main  # noqa: E402

BUILD = None
LR = 0.125
STEPS = 3
CASES = {"staged": "sgd", "bf16_model": "sgd", "wire_bf16": "sgd", "wire_fp16_sum": "sum"}


def worker_main(job, node, case):
    import copy

    import torch

    import mercury
    import mercury.staging
    import mercury.torch

    torch.set_num_threads(1)
    w = mercury.Worker(job, node)
    rank = w.rank
    net = make_model(torch)
    model_dtype = torch.bfloat16 if case == "bf16_model" else torch.float32
    wire = {"bf16_model": torch.bfloat16, "wire_bf16": torch.bfloat16,
            "wire_fp16_sum": torch.float16}.get(case, torch.float32)
    net = net.to(model_dtype)
    reference = copy.deepcopy(net)  # computes every rank's gradients
    # The servers' float32 master parameters: rank 0's values as they arrive (in the wire's
    # dtype), widened.
    master = [p.detach().to(wire).float() for p in net.parameters()]
    if rank != 0:
        with torch.no_grad():
            for p in net.parameters():
                p.fill_(7.0)
    local = None
    if case == "staged":
        model = mercury.torch.DistributedModel(net, w, staging="cpu")
        assert isinstance(model._staging, mercury.staging.CpuStaging), model._staging
    elif case == "bf16_model":
        model = mercury.torch.DistributedModel(net, w)
        assert model._staging is None, "a bfloat16 model on the CPU is used in place"
    elif case == "wire_bf16":
        model = mercury.torch.DistributedModel(net, w, wire_dtype=torch.bfloat16)
        assert isinstance(model._staging, mercury.staging.CpuStaging), model._staging
    else:
        local = torch.optim.SGD(net.parameters(), lr=LR)
        model = mercury.torch.DistributedModel(net, w, local, wire_dtype=torch.float16)

    # sum: the local SGD's parameters, replayed by torch's SGD on the averaged gradients.
    mirror = [torch.nn.Parameter(m.clone()) for m in master]
    mirror_opt = torch.optim.SGD(mirror, lr=LR)

    def expect_params(what):
        wants = [m.detach() for m in mirror] if local is not None else \
            [m.to(wire).to(model_dtype) for m in master]
        for a, want in zip(net.parameters(), wants):
            assert torch.equal(a.detach(), want), f"{case} {node}: {what}: parameters differ"

    model(batch(torch, rank, 0)[0].to(model_dtype))  # declares and starts
    model.synchronize()
    for p in net.parameters():  # declared in the wire's dtype
        assert w.dtype(model._keys[id(p)]) == str(wire).replace("torch.", ""), case
    expect_params("version 0")
    for step in range(STEPS):
        # The parameters this step computes with, read while no transfer is in
        # flight (the last step ended with synchronize()): once this rank's
        # backward pass has pushed, the next version may land in them at any time.
        with torch.no_grad():
            for r, q in zip(reference.parameters(), net.parameters()):
                r.copy_(q)
        model.zero_grad()
        x, y = batch(torch, rank, step)
        torch.nn.functional.cross_entropy(model(x.to(model_dtype)).float(), y).backward()
        # Every rank's gradient from the same parameters, in the wire's dtype, widened.
        grads = []
        for r in range(2):
            reference.zero_grad()
            xr, yr = batch(torch, r, step)
            torch.nn.functional.cross_entropy(reference(xr.to(model_dtype)).float(),
                                              yr).backward()
            grads.append([q.grad.to(wire).float() for q in reference.parameters()])
        avg = [(g0 + g1) * 0.5 for g0, g1 in zip(*grads)]
        if local is not None:
            mine = [p.grad.clone() for p in net.parameters()]
            for got, a in zip(mine, avg):
                assert torch.equal(got, a.to(wire).float()), \
                    f"{case} step {step}: .grad is not the average rounded once into {wire}"
            model.step()
            for m, a in zip(mirror, avg):
                m.grad = a.to(wire).float()
            mirror_opt.step()
        else:
            model.step()
            with torch.no_grad():
                for m, a in zip(master, avg):
                    m.copy_(m - torch.tensor(LR, dtype=torch.float32) * a)
        model.synchronize()
        expect_params(f"step {step}")
    w.barrier()
    w.shutdown()
    model.close()
    print(f"{node}: every check passed", flush=True)


class TorchHalf(unittest.TestCase):
    def run_case(self, case, extra=""):
        run_torch_job(self, __file__, BUILD, "pyhalf-" + case.replace("_", ""), CASES[case], LR,
                      extra_yaml=extra, argv_tail=[case])

    def test_staged_under_loss(self):
        self.run_case("staged", "link: {loss: 0.02, reorder: 0.01, seed: 9}\n")

    def test_bfloat16_model(self):
        self.run_case("bf16_model")

    def test_float32_parameters_bfloat16_on_the_wire(self):
        self.run_case("wire_bf16", "link: {loss: 0.02, seed: 4}\n")

    def test_float16_on_the_wire_with_a_local_optimizer(self):
        self.run_case("wire_fp16_sum")


if __name__ == "__main__":
    test_main(sys.modules[__name__], worker_main)
