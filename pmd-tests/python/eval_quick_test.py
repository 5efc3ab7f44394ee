#!/usr/bin/python3
"""`make eval-quick`: one small point of every experiment of the evaluation
(benchmarks/eval/eval.py --quick), so the harness cannot rot.

Runs it into a temporary directory and checks what it wrote: every experiment's CSV
holds its runs with sane values (no trace round faster than its compute, accuracies in
[0, 1], images per second = the batch over the iteration), the timelines and the plots
exist, the second job of the shared-link experiment ran while the measured one did, the
trace-driven runs with a straggler kept rank 0 off the straggler's pace except under BSP, the
ResNet-18 runs' figures agree with one another (images per second from the step, the bound
the larger of compute and communication), and the page has every section with a row of
data and its goal lines.

Usage: eval_quick_test.py BUILD_DIR
"""
import csv
import json
import os
import subprocess
import sys
import tempfile
import unittest

BUILD = None
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def eval_module():
    """benchmarks/eval/eval.py, imported (its helpers and constants)."""
    here = os.path.join(ROOT, "benchmarks", "eval")
    if here not in sys.path:
        sys.path.insert(0, here)
    import eval as ev
    return ev


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


class EvalQuick(unittest.TestCase):
    def test_every_experiment_writes_its_data_plots_and_page(self):
        with tempfile.TemporaryDirectory() as tmp:
            work = os.path.join(tmp, "runs")
            r = subprocess.run(
                ["/usr/bin/python3", os.path.join(ROOT, "benchmarks", "eval", "eval.py"),
                 "--build", BUILD, "--quick", "--out", tmp, "--work", work],
                capture_output=True, text=True, timeout=960)
            self.assertEqual(r.returncode, 0, r.stdout[-4000:] + r.stderr[-3000:])
            self.assertIn("[eval ", r.stdout)  # progress lines
            data = os.path.join(tmp, "evaluation")

            sched = rows(os.path.join(data, "sched.csv"))
            self.assertEqual(sorted(x["variant"] for x in sched),
                             ["fifo", "fifo_chunk", "partition", "partition_best", "strict"])
            for x in sched:
                it, cp = float(x["iteration_s"]), float(x["compute_s"])
                self.assertGreater(cp, 0, x)
                # Emulated compute is chained sleeps: no round is shorter than it.
                self.assertGreaterEqual(it, 0.99 * cp, x)
                # Only strict's runs measure the bound; the others run no comm-only rounds.
                if x["variant"] == "strict":
                    lb = float(x["bound_s"])
                    self.assertAlmostEqual(lb, max(cp, float(x["communication_s"])), places=3)
                else:
                    self.assertEqual((x["communication_s"], x["bound_s"], x["ratio"]),
                                     ("", "", ""), x)
            self.assertEqual(len(rows(os.path.join(data, "sweep.csv"))), 1)
            for v in ["strict", "fifo", "partition"]:
                self.assertGreater(os.path.getsize(os.path.join(work, f"timeline-{v}.json")), 0)

            bandwidth = rows(os.path.join(data, "bandwidth.csv"))
            self.assertEqual({x["variant"] for x in bandwidth}, {"strict", "fifo", "partition_best"})
            for v in ["strict", "fifo", "partition_best"]:
                got = [x for x in bandwidth if x["variant"] == v]
                self.assertEqual([int(x["round"]) for x in got], list(range(1, 7)), v)
                starts = [float(x["start_s"]) for x in got]
                self.assertEqual(starts, sorted(starts), v)

            # The second job ran while the measured one did: its rounds ended meanwhile.
            shared = rows(os.path.join(data, "shared.csv"))
            self.assertEqual(sorted(x["variant"] for x in shared),
                             ["fifo", "partition_best", "strict"])
            for x in shared:
                self.assertGreater(float(x["iteration_s"]), 0, x)
                self.assertGreaterEqual(int(x["other_rounds"]), 1, x)
                self.assertGreater(float(x["other_iteration_s"]), 0, x)

            sync = rows(os.path.join(data, "sync.csv"))
            self.assertEqual(sorted(x["mode"] for x in sync), ["asp", "bsp", "psplus", "ssp"])
            for x in sync:
                self.assertGreater(float(x["iteration_s"]), 0, x)
                self.assertTrue(0 <= float(x["final_accuracy"]) <= 1, x)
            # The servers' staleness: none under BSP; PS+'s workers compute from the newest
            # versions they are sent (marked as read), so its updates are fresher than ASP's.
            stale = {x["mode"]: float(x["staleness"]) for x in sync}
            self.assertEqual(stale["bsp"], 0, stale)
            self.assertGreater(stale["asp"], 0, stale)
            self.assertLess(stale["psplus"], stale["asp"], stale)
            # Per mode, 2 epochs of 22 steps: each epoch's end with its training loss and, with
            # --curve-every 2, steps 2, 4, ..., 20 of each epoch with the test accuracy alone.
            curves = rows(os.path.join(data, "sync_curves.csv"))
            for mode in ["asp", "bsp", "psplus", "ssp"]:
                got = [x for x in curves if x["mode"] == mode]
                self.assertEqual([int(x["steps"]) for x in got],
                                 [*range(2, 22, 2), 22, *range(24, 44, 2), 44], mode)
                self.assertEqual([bool(x["loss"]) for x in got],
                                 [int(x["steps"]) % 22 == 0 for x in got], mode)
                seconds = [float(x["seconds"]) for x in got]
                self.assertEqual(seconds, sorted(seconds), mode)
                for x in got:
                    self.assertTrue(0 <= float(x["accuracy"]) <= 1, x)

            # The trace trainer with rank 3 computing 4x longer: under BSP rank 0 waits for it
            # every round, under ASP and PS+ it does not.
            models = {x["mode"]: x for x in rows(os.path.join(data, "sync_models.csv"))}
            self.assertEqual(sorted(models), ["asp", "bsp", "psplus", "ssp"])
            for mode, x in models.items():
                fast, slow = float(x["iteration_mean_s"]), float(x["straggler_iteration_mean_s"])
                self.assertGreater(fast, 0, x)
                if mode == "bsp":
                    self.assertGreater(fast, 0.75 * slow, x)
                elif mode in ("asp", "psplus"):
                    self.assertLess(fast, 0.75 * slow, x)

            ddp = rows(os.path.join(data, "ddp.csv"))
            self.assertEqual(sorted(x["system"] for x in ddp), ["ddp", "mercury"])
            for x in ddp:
                want = 64 / float(x["iteration_s"])
                self.assertAlmostEqual(float(x["images_per_s"]), want, delta=1 + 1e-4 * want)

            # ResNet-18: one Mercury and one DDP run, each timed against its own bound.
            resnet18 = rows(os.path.join(data, "resnet18.csv"))
            self.assertEqual(sorted(x["variant"] for x in resnet18), ["ddp", "mercury_bf16"])
            for x in resnet18:
                self.assertEqual(x["not_run"], "", x)
                step, bound = float(x["step_s"]), float(x["bound_s"])
                want = 4 * 32 / step
                self.assertAlmostEqual(float(x["images_per_s"]), want, delta=1e-4 * want)
                self.assertAlmostEqual(bound, max(float(x["compute_s"]), float(x["comm_s"]),
                                                  float(x["cpu_bound_s"])), places=4)
                # The machine's busy CPU time of a compute step and a communication round
                # over its CPUs: four ranks computed, so above zero.
                self.assertGreater(float(x["cpu_bound_s"]), 0, x)
                self.assertAlmostEqual(float(x["ratio_to_bound"]), step / bound, delta=1e-3)
                self.assertGreater(float(x["compute_s"]), 0, x)
                self.assertGreater(float(x["comm_s"]), 0, x)
                self.assertTrue(0 <= float(x["accuracy"]) <= 1, x)

            for png in ["sched-10g.png", "timeline.png", "bandwidth.png", "sync.png"]:
                path = os.path.join(data, png)
                with open(path, "rb") as f:
                    self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n", path)

            with open(os.path.join(tmp, "evaluation.md")) as f:
                page = f.read()
            for heading in ["## Setting", "## Goals", "## 1. Scheduling",
                            "## 2. Changing bandwidth", "## 3. Synchron",
                            "## 4. Against DistributedDataParallel",
                            "## 5. ResNet-18 against DistributedDataParallel", "## Reading"]:
                self.assertIn(heading, page)
            self.assertIn("| mobilenet_v2 | ", page)
            self.assertIn("| 1 | psplus | ", page)
            self.assertIn("### The models, trace-driven, with one straggler", page)
            self.assertIn("| mobilenet_v2 | ", page.split("### The models, trace-driven")[1])
            self.assertIn("| partition best | ", page)
            self.assertIn("### A second job on the same links", page)
            self.assertIn("strict's dependency ratio", page)
            self.assertIn("| FIFO (classical PS) | ", page.split("### A second job")[1])
            self.assertIn("| Mercury (mercury.torch", page)
            self.assertIn("Strict priority >= 2x FIFO", page)
            self.assertIn("mercury.torch faster per iteration than DDP", page)
            self.assertIn("| Mercury, bfloat16 on the wire | ", page)
            self.assertIn("| DDP over gloo, float32 | ", page)
            self.assertIn("* ResNet-18, 4 workers: Mercury, bfloat16 on the wire >= 1.5x", page)
            # Every CSV notes the code its runs came from, and the page names it.
            ev = eval_module()
            codes = ev.read_codes(work)
            self.assertEqual(sorted(codes), sorted(n for n in os.listdir(work)
                                                   if n.endswith(".csv")))
            self.assertEqual({tuple(v) for v in codes.values()}, {(ev.code_version(),)})
            self.assertIn(f"its runs by code {ev.code_version()}.", page)
            # Every part's wall time is recorded, and the page sums it.
            times = ev.read_times(work)
            self.assertEqual(sorted(times), sorted(ev.PARTS))
            self.assertTrue(all(t > 0 for t in times.values()), times)
            self.assertIn(f" The runs took {sum(times.values()) / 60:.1f} min of wall time "
                          "(sched ", page)
            self.assertIn("eval: this invocation's wall time by part: sched ", r.stdout)

            # The page is written from the records alone: rewriting it runs nothing.
            again = subprocess.run(
                ["/usr/bin/python3", os.path.join(ROOT, "benchmarks", "eval", "eval.py"),
                 "--build", BUILD, "--quick", "--out", tmp, "--work", work, "--page-only"],
                capture_output=True, text=True, timeout=120)
            self.assertEqual(again.returncode, 0, again.stderr[-2000:])
            self.assertNotIn("[eval ", again.stdout)

    def test_a_resumed_evaluation_adds_its_wall_time_to_what_was_recorded(self):
        ev = eval_module()
        with tempfile.TemporaryDirectory() as work:
            self.assertEqual(ev.runs_time(work), "")
            ev.add_time(work, "sched", 600)
            ev.add_time(work, "ddp", 30)
            ev.add_time(work, "sched", 300)  # resumed
            self.assertEqual(ev.read_times(work), {"sched": 900.0, "ddp": 30.0})
            self.assertEqual(ev.runs_time(work),
                             " The runs took 15.5 min of wall time (sched 15.0, ddp 0.5).")

    def test_the_page_names_each_code_once_with_the_data_it_recorded(self):
        ev = eval_module()
        with tempfile.TemporaryDirectory() as work:
            self.assertEqual(ev.runs_code(work), "the code of its runs was not recorded")
            codes = {"sched.csv": ["aaa"], "sync.csv": ["aaa"], "ddp.csv": ["bbb"],
                     "gone.csv": ["ccc"]}  # a CSV no longer there is not named
            for name in ["sched.csv", "sync.csv", "ddp.csv"]:
                open(os.path.join(work, name), "w").close()
            with open(ev.codes_path(work), "w") as f:
                json.dump(codes, f)
            self.assertEqual(ev.runs_code(work),
                             "its runs by code bbb (ddp.csv); aaa (sched.csv, sync.csv)")
            os.unlink(os.path.join(work, "ddp.csv"))
            self.assertEqual(ev.runs_code(work), "its runs by code aaa")

    def test_the_evaluation_judges_its_own_time_only_when_every_part_recorded_it(self):
        ev = eval_module()
        full, quick = ev.Settings(quick=False, trials=5), ev.Settings(quick=True, trials=5)

        def aim(times, st=full) -> list[str]:
            return [g for g in ev.goals({}, {}, {}, st, times) if "`make eval`" in g]

        parts = {p: 60.0 * (ev.EVAL_AIM_MIN - 1) / len(ev.PARTS) for p in ev.PARTS}
        self.assertEqual(aim(parts), [f"* `make eval` under about {ev.EVAL_AIM_MIN} minutes on "
                                      f"this machine: {ev.EVAL_AIM_MIN - 1:.1f} min of runs (the "
                                      "setting line has them by part), **met**."])
        over = dict(parts, sync=parts["sync"] + 120)
        self.assertTrue(aim(over)[0].endswith("**not met**."), aim(over))
        partial = {p: t for p, t in parts.items() if p != "ddp"}  # run with --only
        self.assertEqual(aim(partial), [f"* `make eval` under about {ev.EVAL_AIM_MIN} minutes "
                                        "on this machine: **not judged**: the wall time of ddp "
                                        "was not recorded."])
        self.assertEqual(aim(parts, quick), [])
        self.assertEqual(aim(None), [])

    def test_a_speed_up_within_the_timing_resolution_is_a_tie(self):
        ev = eval_module()
        st = ev.Settings(quick=False, trials=5)

        def never_slower(fifo: float) -> str:
            facts = {"fifo": fifo, "best": 1.2, "default": 1.3, "fifo_chunk": float("nan"),
                     "strict_s": 1.578, "ratio": 1.0, "dep_ratio": 1.0,
                     "comm_over_compute": 0.5}
            line = [g for g in ev.goals({(10, "m"): facts}, {}, {}, st) if "Never slower" in g]
            self.assertEqual(len(line), 1)
            return line[0]

        # 1.577 s against strict's 1.578 s: 1 ms, what an iteration is timed to.
        self.assertIn("**met**", never_slower(1.577 / 1.578))
        self.assertIn("**not met**: m at 10G (1.00x FIFO", never_slower(1.575 / 1.578))
        self.assertIn("**met**", never_slower(1.0))

    def test_the_dependency_bound_is_at_least_compute_and_the_wire_time(self):
        ev = eval_module()
        for model in ev.MODELS:
            for link in (10, 25):
                scale = ev.GPU_SCALE * ev.scale_of(link)
                fwd = bwd = size = 0.0
                with open(os.path.join(ROOT, "config", "traces", model + ".txt")) as f:
                    for line in f:
                        if line.strip() and not line.startswith("#"):
                            fwd += float(line.split()[1]) * 1e-6 * scale
                            bwd += float(line.split()[2]) * 1e-6 * scale
                with open(os.path.join(ROOT, "config", "models", model + ".txt")) as f:
                    for line in f:
                        if line.strip() and not line.startswith("#"):
                            size += 4 * int(line.split()[1])
                wire = size * 8 / (ev.LINK_EMULATED_GBPS * 1e9)
                bound, layer = ev.dependency_bound(model, link)
                self.assertGreater(bound, fwd + bwd, (model, link))
                self.assertGreater(bound, wire, (model, link))
                # It never exceeds compute plus the whole transfer (the sequential schedule).
                self.assertLessEqual(bound, fwd + bwd + wire + 1e-9, (model, link))
                self.assertTrue(layer, (model, link))


if __name__ == "__main__":
    BUILD = os.path.abspath(sys.argv[1])
    unittest.main(argv=[sys.argv[0], "-v"])
