#!/usr/bin/python3
"""One rank of benchmarks/peers/resnet18_bench.py: torchvision's ResNet-18 (random init,
10 classes) trained on the digits set upscaled to 32x32 (3 channels, no download), batch
32 per rank, momentum SGD, either through Mercury (mercury.torch over the job's ps-server,
float32 or bfloat16 on the wire) or through DistributedDataParallel over gloo (float32, or
with bf16_compress_hook / fp16_compress_hook).

  resnet18_rank.py mercury --job FILE --node NAME --rank R --world N --wire float32|bfloat16
                   [common]
  resnet18_rank.py ddp --rank R --world N --port P [--hook none|bf16|fp16] [common]
  common: --steps S --warmup W --comm-rounds C --lr LR --momentum M

Rank R trains on its shard of the training set (samples R, R + N, ...), reshuffled every
epoch of 11 steps, as train_digits.py's workers do, in both systems. Once every rank has
joined (Mercury's start and barrier, gloo's barrier), it measures: the compute time of a
step (forward and backward of a copy of the bare model, no communication, median of C
steps after one, every rank at once, so 4 ranks share the CPUs as they do in training),
the communication time of a step (after a barrier, C rounds of every parameter
gradient's transfer with no compute: Mercury's push_pull of every parameter's tensor
(zeros: under momentum the parameters stay as they are), or gloo's all_reduce of every
gradient, issued at once and waited for), and over each of the two the job's CPU time per
step or round (each rank its process's, its communication threads included; rank 0 also
the ps-server's: the CPUs the ranks' compute and the communication both need), then W + S
training steps, each timed from its
forward pass to the end of its step, and the test accuracy after them (every rank
evaluates the same parameters). Prints one JSON line: {"rank", "compute", "comm",
"compute_cpu", "comm_cpu", "compute_cpu_server", "comm_cpu_server", "cpus", "steps":
[seconds], "accuracy", "error"}.
"""
import argparse
import copy
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "apps", "train-digits"))

LOCAL_BATCH = 32


def data(torch):
    """The digits set as 3 x 32 x 32 images (bilinear upscaling, the gray channel three
    times), train and test."""
    from train_digits import dataset

    x, y, xt, yt = dataset()

    def up(a):
        t = torch.nn.functional.interpolate(torch.from_numpy(a), size=(32, 32),
                                            mode="bilinear", align_corners=False)
        return t.repeat(1, 3, 1, 1).contiguous()
    return up(x), torch.from_numpy(y), up(xt), torch.from_numpy(yt)


