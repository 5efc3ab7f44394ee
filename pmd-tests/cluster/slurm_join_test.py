#!/usr/bin/python3
"""A worker killed under Slurm and started again by Slurm joins the running job
(docs/cluster.md, "A worker that dies"; docs/membership.md, "Joining"), on a real
Slurm cluster on this machine (slurm_cluster.py: munged, slurmctld and slurmd under
a private directory, stopped at the end whatever happens).

Slurm 22.05 has no option that starts one task of a step again. What it has, and
what the batch script below uses: `srun --kill-on-bad-exit=0` keeps a step running
when one of its tasks dies, srun names the task on its stderr as it ends ("srun:
error: HOST: task 3: Killed"), and `srun --overlap --ntasks=1` starts a new step
inside the same allocation while the first still holds every CPU of it. The batch
script reads srun's line, turns the task into its node (the mapping rule, through
mercury.identify) and starts that node again as a step of its own with
MERCURY_NODE set: the decision to restart is the script's, each start is Slurm's.

The job: ps-job --slurm writes the job file and the --multi-prog file from the
allocation (memif, one ps-server and 4 digits trainers, training.sync asp);
`srun --ntasks=5 --kill-on-bad-exit=0 --output=task%t.out --multi-prog` runs it, each
task's output in its own file (srun's stderr then carries srun's lines only). Once
rank 0 has trained its second epoch, the test kills task 3 (worker w2; its pid from
`scontrol listpids`) with SIGKILL from outside. Checked: srun names the task, the other tasks
go on, the script starts w2 again through srun, the new process finds its node from
MERCURY_NODE and joins the running job at the slowest rank's step, no earlier than
rank 0's steps before the kill less a rank's lag (its first pull is every chunk's newest
version), trains from that step to the end of its epochs; the server names the join
(4 ranks) and counts one removal and one join; rank 0 counts one worker joined and
reaches the digits target; the batch job's status is 0.

Usage: slurm_join_test.py BUILD_DIR
"""
import os
import re
import shlex
import signal
import sys
import time

import numpy as np

import slurm_cluster
from digits_job import SCRIPT, job_file

BUILD = None
WORKERS = 4
KILLED = 2  # worker w2: task 3 (task 0 is ps-server)
TASK = KILLED + 1
EPOCHS = 20
STEPS_PER_EPOCH = 22  # (1437 // 4) // 16
KILL_AFTER_EPOCH = 2  # rank 0's
# training.sync asp with the server's SGD (pmd-tests/python/membership_test.py's
# rate). Every step sleeps COMPUTE_MS first (an accelerator's compute): the job then
# trains for about 25 s after the kill, and the new process (started by srun, it
# imports torch and loads the data: about 6 s on this 2-CPU machine) joins while it
# runs. With 10 ms the job was over 5 s after the kill, and the late process was
# refused ("the job is finished").
TRAINING = ["sync: asp", "optimizer: sgd", "learning_rate: 0.1"]
COMPUTE_MS = 60
PEER_TIMEOUT_MS = 3000  # this machine's 2 CPUs are shared (membership_test.py)
TARGET = 0.95  # rank 0's: the digits job's target
TARGET_OTHERS = 0.9  # every worker process's status (membership_test.py says why)

# The batch script. {...} are the test's paths; the rest is what a user writes.
BATCH = r"""#!/bin/bash
set -uo pipefail
TRAINER={trainer}
MAX_RESTARTS=1
{ps_job} --slurm --template {template} --name {name} \
  --nic memif --servers-per-host 1 --workers-per-host 4 --memif-dir {work} \
  --output {job} --multi-prog {job}.conf --server-command {ps_server} \
  --trainer "$TRAINER" --check || exit 1
export MERCURY_JOB={job}

# Task $1 of the first step died on host $2: start its node again there, as a
# step of its own.
restart() {{
  local node n
  node=$(SLURM_PROCID=$1 {python} -c 'import mercury; print(mercury.identify()[1])') || return 1
  for ((n = 1; n <= MAX_RESTARTS; n++)); do
    echo "batch: task $1 ($node) died; starting $node again (restart $n of $MAX_RESTARTS)"
    MERCURY_NODE=$node MERCURY_RESTART=$n srun --overlap --ntasks=1 --nodelist="$2" \
      --output={work}/$node-restart$n.out $TRAINER && return 0
  done
  return 1
}}

mkfifo {work}/srun.err
srun --ntasks=5 --kill-on-bad-exit=0 --output={work}/task%t.out --multi-prog {job}.conf \
  2>{work}/srun.err &
step0=$!
restarts=()
while IFS= read -r line; do
  printf '%s\n' "$line" >&2
  if [[ $line =~ ^srun:\ error:\ ([^:]+):\ task\ ([0-9]+):\  ]]; then
    # Not from the fifo: srun forwards its stdin to its task, and would take
    # this loop's lines.
    restart "${{BASH_REMATCH[2]}}" "${{BASH_REMATCH[1]}}" </dev/null &
    restarts+=($!)
  fi
done <{work}/srun.err
wait $step0
echo "batch: the first step ended with status $?"
# Each task that failed was started again; the job's status is theirs.
status=0
for pid in "${{restarts[@]}}"; do wait "$pid" || status=1; done
exit $status
"""


