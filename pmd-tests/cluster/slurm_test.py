#!/usr/bin/python3
"""Whole jobs through a real Slurm cluster on this machine (slurm_cluster.py:
munged, slurmctld and slurmd under a private directory, stopped at the end
whatever happens).

1. A batch script (sbatch --ntasks=5) writes the job file from its allocation
   (`ps-job --slurm`: SLURM_JOB_NODELIST expanded by `scontrol show
   hostnames`, the CPUs from SLURM_JOB_CPUS_PER_NODE, digits.yaml's settings,
   memif) with an `srun --multi-prog` file, and runs the whole job with one
   `srun --ntasks=5`: rank 0 is ps-server, ranks 1-4 the digits trainers
   (apps/train-digits), none of them given a node or a job file on its command
   line (MERCURY_JOB and SLURM_PROCID). Every worker's loss at every step must
   be the one-process reference's (train_digits.py --single --exact) bit for
   bit, and each process must say where its node came from.
2. The same through Slurm across two network namespaces over net_af_packet
   (as pmd-tests/hosts makes them: veths into a bridge; no MACs in the file,
   real ARP): the job file is generated from the namespaces' host list, and
   each rank enters its node's namespace.
3. srun starting a number of processes that fits neither the job's nodes
   nor its workers: each process refuses, naming both numbers.

Usage: slurm_test.py BUILD_DIR
"""
import os
import re
import shlex
import subprocess
import sys

import numpy as np

import slurm_cluster
from digits_job import EPOCHS, SCRIPT, exact_losses, job_file, losses

BUILD = None


