#!/usr/bin/python3
"""A DPDK process leaves no EAL runtime directory behind (net::Eal removes it
when empty, after EAL's own exit handler has unlinked the telemetry socket in
it): runs a PMD test binary and looks for /var/run/dpdk/mt-<name>-<pid>.

Usage: runtime_dir_test.py <a PMD test binary built on pmd_env>"""
import os
import subprocess
import sys


def main():
    binary = sys.argv[1]
    name = os.path.basename(binary)
    p = subprocess.Popen([binary, "--gtest_brief=1"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    out, _ = p.communicate(timeout=120)
    if p.returncode != 0:
        print(out)
        print(f"FAIL: {name} exited with {p.returncode}")
        return 1
    runtime = f"/var/run/dpdk/mt-{name}-{p.pid}"
    if os.path.exists(runtime):
        print(f"FAIL: {runtime} is left behind: {os.listdir(runtime)}")
        return 1
    print(f"ok: {name} (pid {p.pid}) left no {runtime}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
