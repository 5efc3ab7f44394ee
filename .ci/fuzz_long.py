#!/usr/bin/python3
"""Runs every libFuzzer target of a fuzz build for a number of inputs each.

`make fuzz-long` calls it. For each test of the suite "fuzz" (meson introspect), it
runs the target with the test's own arguments (seed, corpus, seeds, limits) plus
-runs=N and no time cap, and prints one line per target: inputs run, seconds, inputs
per second, and the corpus it ended with. libFuzzer stops at the first crash, leak,
timeout or failed check and writes the input to crash-*/timeout-* in the working
directory (the fuzz build's): the line then says so and the exit status is 1.
Usage: fuzz_long.py FUZZ_BUILD_DIR RUNS [TARGET ...]   (no TARGET: every one)
"""
import json
import re
import subprocess
import sys
import time

build, runs, only = sys.argv[1], int(sys.argv[2]), set(sys.argv[3:])
tests = json.loads(subprocess.check_output(["meson", "introspect", "--tests", build]))
targets = [t for t in tests if "fuzz" in t.get("suite", []) or
           any(s.endswith(":fuzz") or s == "fuzz" for s in t.get("suite", []))]
if only:
    targets = [t for t in targets if t["name"] in only]
if not targets:
    sys.exit(f"fuzz_long: no fuzz tests in {build} (run `make fuzz` first)")
print(f"{'target':<16} {'inputs':>10} {'seconds':>8} {'inputs/s':>9} {'corpus':>7}  result")
failed = 0
for t in sorted(targets, key=lambda t: t["name"]):
    cmd = t["cmd"] + t.get("args", []) + [f"-runs={runs}", "-max_total_time=0",
                                          "-print_final_stats=1"]
    start = time.monotonic()
    p = subprocess.run(cmd, cwd=build, capture_output=True, text=True)
    seconds = time.monotonic() - start
    out = p.stderr + p.stdout
    done = re.search(r"Done (\d+) runs in (\d+) second", out)
    inputs = int(done.group(1)) if done else 0
    corpus = re.findall(r"corp: (\d+)/", out)
    result = "ok" if p.returncode == 0 and inputs >= runs else f"FAILED (exit {p.returncode})"
    if result != "ok":
        failed += 1
        sys.stderr.write(f"--- {t['name']}: last lines ---\n" + "\n".join(out.splitlines()[-25:]) + "\n")
    print(f"{t['name']:<16} {inputs:>10} {seconds:>8.0f} {inputs / max(seconds, 1e-9):>9.0f} "
          f"{corpus[-1] if corpus else '-':>7}  {result}", flush=True)
sys.exit(1 if failed else 0)
