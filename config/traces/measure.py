#!/usr/bin/python3
"""Measures per-layer forward and backward compute times of torchvision models
on this machine's CPU, for the trace-driven trainer (ps-worker --trace).

  /usr/bin/python3 config/traces/measure.py [--batch 16] [--reps 7] [--warmup 2]
      [--threads 2] [--out config/traces] MODEL...
  /usr/bin/python3 config/traces/measure.py --table      # README rows from the traces

A layer is a module that directly owns parameters; its tensors must be the next
lines of config/models/<MODEL>.txt, in order (the script stops with the first
name that differs). Random weights (weights=None: nothing is downloaded), train
mode, cross-entropy loss on random labels, float32.

  forward   a forward post-hook per layer stamps the clock; a layer's forward
            time is the gap since the previous layer's hook (since the start
            of the pass for the first), so the parameterless operations
            between layers (ReLU, pooling, additions) count towards the next
            layer; the tail after the last layer (flatten, the loss) towards
            the last.
  backward  a hook on every parameter fires when autograd has produced its
            gradient (what a data-parallel trainer pushes at: DDP hooks the
            same place); a layer's backward ends when the last of its
            gradients is ready, and its time is the gap since the previous
            layer's end in the order they happened (since loss.backward()
            began for the first, so the loss's backward counts towards the
            last layer). Module backward hooks (register_full_backward_hook)
            are not used: they wrap each module's output, and torchvision's
            in-place ReLUs and residual additions on those outputs are an
            error under them.

Each repetition is one hooked training step (forward then backward) and one
plain one, interleaved; per-layer times are medians over the hooked steps, the
whole-pass times medians over the plain ones. The script prints both and the
ratio of the per-layer sums to the whole passes (hooks cost a few us each).
"""
import argparse
import datetime
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "models")

# Input side per model: Inception-v3 is defined for 299x299.
INPUT_SIDE = {"inception_v3": 299}


def fail(msg):
    sys.exit("measure.py: " + msg)


def model_tensors(name):
    """(tensor name, element count) of config/models/<name>.txt, in line order."""
    path = os.path.join(MODELS, name + ".txt")
    out = []
    with open(path) as f:
        for line in f:
            words = line.split("#", 1)[0].split()
            if words:
                out.append((words[0], int(words[1])))
    return path, out


def build(name, torchvision):
    ctor = getattr(torchvision.models, name, None)
    if ctor is None:
        fail("torchvision has no model '%s'" % name)
    kwargs = {"weights": None}
    # config/models/ lists inception_v3 and googlenet without their auxiliary
    # classifiers (284 and 173 tensors): measure the same network.
    if name in ("inception_v3", "googlenet"):
        kwargs["aux_logits"] = False
        kwargs["init_weights"] = True
    return ctor(**kwargs)


def layers_of(model, name):
    """[(layer name, module, [(tensor name, parameter)])] in registration order,
    checked against the model file: concatenated, their tensors must be its
    lines exactly."""
    path, expected = model_tensors(name)
    layers = []
    for mname, m in model.named_modules():
        own = list(m.named_parameters(recurse=False))
        if own:
            layers.append((mname, m, [(mname + "." + p if mname else p, t) for p, t in own]))
    got = [(t, p.numel()) for _, _, ts in layers for t, p in ts]
    for i in range(max(len(got), len(expected))):
        g = got[i] if i < len(got) else ("<none>", 0)
        e = expected[i] if i < len(expected) else ("<none>", 0)
        if g != e:
            fail("%s: tensor %d is %s (%d elements) in torchvision, %s (%d) in %s"
                 % (name, i + 1, g[0], g[1], e[0], e[1], path))
    return layers


def step(model, x, y, loss_fn, torch):
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter_ns()
    out = model(x)
    loss = loss_fn(out, y)
    t1 = time.perf_counter_ns()
    loss.backward()
    t2 = time.perf_counter_ns()
    return t0, t1, t2