class SlurmJoin(slurm_cluster.ClusterTest):
    prefix = "mercury-slurm-join-"

    def output(self, *names):
        """The text of these files of the work directory (those that exist)."""
        text = ""
        for name in names:
            path = os.path.join(self.work, name)
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    text += f"== {name}\n" + f.read()
        return text

    def everything(self):
        """The batch script's output, then each task's and each restart's."""
        return self.output("join.out", *sorted(n for n in os.listdir(self.work)
                                                if n.endswith(".out") and n != "join.out"))

    def finished(self, jobid):
        """(JobState, ExitCode) of a job that ended, None while it runs. (sbatch
        --wait would do, but it polls less and less often, up to every 32 s.)"""
        r = self.slurm.run(["scontrol", "-o", "show", "job", jobid], timeout=30)
        state = re.search(r"\bJobState=(\S+)", r.stdout).group(1)
        if state in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"):
            return None
        return state, re.search(r"\bExitCode=(\S+)", r.stdout).group(1)

    def task_pid(self, jobid, step, task):
        """The pid of `task` of step `step` (scontrol listpids: PID JOBID STEPID
        LOCALID GLOBALID; the tasks' children have no ids)."""
        r = self.slurm.run(["scontrol", "listpids", f"{jobid}.{step}"], check=False, timeout=30)
        for line in r.stdout.splitlines()[1:]:
            fields = line.split()
            if len(fields) == 5 and fields[4] == str(task):
                return int(fields[0])
        return None

    def test_a_worker_killed_is_started_again_by_slurm_and_joins(self):
        work = self.work
        job = os.path.join(work, "job.yaml")
        losses = os.path.join(work, "losses")
        template = job_file(os.path.join(work, "asp.yaml"), training=TRAINING,
                            peer_timeout_ms=PEER_TIMEOUT_MS)
        trainer = (f"{sys.executable} {SCRIPT} --epochs {EPOCHS} --compute-ms {COMPUTE_MS} "
                   f"--target {TARGET_OTHERS} --losses {losses} --build {BUILD}")
        script = os.path.join(work, "join.sh")
        with open(script, "w") as f:
            f.write(BATCH.format(
                trainer=shlex.quote(trainer), ps_job=os.path.join(BUILD, "apps", "ps-job"),
                template=template, name=f"slurmjoin{os.getpid()}", work=work, job=job,
                ps_server=os.path.join(BUILD, "apps", "ps-server"),
                python=f"PYTHONPATH={os.path.join(BUILD, 'lib', 'python')} {sys.executable}"))
        os.chmod(script, 0o755)
        # Slurm ends a job that hangs (--time, minutes) before the test's own
        # deadlines, and those come before meson's timeout: the teardown always runs.
        jobid = self.slurm.run(
            ["sbatch", "--parsable", "--ntasks=5", "--job-name=join", "--time=6",
             f"--output={os.path.join(work, 'join.out')}", "--chdir", work, script],
            timeout=60).stdout.strip().split(";")[0]
        self.assertTrue(jobid.isdigit(), f"sbatch said {jobid!r}")
        # Mid-run: once rank 0 has trained epoch KILL_AFTER_EPOCH, task 3 (w2) is
        # killed from outside, as a crash would.
        mark = f"epoch {KILL_AFTER_EPOCH:3d}/{EPOCHS}"
        deadline = time.monotonic() + 180
        while mark not in self.output("task1.out"):  # rank 0's
            self.assertIsNone(self.finished(jobid), "the job ended before the kill\n"
                              + self.everything())
            self.assertLess(time.monotonic(), deadline, self.everything())
            time.sleep(0.2)
        pid = self.task_pid(jobid, 0, TASK)
        self.assertIsNotNone(pid, self.everything())
        with open(f"/proc/{pid}/environ", "rb") as f:
            self.assertIn(f"SLURM_PROCID={TASK}".encode(), f.read().split(b"\0"))
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        # When the new process said its node, and when it joined (for the record).
        seen = {"started": None, "joined": None}
        marks = {"started": "(MERCURY_NODE=w", "joined": "joined the running job at version"}
        deadline = killed + 360
        while (status := self.finished(jobid)) is None:
            self.assertLess(time.monotonic(), deadline, self.everything())
            text = self.output(f"w{KILLED}-restart1.out")
            for what, mark in marks.items():
                if seen[what] is None and mark in text:
                    seen[what] = time.monotonic() - killed
            time.sleep(0.1)
        out = self.everything()
        self.assertEqual(status, ("COMPLETED", "0:0"), out)
        w = f"w{KILLED}"
        host = self.slurm.host
        # Slurm kept the step and named the task; the script started it again.
        self.assertIn(f"train-digits: worker {w} of {job} (SLURM_PROCID={TASK} of "
                      "SLURM_NTASKS=5)", out)
        self.assertIn(f"srun: error: {host}: task {TASK}: Killed", out)
        self.assertIn(f"batch: task {TASK} ({w}) died; starting {w} again (restart 1 of 1)", out)
        self.assertIn(f"train-digits: worker {w} of {job} (MERCURY_NODE={w})", out)
        # srun's own status is the killed task's: 128 + SIGKILL.
        self.assertIn("batch: the first step ended with status 137", out)
        # The new process joined at the slowest rank's step: rank 0 had trained its
        # first KILL_AFTER_EPOCH epochs before the kill, the others as many less the
        # steps a rank may lag by.
        joined = re.search(rf"{w}: joined the running job at version (\d+): going on from "
                           r"step (\d+)", out)
        self.assertIsNotNone(joined, out)
        version, step = int(joined.group(1)), int(joined.group(2))
        self.assertGreaterEqual(version, KILL_AFTER_EPOCH * STEPS_PER_EPOCH - 2, out)
        self.assertEqual(step, version, out)
        total = EPOCHS * STEPS_PER_EPOCH
        for r in range(WORKERS):
            path = os.path.join(losses, f"w{r}.txt")
            self.assertTrue(os.path.exists(path), f"w{r} wrote no losses\n{out}")
            # The new process trained from the step it joined at; the others every step.
            self.assertEqual(len(np.loadtxt(path)), total - step if r == KILLED else total,
                             f"w{r}\n{out}")
        with open(os.path.join(losses, "w0.result")) as f:
            accuracy = float(f.read().split()[0])
        self.assertGreaterEqual(accuracy, TARGET, out)
        # The servers took the rank back and told the others; the job ended with 4 ranks.
        self.assertIn(f"worker {w} (rank {KILLED}) joined the running job (a new process): "
                      "it goes on with 4 ranks", out)
        self.assertIn("workers removed: 1; workers joined: 1", out)  # the server's last line
        self.assertIn("1 workers joined the job", out)  # rank 0's counter
        # Each of the three others was told once, on its stderr (in its task's file).
        told = re.findall(rf"mercury: server s0 \([^)]*\): worker {w} \(rank {KILLED}\) joined "
                          "the running job", out)
        self.assertEqual(len(told), WORKERS - 1, out)
        self.assertIn("every worker left; the job is done", out)
        after = {k: "?" if v is None else f"{v:.1f} s" for k, v in seen.items()}
        print(f"\nsrun --kill-on-bad-exit=0, task {TASK} ({w}) killed after rank 0's epoch "
              f"{KILL_AFTER_EPOCH}, started again by srun --overlap: its new process said its "
              f"node {after['started']} after the kill and joined {after['joined']} after it, "
              f"at version {version} (step {step} of {total}); rank 0's final test accuracy "
              f"{accuracy:.4f}", file=sys.stderr)


if __name__ == "__main__":
    BUILD = os.path.abspath(sys.argv[1])
    slurm_cluster.test_main()