def batch(local_batches, rank, world, n, k):
    """Rank `rank`'s k-th batch of the run: epoch k // steps per epoch."""
    per_epoch = (n // world) // LOCAL_BATCH
    return local_batches(rank, world, k // per_epoch, LOCAL_BATCH, n)[k % per_epoch]


def server_pid(job):
    """The pid of the ps-server serving `job` on this machine (its command line names the
    job file), or None."""
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"ps-server") and job.encode() in argv:
            return int(pid)
    return None


def cpu_s(pid=None):
    """CPU time in seconds, user and system, of every thread of this process (pid None:
    the trainer, its communication threads included) or of process `pid`."""
    if pid is None:
        return time.process_time()
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def accuracy(torch, model, xt, yt):
    model.eval()
    with torch.no_grad():
        acc = (model(xt).argmax(1) == yt).float().mean().item()
    model.train()
    return acc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("mercury", "ddp"))
    ap.add_argument("--job")
    ap.add_argument("--node")
    ap.add_argument("--wire", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--hook", default="none", choices=("none", "bf16", "fp16"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--comm-rounds", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    a = ap.parse_args()

    import torch
    import torchvision
    from train_digits import local_batches

    torch.set_num_threads(1)  # 4 ranks and a server share this machine's CPUs
    x, y, xt, yt = data(torch)
    torch.manual_seed(0)
    net = torchvision.models.resnet18(num_classes=10)
    bare = copy.deepcopy(net)  # for the compute alone: the wrapped model's hooks communicate
    f = torch.nn.functional
    out = {"rank": a.rank, "error": ""}

    def idx(k):
        return torch.from_numpy(batch(local_batches, a.rank, a.world, len(y), k))

    if a.mode == "mercury":
        import mercury
        import mercury.torch

        w = mercury.Worker(a.job, a.node)
        if w.rank != a.rank or w.workers != a.world:
            sys.exit("resnet18_rank: node %s is rank %d of %d, not %d of %d" %
                     (a.node, w.rank, w.workers, a.rank, a.world))
        wire = torch.bfloat16 if a.wire == "bfloat16" else None
        model = mercury.torch.DistributedModel(net, w, buffers="broadcast", wire_dtype=wire)
        model(x[:2])  # declares and starts: every rank holds rank 0's model
        model.synchronize()
        step = model.step
        sync = model.synchronize
        barrier = w.barrier
    else:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}",
                                rank=a.rank, world_size=a.world)
        model = DistributedDataParallel(net)
        if a.hook != "none":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            hook = (default_hooks.bf16_compress_hook if a.hook == "bf16"
                    else default_hooks.fp16_compress_hook)
            model.register_comm_hook(dist.group.WORLD, hook)
        opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=a.momentum)
        step = opt.step
        barrier = dist.barrier

        def sync():
            pass

    # Compute alone: forward and backward of the bare model, every rank at once; each rank
    # reads its process's CPU time over the block (barrier to barrier), rank 0 the
    # server's too.
    server = server_pid(a.job) if a.mode == "mercury" and a.rank == 0 else None

    def job_cpu_s():
        return cpu_s(), (cpu_s(server) if server else 0.0)
    barrier()
    cpu0 = job_cpu_s()
    times = []
    for k in range(a.comm_rounds + 1):
        i = idx(k)
        t0 = time.monotonic()
        bare.zero_grad()
        f.cross_entropy(bare(x[i]), y[i]).backward()
        times.append(time.monotonic() - t0)
    barrier()
    out["compute"] = statistics.median(times[1:])
    cpu1 = job_cpu_s()
    out["compute_cpu"] = (cpu1[0] - cpu0[0]) / (a.comm_rounds + 1)
    out["compute_cpu_server"] = (cpu1[1] - cpu0[1]) / (a.comm_rounds + 1)
    del bare

    # Communication alone: every parameter gradient's transfer, no compute (the
    # BatchNorm buffers Mercury broadcasts after each step are left out, as gloo's are).
    comm = []
    params = [p for p in net.parameters()]
    if a.mode == "mercury":
        buffers = {key for key, _ in model._buffer_keys}
        keys = [k for k in reversed(model._grad) if k not in buffers]
    else:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.hook, torch.float32)
        grads = [torch.zeros_like(p, dtype=dtype) for p in params]
    barrier()
    cpu0 = job_cpu_s()
    for _ in range(a.comm_rounds):
        barrier()
        t0 = time.monotonic()
        if a.mode == "mercury":
            hs = [w.push_pull(k, model._grad[k], model._out[k]) for k in keys]
            for h in hs:
                h.wait()
        else:
            works = [dist.all_reduce(g, async_op=True) for g in reversed(grads)]
            for wk in works:
                wk.wait()
        comm.append(time.monotonic() - t0)
    barrier()
    out["comm"] = statistics.median(comm)
    cpu1 = job_cpu_s()
    out["comm_cpu"] = (cpu1[0] - cpu0[0]) / a.comm_rounds
    out["comm_cpu_server"] = (cpu1[1] - cpu0[1]) / a.comm_rounds
    out["cpus"] = len(os.sched_getaffinity(0))
    if a.mode == "mercury":
        model.synchronize()

    # Training.
    steps = []
    for k in range(a.warmup + a.steps):
        i = idx(k)
        t0 = time.monotonic()
        model.zero_grad()
        f.cross_entropy(model(x[i]), y[i]).backward()
        step()
        if k >= a.warmup:
            steps.append(time.monotonic() - t0)
    sync()
    out["steps"] = steps
    out["accuracy"] = accuracy(torch, net, xt, yt)
    if a.mode == "mercury":
        w.barrier()
        w.shutdown()
        model.close()
    else:
        dist.barrier()
        dist.destroy_process_group()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