def measure(name, args, torch, torchvision):
    torch.manual_seed(0)
    model = build(name, torchvision)
    model.train()
    layers = layers_of(model, name)
    side = INPUT_SIDE.get(name, 224)
    x = torch.randn(args.batch, 3, side, side)
    y = torch.randint(0, 1000, (args.batch,))
    loss_fn = torch.nn.CrossEntropyLoss()
    index = {id(m): i for i, (_, m, _) in enumerate(layers)}

    fwd_stamp = [None] * len(layers)
    bwd_stamp = [None] * len(layers)
    fwd_calls = [0] * len(layers)
    missing = [0] * len(layers)  # gradients of the layer still to come this step

    def on_forward(module, inputs, output):
        i = index[id(module)]
        fwd_calls[i] += 1
        fwd_stamp[i] = time.perf_counter_ns()

    def on_gradient(i):
        def hook(grad):
            missing[i] -= 1
            if missing[i] == 0:
                bwd_stamp[i] = time.perf_counter_ns()
            return None
        return hook

    def hooked_step():
        for i, (_, _, ts) in enumerate(layers):
            fwd_calls[i] = 0
            missing[i] = len(ts)
            bwd_stamp[i] = None
        handles = [m.register_forward_hook(on_forward) for _, m, _ in layers]
        for i, (_, _, ts) in enumerate(layers):
            handles += [p.register_hook(on_gradient(i)) for _, p in ts]
        try:
            t0, t1, t2 = step(model, x, y, loss_fn, torch)
        finally:
            for h in handles:
                h.remove()
        for i, (lname, _, _) in enumerate(layers):
            if fwd_calls[i] != 1:
                fail("%s: layer %s ran %d times in one forward pass; a layer used more than "
                     "once has no single place in the trace" % (name, lname, fwd_calls[i]))
            if bwd_stamp[i] is None:
                fail("%s: layer %s got no gradient" % (name, lname))
        # Forward: registration order is the forward order (checked).
        order = sorted(range(len(layers)), key=lambda i: fwd_stamp[i])
        if order != list(range(len(layers))):
            first = next(i for i, j in enumerate(order) if i != j)
            fail("%s: layer %s runs before %s in the forward pass but is registered after "
                 "it, so the model file's order is not the forward order"
                 % (name, layers[order[first]][0], layers[first][0]))
        fwd = []
        prev = t0
        for i in range(len(layers)):
            end = t1 if i == len(layers) - 1 else fwd_stamp[i]
            fwd.append(end - prev)
            prev = end
        # Backward: in the order the gradients became ready.
        bwd = [0] * len(layers)
        prev = t1
        border = sorted(range(len(layers)), key=lambda i: bwd_stamp[i])
        for n, i in enumerate(border):
            end = t2 if n == len(border) - 1 else bwd_stamp[i]
            bwd[i] = end - prev
            prev = end
        inversions = sum(1 for a, b in zip(border, border[1:]) if a < b)
        return fwd, bwd, t1 - t0, t2 - t1, inversions

    for _ in range(args.warmup):
        step(model, x, y, loss_fn, torch)
        hooked_step()
    fwd_runs, bwd_runs, plain_f, plain_b, hooked_f, hooked_b = [], [], [], [], [], []
    inversions = 0
    for r in range(args.reps):
        f, b, hf, hb, inv = hooked_step()
        fwd_runs.append(f)
        bwd_runs.append(b)
        hooked_f.append(hf)
        hooked_b.append(hb)
        inversions = max(inversions, inv)
        t0, t1, t2 = step(model, x, y, loss_fn, torch)
        plain_f.append(t1 - t0)
        plain_b.append(t2 - t1)
        print("  %s rep %d/%d: hooked %.1f + %.1f ms, plain %.1f + %.1f ms"
              % (name, r + 1, args.reps, hf / 1e6, hb / 1e6, (t1 - t0) / 1e6, (t2 - t1) / 1e6),
              flush=True)

    us = lambda ns: ns / 1000.0
    fwd = [us(statistics.median(run[i] for run in fwd_runs)) for i in range(len(layers))]
    bwd = [us(statistics.median(run[i] for run in bwd_runs)) for i in range(len(layers))]
    whole_f, whole_b = us(statistics.median(plain_f)), us(statistics.median(plain_b))
    spread = lambda v: "%.1f-%.1f" % (us(min(v)) / 1000, us(max(v)) / 1000)
    elements = sum(p.numel() for _, _, ts in layers for _, p in ts)
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    ver = torchvision.__version__
    lines = [
        "# %s: per-layer compute times for ps-worker --trace (config/traces/README.md)." % name,
        "# Measured by config/traces/measure.py: torch %s, torchvision %s, random weights, "
        "train mode," % (torch.__version__, ver),
        "# float32 on the CPU, batch %d of 3x%dx%d, %d threads, %d repetitions after %d "
        "warm-up steps," % (args.batch, side, side, args.threads, args.reps, args.warmup),
        "# %s UTC on %s (%s, %d CPUs)." % (
            datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"), platform.node(), cpu,
            os.cpu_count()),
        "# Whole passes without hooks (median, range in ms): forward %.1f (%s), backward %.1f (%s);"
        % (whole_f / 1000, spread(plain_f), whole_b / 1000, spread(plain_b)),
        "# the hooked passes the layers were timed in: forward %.1f (%s), backward %.1f (%s);"
        % (us(statistics.median(hooked_f)) / 1000, spread(hooked_f),
           us(statistics.median(hooked_b)) / 1000, spread(hooked_b)),
        "# sums of the per-layer medians: forward %.1f ms (%.3f of the hooked pass, %.3f of the "
        "plain one), backward %.1f ms (%.3f, %.3f)." % (
            sum(fwd) / 1000, sum(fwd) / us(statistics.median(hooked_f)), sum(fwd) / whole_f,
            sum(bwd) / 1000, sum(bwd) / us(statistics.median(hooked_b)), sum(bwd) / whole_b),
        "# %d layers, %d tensors, %d elements; gradients out of reverse forward order: %d."
        % (len(layers), sum(len(ts) for _, _, ts in layers), elements, inversions),
        "# layer forward_us backward_us tensors (the next lines of config/models/%s.txt)" % name,
    ]
    for (lname, _, ts), f, b in zip(layers, fwd, bwd):
        lines.append("%s %.1f %.1f %s" % (lname, f, b, " ".join(t for t, _ in ts)))
    path = os.path.join(args.out, name + ".txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("%s: %d layers; per-layer sums %.1f ms forward, %.1f ms backward; whole passes %.1f "
          "and %.1f ms hooked, %.1f and %.1f ms plain; wrote %s"
          % (name, len(layers), sum(fwd) / 1000, sum(bwd) / 1000,
             us(statistics.median(hooked_f)) / 1000, us(statistics.median(hooked_b)) / 1000,
             whole_f / 1000, whole_b / 1000, path), flush=True)


