#!/usr/bin/python3
"""One rank of PyTorch's gloo all_reduce over a model's tensor set, for
benchmarks/peers/peers_bench.py (which starts every rank and reads what they print).

  gloo_rank.py --rank R --world N --port P --model FILE --mode per_tensor|fused
               [--iters 10] [--warmup 3]

Every iteration: a barrier, then the gradients of every tensor summed across the
ranks, last layer first as a backward pass emits them: `per_tensor` calls
all_reduce once per tensor (issued asynchronously, then waited for, as DDP issues
its buckets), `fused` once over one flat buffer of all of them. The time of an
iteration is from the end of the barrier to the last completion. Each rank fills
its tensors with rank + 1 before each iteration, so the sum is n (n + 1) / 2 in
every element, exactly; the rank checks every element of every tensor.

Prints one JSON line: {"rank", "times": [seconds per timed iteration], "exact": bool}.
Runs on Debian's python3-torch (CPU, gloo), with /usr/bin/python3.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist

from model_file import read_model


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--mode", choices=["per_tensor", "fused"], required=True)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(a.port)
    dist.init_process_group("gloo", rank=a.rank, world_size=a.world)
    sizes = read_model(a.model, "gloo_rank")
    if a.mode == "fused":
        tensors = [torch.empty(sum(sizes), dtype=torch.float32)]
    else:
        tensors = [torch.empty(n, dtype=torch.float32) for n in sizes]
    want = float(a.world * (a.world + 1) // 2)
    times = []
    exact = True
    for it in range(a.warmup + a.iters):
        for t in tensors:
            t.fill_(float(a.rank + 1))
        dist.barrier()
        start = time.perf_counter()
        works = [dist.all_reduce(t, async_op=True) for t in reversed(tensors)]
        for w in works:
            w.wait()
        elapsed = time.perf_counter() - start
        exact = exact and all(bool(torch.all(t == want)) for t in tensors)
        if it >= a.warmup:
            times.append(elapsed)
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps({"rank": a.rank, "times": times, "exact": exact}), flush=True)


if __name__ == "__main__":
    main()
