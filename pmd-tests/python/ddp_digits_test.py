#!/usr/bin/python3
"""What a DDP script does around its optimizer, through Mercury, bit for bit.

The digits job (apps/train-digits: 4 worker processes and ps-server over
net_memif, BSP) with gradient accumulation, clipping, loss scaling, AdamW and a
learning-rate schedule, against the one-process reference (--single --exact),
which computes every worker's gradients itself and the servers' arithmetic.
Every worker's loss at every micro-batch must be the reference's, bit for bit:

* accumulation with the servers' AdamW (decoupled weight decay, the job file's
  training.optimizer adamw): 2 micro-batches per step,
  DistributedModel(backward_passes_per_step=2);
* clip_grad_norm_ of the averaged gradient (training.optimizer sum, the
  trainer's momentum SGD after it): some steps clipped, some not;
* a GradScaler (CPU: cpu_grad_scaler.CpuGradScaler, torch's class with its two
  CUDA kernels done in torch on the CPU) and bf16 autocast: the averaged
  gradient unscaled before the step, overflowed steps skipped on every rank;
* the whole DDP script: no_sync() for the first of 2 micro-batches, GradScaler,
  clip_grad_norm_, AdamW and a warm-up then cosine schedule;
* that script stopped after its first epoch (every process gone) and resumed from
  rank 0's checkpoint (model, optimizer, scaler, schedule): its losses are the
  uninterrupted reference's;
* with the servers' optimizer: the script's AdamW handed to the servers, its
  learning rate driven by a warm-up then cosine schedule (every step's rate a
  versioned setting on every shard), with no_sync() accumulation;
* the whole DDP script with the servers' AdamW, update="at_step" (--at-step):
  the servers only average during backward(), the script unscales, clips and
  skips, and its optimizer's step() sends the final gradient, to which the
  servers apply AdamW (steps clipped, steps skipped on every rank); also
  stopped after an epoch and resumed from rank 0's checkpoint (with the
  servers' state); and clip_grad_norm_ alone under the servers' momentum;
* checkpoints with the servers' state (every shard's parameters, optimizer
  state, versions and settings, in the wrapped model's state_dict()): 4 epochs,
  every process stopped, 4 more from rank 0's checkpoint, under momentum and
  under Adam (with a schedule and accumulation): the losses of the 8
  uninterrupted epochs; and with bfloat16 on the wire (--wire-dtype), 2 + 2
  epochs against the same job run unbroken.

Each run also reports what the optimizer's side did (steps clipped and skipped,
the last scale and learning rate), which must be the reference's and show that
the feature acted; and a step pushes every tensor once (accumulation pushes
nothing until the step's last pass).

Usage: ddp_digits_test.py BUILD_DIR
"""
import os
import re
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from digits_test import WORKERS, job_file, train  # noqa: E402

EPOCHS = 2
STEPS = EPOCHS * 22  # 1437 samples, 4 workers, local batches of 16
TENSORS = 8  # the CNN's weights and biases
COMMON = ["--epochs", str(EPOCHS), "--target", "0"]
SERVERS_ADAMW = "  optimizer: adamw\n  learning_rate: 0.005\n  weight_decay: 0.05\n"
SERVERS_MOMENTUM = "  optimizer: momentum\n  learning_rate: 0.05\n  momentum: 0.9\n"
SERVERS_ADAM = "  optimizer: adam\n  learning_rate: 0.002\n  weight_decay: 0.01\n"
# The same script with the servers' optimizer: the script's optimizer handed to them,
# its rate on a warm-up then cosine schedule, no_sync() accumulation.
SERVER_SCRIPT = ["--accumulate", "2", "--lr", "0.01", "--schedule"]
HALVES = 4  # epochs before the stop, and after the resume
# A DDP script: no_sync() accumulation, GradScaler, clip_grad_norm_, AdamW, warm-up + cosine.
SCRIPT = ["--accumulate", "2", "--amp", "--clip", "1.0", "--local-optimizer", "adamw",
          "--lr", "0.01", "--schedule"]
# The same script with the servers' AdamW applied at the script's step.
SERVER_SCRIPT_AT_STEP = ["--accumulate", "2", "--amp", "--clip", "1.0", "--lr", "0.01",
                         "--schedule", "--at-step"]