def table(out_dir):
    """README rows from the committed traces: layers, per-layer sums, model MB."""
    print("| model | layers | forward ms | backward ms | model MB |")
    print("| --- | --- | --- | --- | --- |")
    for fn in sorted(os.listdir(out_dir)):
        if not fn.endswith(".txt"):
            continue
        name = fn[:-4]
        fwd = bwd = 0.0
        layers = 0
        with open(os.path.join(out_dir, fn)) as f:
            for line in f:
                w = line.split("#", 1)[0].split()
                if w:
                    layers += 1
                    fwd += float(w[1])
                    bwd += float(w[2])
        _, tensors = model_tensors(name)
        mb = sum(n for _, n in tensors) * 4 / 1e6
        print("| %s | %d | %.1f | %.1f | %.1f |" % (name, layers, fwd / 1000, bwd / 1000, mb))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", help="torchvision model names with a config/models file")
    p.add_argument("--batch", type=int, default=16, help="images per step (default 16)")
    p.add_argument("--reps", type=int, default=7, help="measured steps (default 7)")
    p.add_argument("--warmup", type=int, default=2, help="steps before measuring (default 2)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    p.add_argument("--out", default=HERE, help="where the traces go (default: beside this script)")
    p.add_argument("--table", action="store_true", help="print the README table and exit")
    args = p.parse_args()
    if args.table:
        table(args.out)
        return
    if not args.models:
        p.error("name at least one model")
    import torch
    import torchvision
    torch.set_num_threads(args.threads)
    for name in args.models:
        measure(name, args, torch, torchvision)


if __name__ == "__main__":
    main()
