#!/usr/bin/python3
"""The main job (`make demo`: the digits CNN, 4 trainer processes and a ps-server over
net_memif) from two or more checkouts side by side, interleaved: each trial runs every
checkout's own train_digits.py against its own build, in turn; per checkout the median
and the spread ([min, max]) of the wall time per epoch, of the images per second over
the whole training (every epoch's images over the sum of the epochs' times: an epoch
of the digits set lasts under 0.1 s, so one epoch alone is mostly noise), and the final
test accuracy; then each checkout's images per second over the first checkout's in the
same trial (the runs closest in time), median and [min, max]. A refactor that should
change nothing is checked with it.

  ab_demo.py CHECKOUT[:BUILD] CHECKOUT[:BUILD]... [--trials 5] [--epochs N]

BUILD defaults to CHECKOUT/build; each checkout is labelled by its directory's name.
e.g. ab_demo.py /work/before /work/main
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

EPOCH = re.compile(r"epoch +\d+/\d+: .* ([0-9.]+) s +([0-9]+) images/s")
VERDICT = re.compile(r"test accuracy ([0-9.]+) .* after (\d+) epochs in ([0-9.]+) s")


def run(checkout: str, build: str, epochs: int | None) -> tuple[float, float, float]:
    """One demo run: (median seconds per epoch, images/s over the whole training,
    accuracy)."""
    cmd = [sys.executable, os.path.join(checkout, "apps", "train-digits", "train_digits.py"),
           "--job", os.path.join(checkout, "config", "digits.yaml"), "--build", build]
    if epochs:
        cmd += ["--epochs", str(epochs)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=checkout, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"ab_demo: {' '.join(cmd)} exited with {r.returncode}:\n{r.stdout}{r.stderr}")
    per_epoch = [(float(m[1]), float(m[2])) for m in EPOCH.finditer(r.stdout)]
    verdict = VERDICT.search(r.stdout)
    if not per_epoch or not verdict:
        sys.exit(f"ab_demo: no epoch lines or verdict in the output of {' '.join(cmd)}:\n"
                 f"{r.stdout}")
    # Every epoch has the same images, so the whole training's rate is the harmonic mean
    # of the epochs' (the printed seconds are rounded to 10 ms; the rates are not).
    return (statistics.median(s for s, _ in per_epoch),
            statistics.harmonic_mean(i for _, i in per_epoch), float(verdict[1]))


def spread(xs: list[float], fmt: str) -> str:
    return f"{statistics.median(xs):{fmt}} [{min(xs):{fmt}}, {max(xs):{fmt}}]"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkouts", nargs="+", help="CHECKOUT[:BUILD]")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--epochs", type=int, help="the job file's epochs when not given")
    a = p.parse_args()
    if a.trials < 1:
        p.error("--trials must be positive")
    if len(a.checkouts) < 2:
        p.error("give at least two checkouts")
    runs = []
    for spec in a.checkouts:
        checkout, _, build = spec.partition(":")
        checkout = os.path.abspath(checkout)
        build = os.path.abspath(build or os.path.join(checkout, "build"))
        if not os.path.isfile(os.path.join(checkout, "apps", "train-digits", "train_digits.py")):
            p.error(f"{checkout}: no apps/train-digits/train_digits.py")
        if not os.path.isfile(os.path.join(build, "build.ninja")):
            p.error(f"{build}: not a meson build directory")
        runs.append((os.path.basename(checkout.rstrip("/")), checkout, build))
    if len({label for label, _, _ in runs}) != len(runs):
        p.error("the checkouts' directory names must differ")
    got = {label: [] for label, _, _ in runs}
    for trial in range(a.trials):
        for label, checkout, build in runs:
            got[label].append(run(checkout, build, a.epochs))
            secs, ips, acc = got[label][-1]
            print(f"trial {trial + 1}/{a.trials} {label}: {secs:.3f} s per epoch, "
                  f"{ips:.0f} images/s, accuracy {acc:.4f}", flush=True)
    print(f"\n{'checkout':<16} {'s per epoch, median [min, max]':<32} "
          f"{'images/s, median [min, max]':<30} accuracy")
    for label, _, _ in runs:
        rows = got[label]
        print(f"{label:<16} {spread([r[0] for r in rows], '.3f'):<32} "
              f"{spread([r[1] for r in rows], '.0f'):<30} "
              f"{spread([r[2] for r in rows], '.4f')}")
    first = runs[0][0]
    print(f"\nimages/s over {first}'s in the same trial, median [min, max]")
    for label, _, _ in runs[1:]:
        ratios = [b[1] / a[1] for a, b in zip(got[first], got[label])]
        lower = sum(r < 1 for r in ratios)
        print(f"{label:<16} {spread(ratios, '.3f')}  (lower in {lower} of {len(ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