class DdpDigits(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def job(self, name, optimizer):
        """The digits job with `optimizer`: sum, or the servers' (training keys)."""
        path = job_file(self.tmp.name, "ddp-" + name)
        with open(path) as f:
            text = f.read()
        training = "  optimizer: sum\n" if optimizer == "sum" else optimizer
        text, n = re.subn(r"  optimizer: momentum\n  learning_rate: .*\n  momentum: .*\n",
                          training, text)
        self.assertEqual(n, 1)
        with open(path, "w") as f:
            f.write(text)
        return path

    def read(self, d, node):
        curve = np.loadtxt(os.path.join(d, node + ".txt"))
        path = os.path.join(d, node + ".steps")
        steps = []
        if os.path.exists(path):
            with open(path) as f:
                steps = f.read().split()
        return curve, dict(zip(steps[::2], steps[1::2]))

    def reference(self, name, optimizer, flags, common=COMMON):
        """The one-process reference's directory for `flags` (computed once)."""
        ref = os.path.join(self.tmp.name, name + "-exact")
        if not os.path.isdir(ref):
            rc, out = train(self.job(name, optimizer), ref, "--single", "--exact", *common,
                            *[f for f in flags if f != "--backward-passes"])
            self.assertEqual(rc, 0, out)
        return ref

    def run_job(self, name, optimizer, flags, *extra, common=COMMON):
        run = os.path.join(self.tmp.name, name)
        rc, out = train(self.job(name, optimizer), run, *common, *flags, *extra)
        self.assertEqual(rc, 0, out)
        return run, out

    def check(self, name, optimizer, *flags):
        """Runs the job and its reference with `flags`; returns the reference's report
        of the optimizer's side (clipped, skipped, scale, lr)."""
        ref = self.reference(name, optimizer, flags)
        run, out = self.run_job(name, optimizer, flags)
        micro = 2 if "--accumulate" in flags else 1
        report = None
        for r in range(WORKERS):
            want, want_report = self.read(ref, f"w{r}")
            got, got_report = self.read(run, f"w{r}")
            self.assertEqual(len(want), STEPS * micro)
            self.assertTrue(np.array_equal(got, want),
                            f"{name}: w{r}'s losses differ from the reference's\n{out}")
            self.assertEqual(got_report, want_report, out)
            report = want_report
        print(f"\n{name}: {len(want)} losses per worker bit-identical to the reference's; "
              f"optimizer side: {report or 'the servers'}", file=sys.stderr)
        pushes = re.search(r"w0: (\d+) pushes", out)
        self.assertIsNotNone(pushes, out)
        # At step: the average's push and the final gradient's (or the skip marker).
        per_step = 2 * TENSORS if "--at-step" in flags else TENSORS
        self.assertEqual(int(pushes.group(1)), STEPS * per_step, out)
        return report

    def test_accumulation_with_the_servers_adamw(self):
        report = self.check("accumulate", SERVERS_ADAMW, "--accumulate", "2", "--backward-passes")
        self.assertEqual(report, {})  # no local optimizer

    def test_clipping_the_averaged_gradient(self):
        report = self.check("clip", "sum", "--clip", "1.0", "--local-optimizer", "momentum",
                            "--lr", "0.1")
        self.assertGreater(int(report["clipped"]), 0)
        self.assertLess(int(report["clipped"]), STEPS)

    def test_grad_scaler(self):
        report = self.check("amp", "sum", "--amp", "--local-optimizer", "momentum", "--lr", "0.1")
        self.assertGreater(int(report["skipped"]), 0)  # it overflowed and backed off
        self.assertEqual(int(report["clipped"]), 0)

    def test_the_whole_ddp_script(self):
        report = self.check("script", "sum", *SCRIPT)
        self.assertGreater(int(report["clipped"]), 0)
        self.assertGreater(int(report["skipped"]), 0)
        self.assertEqual(float(report["lr"]), 0.0)  # the cosine annealed it to its end

    def test_the_whole_ddp_script_with_the_servers_adamw(self):
        report = self.check("at-step", SERVERS_ADAMW, *SERVER_SCRIPT_AT_STEP)
        self.assertGreater(int(report["clipped"]), 0)
        self.assertLess(int(report["clipped"]), STEPS)
        self.assertGreater(int(report["skipped"]), 0)  # every rank skipped those steps
        self.assertEqual(float(report["lr"]), 0.0)

    def test_clipping_under_the_servers_momentum(self):
        report = self.check("at-step-clip", SERVERS_MOMENTUM, "--clip", "1.0", "--lr", "0.1",
                            "--at-step")
        self.assertGreater(int(report["clipped"]), 0)
        self.assertLess(int(report["clipped"]), STEPS)
        self.assertEqual(int(report["skipped"]), 0)

    def test_resuming_from_a_checkpoint(self):
        """The script stopped after epoch 1 (every process gone, rank 0's checkpoint
        on disk) and resumed: its losses are the uninterrupted reference's."""
        self.resume_script("script", "sum", SCRIPT)

    def test_resuming_the_whole_script_at_step(self):
        """The same with the servers' AdamW at the script's step: the checkpoint
        holds the servers' state (a skipped step moved versions, not Adam's t)."""
        self.resume_script("at-step", SERVERS_ADAMW, SERVER_SCRIPT_AT_STEP)

    def resume_script(self, name, optimizer, flags):
        ref = self.reference(name, optimizer, flags)
        checkpoint = os.path.join(self.tmp.name, name + ".pt")
        first, out1 = self.run_job(name + "-first-half", optimizer, flags, "--checkpoint",
                                   checkpoint, "--stop-after", "1")
        second, out2 = self.run_job(name + "-second-half", optimizer, flags, "--resume",
                                    checkpoint)
        for r in range(WORKERS):
            want, want_report = self.read(ref, f"w{r}")
            got = np.concatenate([self.read(first, f"w{r}")[0], self.read(second, f"w{r}")[0]])
            self.assertTrue(np.array_equal(got, want),
                            f"w{r}'s losses differ from the reference's\n{out1}\n{out2}")
            self.assertEqual(self.read(second, f"w{r}")[1], want_report, out2)


    def test_schedule_and_adamw_on_the_servers(self):
        """The servers' AdamW with every step's rate set by torch's schedulers on the
        script's optimizer, handed to them: bit for bit the reference's."""
        report = self.check("server-schedule", SERVERS_ADAMW, "--lr", "0.01", "--schedule")
        self.assertEqual(float(report["lr"]), 0.0)  # the cosine annealed it to its end

    def resume(self, name, optimizer, flags):
        """HALVES epochs with a checkpoint every epoch, every process stopped, HALVES more
        from rank 0's last checkpoint: the losses of 2 x HALVES uninterrupted epochs."""
        common = ["--epochs", str(2 * HALVES), "--target", "0"]
        ref = self.reference(name, optimizer, flags, common)
        checkpoint = os.path.join(self.tmp.name, name + ".pt")
        first, out1 = self.run_job(name + "-first", optimizer, flags, "--checkpoint",
                                   checkpoint, "--stop-after", str(HALVES), common=common)
        second, out2 = self.run_job(name + "-second", optimizer, flags, "--resume", checkpoint,
                                    common=common)
        for r in range(WORKERS):
            want, want_report = self.read(ref, f"w{r}")
            got = np.concatenate([self.read(first, f"w{r}")[0], self.read(second, f"w{r}")[0]])
            self.assertEqual(len(got), len(want))
            self.assertTrue(np.array_equal(got, want),
                            f"{name}: w{r}'s losses differ from the reference's\n{out1}\n{out2}")
            self.assertEqual(self.read(second, f"w{r}")[1], want_report, out2)
        print(f"\n{name}: {HALVES} + {HALVES} epochs resumed from the servers' state, "
              f"{len(want)} losses per worker bit-identical to the reference's",
              file=sys.stderr)

    def test_resuming_the_servers_momentum(self):
        self.resume("resume-momentum", SERVERS_MOMENTUM, [])

    def test_resuming_the_servers_adam_with_the_whole_script(self):
        self.resume("resume-adam", SERVERS_ADAM, SERVER_SCRIPT)

    def test_resuming_with_bfloat16_on_the_wire(self):
        """--wire-dtype bfloat16 (a float32 model, the servers' float32 master parameters
        and momentum): 2 epochs with a checkpoint every epoch, every process stopped, 2
        more from rank 0's: the losses of the same job run 4 epochs unbroken (one process
        cannot emulate the wire's rounding; a BSP job's arithmetic is deterministic)."""
        flags = ["--wire-dtype", "bfloat16"]
        common = ["--epochs", "4", "--target", "0"]
        ref, out0 = self.run_job("resume-bf16-unbroken", SERVERS_MOMENTUM, flags, common=common)
        checkpoint = os.path.join(self.tmp.name, "resume-bf16.pt")
        first, out1 = self.run_job("resume-bf16-first", SERVERS_MOMENTUM, flags, "--checkpoint",
                                   checkpoint, "--stop-after", "2", common=common)
        second, out2 = self.run_job("resume-bf16-second", SERVERS_MOMENTUM, flags, "--resume",
                                    checkpoint, common=common)
        for r in range(WORKERS):
            want = self.read(ref, f"w{r}")[0]
            got = np.concatenate([self.read(first, f"w{r}")[0], self.read(second, f"w{r}")[0]])
            self.assertEqual(len(got), len(want))
            self.assertEqual(len(self.read(first, f"w{r}")[0]), len(want) // 2)
            self.assertTrue(np.array_equal(got, want),
                            f"w{r}'s losses differ from the unbroken run's\n{out0}\n{out1}\n{out2}")


if __name__ == "__main__":
    import digits_test

    digits_test.BUILD = os.path.abspath(sys.argv[1])
    unittest.main(argv=[sys.argv[0]], verbosity=2)
