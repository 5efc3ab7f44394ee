#!/usr/bin/python3
"""A shard's optimizer (lib/agg) against the same updates computed in torch.

For SGD, momentum and Adam with weight decay (L2), and AdamW: torch's own scheduler
(a linear warm-up, then cosine annealing: SequentialLR of LinearLR and
CosineAnnealingLR) gives every step's learning rate. The digits job's one-process
reference (apps/train-digits, ServerArithmetic: the servers' formulas one float32
torch operation at a time) applies them, and so does agg_optimizer_replay: lib/agg's
ShardOptimizer, each step's rate a versioned setting from that step's version, with
every chunk and the settings written as checkpoint records half-way and read back
into fresh memory. Parameters and optimizer state must be equal bit for bit. Then
torch's own optimizer (torch.optim.SGD, Adam, AdamW) on the same averaged gradients
must agree within a relative 1e-5: the same mathematics, rounded in another order.

Usage: optimizer_torch_test.py AGG_OPTIMIZER_REPLAY
"""
import os
import subprocess
import sys
import tempfile
import unittest
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "apps" / "train-digits"))
from train_digits import ServerArithmetic  # noqa: E402

REPLAY = None
WORKERS = 4
ELEMENTS = 1000
CHUNK = 352  # elements: two whole chunks and a short one
STEPS = 24
WARMUP = 5
BASE_LR = 0.05


def schedule():
    """Every step's learning rate as torch's schedulers give it."""
    from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=BASE_LR)
    # torch 1.13's SequentialLR steps its first scheduler with an epoch at
    # construction, which warns of that argument's deprecation.
    warnings.filterwarnings("ignore", "The epoch parameter", UserWarning)
    sched = SequentialLR(opt, [LinearLR(opt, start_factor=0.1, total_iters=WARMUP),
                               CosineAnnealingLR(opt, T_max=STEPS - WARMUP,
                                                 eta_min=BASE_LR / 100)],
                         milestones=[WARMUP])
    lrs = []
    for _ in range(STEPS):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def f32(x):
    """x rounded to float32, written so that a C++ stream reads that float back."""
    return repr(float(np.float32(x)))


class Replay(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.lrs = schedule()
        g = torch.Generator().manual_seed(5)
        cls.initial = torch.randn(ELEMENTS, generator=g)
        # Each rank's gradients at its own scale, as real ranks' differ.
        cls.grads = [[torch.randn(ELEMENTS, generator=g) * (0.1 + r) for r in range(WORKERS)]
                     for _ in range(STEPS)]

    def reference(self, training):
        param = self.initial.clone()
        ref = ServerArithmetic(training, [param], WORKERS)
        for s in range(STEPS):
            ref.set(learning_rate=self.lrs[s])
            ref.step([[self.grads[s][r]] for r in range(WORKERS)])
        state = {"sgd": [], "momentum": [ref.s0[0]]}.get(training["optimizer"],
                                                          [ref.s0[0], ref.s1[0]])
        return param, state

    def replay(self, training):
        t = training
        with tempfile.TemporaryDirectory() as tmp:
            data, out, spec = (os.path.join(tmp, n) for n in ("data", "out", "spec"))
            with open(data, "wb") as f:
                f.write(self.initial.numpy().astype("<f4").tobytes())
                for s in range(STEPS):
                    for r in range(WORKERS):
                        f.write(self.grads[s][r].numpy().astype("<f4").tobytes())
            lines = [f"optimizer {t['optimizer']}", f"workers {WORKERS}", f"elements {ELEMENTS}",
                     f"chunk {CHUNK}", f"steps {STEPS}", f"stop {STEPS // 2}",
                     f"data {data}", f"out {out}"]
            for s in range(STEPS):
                lines.append(" ".join(["set", str(s)] + [f32(v) for v in (
                    self.lrs[s], t.get("momentum", 0.9), t.get("weight_decay", 0.0),
                    t.get("beta1", 0.9), t.get("beta2", 0.999), t.get("epsilon", 1e-8))]))
            with open(spec, "w") as f:
                f.write("\n".join(lines) + "\n")
            r = subprocess.run([REPLAY, spec], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            arrays = np.fromfile(out, dtype="<f4").reshape(-1, ELEMENTS)
        return torch.from_numpy(arrays[0].copy()), [torch.from_numpy(a.copy())
                                                    for a in arrays[1:]]

    def torch_own(self, training):
        """torch.optim's optimizer of the same kind on the servers' averaged gradients."""
        t = training
        param = torch.nn.Parameter(self.initial.clone())
        kind, wd = t["optimizer"], t.get("weight_decay", 0.0)
        if kind in ("sgd", "momentum"):
            opt = torch.optim.SGD([param], lr=BASE_LR, weight_decay=wd,
                                  momentum=t.get("momentum", 0.9) if kind == "momentum" else 0)
        else:
            cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
            opt = cls([param], lr=BASE_LR, weight_decay=wd, betas=(0.9, 0.999), eps=1e-8)
        inv_n = torch.tensor(1.0) / WORKERS
        for s in range(STEPS):
            g = self.grads[s][0].clone()
            for r in range(1, WORKERS):
                g = g + self.grads[s][r]
            param.grad = g * inv_n
            opt.param_groups[0]["lr"] = self.lrs[s]
            opt.step()
        return param.detach()

    def check(self, training):
        want, want_state = self.reference(training)
        got, got_state = self.replay(training)
        self.assertFalse(torch.equal(want, self.initial), "the reference did not train")
        self.assertEqual(len(got_state), len(want_state))
        for name, a, b in [("parameters", got, want)] + [
                (f"state array {i}", x, y) for i, (x, y) in enumerate(zip(got_state, want_state))]:
            differ = (a.view(torch.int32) != b.view(torch.int32)).nonzero()
            self.assertEqual(len(differ), 0,
                             f"{training}: {name} differ from torch's at {len(differ)} elements, "
                             f"e.g. {differ[:3].flatten().tolist()}")
        own = self.torch_own(training)
        rel = ((own - want).abs().max() / own.abs().max()).item()
        print(f"{training['optimizer']:9s} wd {training.get('weight_decay', 0.0)}: bit-identical "
              f"to the torch reference; torch.optim differs by {rel:.1e} (relative, largest)",
              file=sys.stderr)
        self.assertLess(rel, 1e-5)

    def test_sgd_with_weight_decay(self):
        self.check({"optimizer": "sgd", "weight_decay": 0.01})

    def test_momentum_with_weight_decay(self):
        self.check({"optimizer": "momentum", "momentum": 0.9, "weight_decay": 0.01})

    def test_adam_with_weight_decay(self):
        self.check({"optimizer": "adam", "weight_decay": 0.01})

    def test_adamw(self):
        self.check({"optimizer": "adamw", "weight_decay": 0.05})

    def test_the_schedule_warms_up_then_anneals(self):
        lrs = self.lrs
        self.assertAlmostEqual(lrs[0], BASE_LR * 0.1)
        self.assertTrue(all(a < b for a, b in zip(lrs[:WARMUP], lrs[1:WARMUP + 1])), lrs)
        self.assertAlmostEqual(max(lrs), BASE_LR)
        self.assertTrue(all(a > b for a, b in zip(lrs[WARMUP:-1], lrs[WARMUP + 1:])), lrs)


if __name__ == "__main__":
    REPLAY = os.path.abspath(sys.argv[1])
    torch.set_num_threads(1)
    unittest.main(argv=[sys.argv[0]], verbosity=2)
