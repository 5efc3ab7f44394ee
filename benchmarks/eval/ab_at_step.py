#!/usr/bin/python3
"""What update="at_step" costs: the main job (`make demo`: the digits CNN, 4 trainer
processes and a ps-server over net_memif, the servers' momentum SGD) with the script's
optimizer handed to the servers, applied per chunk (the default) and at the step
(`train_digits.py --at-step`: the servers average, the optimizer's step() sends the final
gradient), side by side: each trial runs both in random order. Per variant the median and
spread ([min, max]) over the trials of a run's median time per step (from each epoch's
images per second: the epoch's seconds are printed to 10 ms); per trial the ratio
at_step / per_chunk, and its median and spread.

  ab_at_step.py [--build build] [--trials 5] [--epochs 10] [--clip NORM]

With --clip NORM the at_step variant also clips (clip_grad_norm_ on every step), the
script a user would run.
"""
import argparse
import os
import random
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from ab_demo import EPOCH, spread  # noqa: E402


BATCH = 64  # the global batch: train_digits.py's default


def run(build: str, epochs: int, flags: list[str]) -> float:
    """One run of the job: the median milliseconds per step over its epochs."""
    cmd = [sys.executable, os.path.join(ROOT, "apps", "train-digits", "train_digits.py"),
           "--job", os.path.join(ROOT, "config", "digits.yaml"), "--build", build,
           "--epochs", str(epochs), "--target", "0", "--lr", "0.1", *flags]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"ab_at_step: {' '.join(cmd)} exited with {r.returncode}:\n"
                 f"{r.stdout}{r.stderr}")
    per_epoch = [1000.0 * BATCH / float(m[2]) for m in EPOCH.finditer(r.stdout)]
    if len(per_epoch) != epochs:
        sys.exit(f"ab_at_step: not {epochs} epoch lines from {' '.join(cmd)}:\n{r.stdout}")
    return statistics.median(per_epoch)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--clip", type=float, default=0.0)
    a = p.parse_args()
    if a.trials < 1 or a.epochs < 1:
        p.error("--trials and --epochs must be positive")
    build = os.path.abspath(a.build)
    if not os.path.isfile(os.path.join(build, "apps", "ps-server")):
        p.error(f"{build}: no apps/ps-server (build first)")
    at_step = ["--at-step"] + (["--clip", str(a.clip)] if a.clip else [])
    variants = {"per_chunk": [], "at_step": at_step}
    got = {name: [] for name in variants}
    ratios = []
    rng = random.Random(1)
    for trial in range(a.trials):
        order = list(variants)
        rng.shuffle(order)
        for name in order:
            got[name].append(run(build, a.epochs, variants[name]))
            print(f"trial {trial + 1}/{a.trials} {name}: {got[name][-1]:.2f} ms per step",
                  flush=True)
        ratios.append(got["at_step"][-1] / got["per_chunk"][-1])
    print(f"\n{'variant':<12} ms per step, median [min, max]")
    for name in variants:
        print(f"{name:<12} {spread(got[name], '.2f')}")
    print(f"at_step / per_chunk per trial: {spread(ratios, '.3f')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
