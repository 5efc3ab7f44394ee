#!/usr/bin/python3
"""The digits job on CUDA tensors, checked exactly: ps-server and two worker processes
over net_memif, each training apps/train-digits' CNN through mercury.torch with its
parameters and batches on the GPU (mercury.staging's CudaStaging: pinned host buffers,
side streams, events), server-side sgd. GPU arithmetic is not the CPU's, so the check is
the servers' arithmetic replayed from what the ranks pushed: every rank records each
step's pushed gradients (its staging buffers) and its parameters after the step, and
every rank's parameters must be, bit for bit, rank 0's initial ones minus lr times the
rank-order average of the pushed gradients, step after step.

Where torch.cuda.is_available() is False it prints one line saying so and exits 0: the
CUDA path has then not run. `--device cpu` runs the same job and check on CPU tensors
through CpuStaging (what the machines Mercury is tested on can run).

Usage: cuda_check.py BUILD_DIR [--device cuda|cpu]
(in worker mode: cuda_check.py BUILD_DIR --worker JOB NODE DEVICE)
"""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "apps", "train-digits"))
from torch_api_test import run_torch_job  # noqa: E402

BUILD = None
DEVICE = "cuda"
LR = 0.0625
STEPS = 6
LOCAL_BATCH = 16


def worker_main(job, node, device):
    import torch

    import mercury
    import mercury.torch
    from train_digits import dataset, local_batches, make_model

    torch.set_num_threads(1)
    w = mercury.Worker(job, node)
    rank, workers = w.rank, w.workers
    x, y, _, _ = dataset()
    net = make_model().to(device)
    if rank != 0:
        with torch.no_grad():
            for p in net.parameters():
                p.fill_(7.0)  # version 0 replaces them
    model = mercury.torch.DistributedModel(net, w, staging=None if device == "cuda" else "cpu")
    batches = local_batches(rank, workers, 0, LOCAL_BATCH, len(y))
    model(torch.from_numpy(x[:1]).to(device))  # declares and starts
    model.synchronize()
    keys = [model._keys[id(p)] for p in net.parameters()]
    record = {"initial": [p.detach().cpu().clone() for p in net.parameters()], "steps": []}
    for k in range(STEPS):
        idx = batches[k]
        model.zero_grad()
        out = model(torch.from_numpy(x[idx]).to(device))
        torch.nn.functional.cross_entropy(out, torch.from_numpy(y[idx]).to(device)).backward()
        pushed = [model._grad[key].clone() for key in keys]  # the host buffers, as pushed
        model.step()
        model.synchronize()
        record["steps"].append((pushed, [p.detach().cpu().clone() for p in net.parameters()]))
    torch.save(record, os.path.join(os.path.dirname(job), node + ".pt"))
    w.barrier()
    w.shutdown()
    model.close()
    print(f"{node}: every check passed", flush=True)


def replay(tmp):
    """Problems with the two ranks' records against the servers' sgd, replayed."""
    import torch

    recs = [torch.load(os.path.join(tmp, f"w{r}.pt")) for r in range(2)]
    master = [t.clone() for t in recs[0]["initial"]]
    problems = []
    if any(not torch.equal(a, b) for a, b in zip(recs[1]["initial"], master)):
        problems.append("rank 1's version 0 is not rank 0's parameters")
    for k in range(STEPS):
        grads = [recs[r]["steps"][k][0] for r in range(2)]
        for i in range(len(master)):
            avg = (grads[0][i] + grads[1][i]) * 0.5
            master[i] = master[i] - torch.tensor(LR, dtype=torch.float32) * avg
        for r in range(2):
            if any(not torch.equal(a, m) for a, m in zip(recs[r]["steps"][k][1], master)):
                problems.append(f"step {k}: rank {r}'s parameters are not the servers' sgd")
    return problems


class CudaDigits(unittest.TestCase):
    def test_digits_exact(self):
        def check(tmp, node):
            if node == "w1":
                self.assertEqual(replay(tmp), [])

        run_torch_job(self, __file__, BUILD, "cudacheck-" + DEVICE, "sgd", LR, check,
                      argv_tail=[DEVICE])


def main():
    global BUILD, DEVICE
    BUILD = os.path.abspath(sys.argv[1])
    sys.path.insert(0, os.path.join(BUILD, "lib", "python"))
    if len(sys.argv) > 2 and sys.argv[2] == "--worker":
        worker_main(*sys.argv[3:])
        return 0
    if len(sys.argv) > 3 and sys.argv[2] == "--device":
        DEVICE = sys.argv[3]
    import torch

    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("cuda_check: SKIPPED, no CUDA device here (torch.cuda.is_available() is False): "
              "the CUDA staging path did not run")
        return 0
    result = unittest.main(module=sys.modules[__name__], argv=[sys.argv[0]], verbosity=2,
                           exit=False).result
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