class Slurm(slurm_cluster.ClusterTest):
    def sbatch(self, name, body, ntasks):
        """Runs `body` as a batch script of `ntasks` tasks and waits for it;
        returns (exit status, its output)."""
        script = os.path.join(self.work, name + ".sh")
        with open(script, "w") as f:
            f.write("#!/bin/bash\nset -euo pipefail\n" + body)
        os.chmod(script, 0o755)
        out = os.path.join(self.work, name + ".out")
        # Slurm ends a job that hangs (--time, minutes) before the test's own
        # timeout, and that one comes before meson's: the teardown always runs.
        r = self.slurm.run(["sbatch", "--wait", f"--ntasks={ntasks}", f"--job-name={name}",
                            "--time=4", f"--output={out}", "--chdir", self.work, script],
                           check=False, timeout=300)
        text = ""
        if os.path.exists(out):
            with open(out) as f:
                text = f.read()
        return r.returncode, r.stdout + r.stderr + text

    def check_exact(self, job, got_dir, workers, out, what):
        want = exact_losses(BUILD, job, got_dir + "-exact", workers)
        got = losses(got_dir, workers)
        for r in range(workers):
            self.assertEqual(len(got[r]), len(want[r]), out)
            self.assertGreater(len(got[r]), 0, out)
            self.assertTrue(np.array_equal(got[r], want[r]),
                            f"w{r}'s losses differ from the one-process reference's\n{out}")
        stopped = [line for line in out.splitlines() if ": stopped; " in line]
        print(f"\n{what}: {workers} workers x {len(want[0])} steps, every loss bit for bit the "
              f"reference's; {stopped[-1] if stopped else ''}", file=sys.stderr)

    def test_1_srun_starts_the_job_from_the_allocation(self):
        name = f"slurm{os.getpid()}"
        job = os.path.join(self.work, "memif.yaml")
        losses = os.path.join(self.work, "memif-losses")
        trainer = (f"{sys.executable} {SCRIPT} --epochs {EPOCHS} --target 0 --losses {losses} "
                   f"--build {BUILD}")
        rc, out = self.sbatch("memif", f"""
{BUILD}/apps/ps-job --slurm --template {job_file(os.path.join(self.work, "digits.yaml"))} \\
  --name {name} \\
  --nic memif --servers-per-host 1 --workers-per-host 4 --memif-dir {self.work} \\
  --output {job} --multi-prog {job}.conf --server-command {BUILD}/apps/ps-server \\
  --trainer {shlex.quote(trainer)} --check
export MERCURY_JOB={job}
srun --ntasks=5 --multi-prog {job}.conf
""", ntasks=5)
        self.assertEqual(rc, 0, out)
        with open(job) as f:
            text = f.read()
        host = self.slurm.host
        self.assertIn("# Written by ps-job from SLURM_JOB_NODELIST: 1 host, 1 server, 4 workers",
                      text)
        self.assertEqual(len(re.findall(f"# host {host}$", text, re.M)), 5, text)
        with open(job + ".conf") as f:
            self.assertIn("1-4 " + trainer, f.read())
        # Each process found its node from the launcher.
        self.assertIn(f"node s0 of {job} (SLURM_PROCID=0 of SLURM_NTASKS=5)", out)
        for r in range(4):
            self.assertIn(f"train-digits: worker w{r} of {job} (SLURM_PROCID={r + 1} of "
                          "SLURM_NTASKS=5)", out)
        self.assertIn("every worker left; the job is done", out)
        self.check_exact(job, losses, 4, out, "srun --ntasks=5 over memif")

    def test_2_two_namespaces_over_af_packet(self):
        tag = f"mcl{os.getpid() % 100000}"
        namespaces = [f"{tag}-br", f"{tag}-nsa", f"{tag}-nsb"]
        try:
            self.make_hosts(tag, {"nsa": 2, "nsb": 1})
            hosts = os.path.join(self.work, "hosts.txt")
            with open(hosts, "w") as f:
                f.write("# two hosts: network namespaces, each eth a veth into one bridge\n"
                        "nsa nic=af_packet:eth0,af_packet:eth1 servers=1 workers=1\n"
                        "nsb nic=af_packet:eth0 servers=0 workers=1\n")
            job = os.path.join(self.work, "ns.yaml")
            losses = os.path.join(self.work, "ns-losses")
            # Rank r enters the namespace of the job file's r-th node's host.
            on_host = os.path.join(self.work, "on-host")
            with open(on_host, "w") as f:
                f.write("#!/bin/bash\n"
                        "host=$(grep -E '^  - name: .*# host ' \"$MERCURY_JOB\" | "
                        "sed -n \"$((SLURM_PROCID + 1))p\" | sed 's/.*# host //')\n"
                        f"exec ip netns exec {tag}-\"$host\" \"$@\"\n")
            os.chmod(on_host, 0o755)
            trainer = (f"{on_host} {sys.executable} {SCRIPT} --epochs {EPOCHS} --target 0 "
                       f"--losses {losses} --build {BUILD}")
            rc, out = self.sbatch("ns", f"""
{BUILD}/apps/ps-job --hostfile {hosts} \\
  --template {job_file(os.path.join(self.work, "ns-t.yaml"), mtu=1500)} \\
  --name {tag} --id 44 --subnet 10.79.0.0/24 --output {job} --multi-prog {job}.conf \\
  --server-command "{on_host} {BUILD}/apps/ps-server" --trainer {shlex.quote(trainer)} --check
export MERCURY_JOB={job}
srun --ntasks=3 --multi-prog {job}.conf
""", ntasks=3)
            self.assertEqual(rc, 0, out)
            with open(job) as f:
                text = f.read()
            self.assertNotIn("mac:", text)  # ARP finds every peer
            self.assertIn("net_af_packet1,iface=eth1", text)
            self.assertIn(f"node s0 of {job} (SLURM_PROCID=0 of SLURM_NTASKS=3)", out)
            self.assertIn("every worker left; the job is done", out)
            self.check_exact(job, losses, 2, out,
                             "srun --ntasks=3 across two namespaces over net_af_packet")
        finally:
            for ns in namespaces:
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def make_hosts(self, tag, hosts):
        """Network namespaces {tag}-<host>, each with hosts[host] interfaces
        eth0, eth1, ... that are veths into one bridge (namespace {tag}-br)."""
        def ip(*args):
            subprocess.run(["ip", *args], check=True, capture_output=True)
        br = f"{tag}-br"
        ip("netns", "add", br)
        ip("-n", br, "link", "add", "br0", "type", "bridge")
        ip("-n", br, "link", "set", "br0", "up")
        i = 0
        for host, count in hosts.items():
            ns = f"{tag}-{host}"
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
            for k in range(count):
                a, b = f"v{i}-{tag}", f"p{i}-{tag}"
                ip("link", "add", a, "type", "veth", "peer", "name", b)
                ip("link", "set", a, "netns", ns)
                ip("-n", ns, "link", "set", a, "name", f"eth{k}")
                ip("-n", ns, "link", "set", f"eth{k}", "up")
                ip("link", "set", b, "netns", br)
                ip("-n", br, "link", "set", b, "master", "br0")
                ip("-n", br, "link", "set", b, "up")
                i += 1

    def test_3_a_size_that_fits_neither_is_refused_by_every_rank(self):
        job = os.path.join(self.work, "size.yaml")
        subprocess.run([os.path.join(BUILD, "apps", "ps-job"), "--hosts", "h", "--nic", "memif",
                        "--workers-per-host", "4", "--cpus", "2", "--name", "size", "--output",
                        job], check=True, capture_output=True)
        r = self.slurm.run(["srun", "--ntasks=3", os.path.join(BUILD, "apps", "ps-server"),
                            "--check"], check=False, timeout=120,
                           env=dict(self.slurm.env, MERCURY_JOB=job))
        self.assertNotEqual(r.returncode, 0)
        out = r.stdout + r.stderr
        for rank in range(3):
            self.assertIn(f"ps-server: {job}: SLURM_PROCID={rank} of SLURM_NTASKS=3: the launcher "
                          "started 3 processes, and the job has 1 server and 4 workers: start 5 "
                          "(every node) or 4", out)


if __name__ == "__main__":
    BUILD = os.path.abspath(sys.argv[1])
    slurm_cluster.test_main()
