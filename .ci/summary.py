#!/usr/bin/python3
"""Counts test cases across meson build directories and prints the line CI reads.

A gtest binary contributes one case per TEST; a binary that crashed or failed
without a failing case (or a non-gtest test) counts as one failed case.
The last lines of every failed test's output go to stderr first, so a CI log
says why without the build directory.
Usage: summary.py BUILD_DIR [BUILD_DIR ...]
"""
import json
import os
import sys
import xml.etree.ElementTree as ET

TAIL_LINES = 80

passed = failed = skipped = 0
failures = []
tails = []
for build in sys.argv[1:]:
    log = os.path.join(build, "meson-logs", "testlog.json")
    junit = os.path.join(build, "meson-logs", "testlog.junit.xml")
    if not os.path.exists(log):
        continue
    cases_by_binary = {}
    if os.path.exists(junit):
        for suite in ET.parse(junit).getroot().iter("testsuite"):
            name = suite.attrib.get("name", "")
            for case in suite.iter("testcase"):
                key = name
                cases_by_binary.setdefault(key, []).append(case)
    for line in open(log):
        entry = json.loads(line)
        name = entry["name"]
        result = entry["result"]
        if result not in ("OK", "EXPECTEDFAIL", "SKIP"):
            # meson keeps a test's stderr apart ("stderr", only when non-empty);
            # unittest and most failures write there.
            text = (entry.get("stdout") or "") + (entry.get("stderr") or "")
            out = text.splitlines()[-TAIL_LINES:]
            tails.append((name, result, out))
        # junit suites are named "<project>.<test>.<TestSuite>"
        cases = [c for k, cs in cases_by_binary.items() if k.split(".")[1:2] == [name]
                 for c in cs]
        bad_cases = [c for c in cases if c.find("failure") is not None or c.find("error") is not None]
        skip_cases = [c for c in cases if c.find("skipped") is not None]
        good_cases = len(cases) - len(bad_cases) - len(skip_cases)
        if cases:
            passed += good_cases
            failed += len(bad_cases)
            skipped += len(skip_cases)
            failures += [f"{name}: {c.attrib.get('classname', '')}.{c.attrib.get('name', '')}"
                         for c in bad_cases]
            if result not in ("OK", "EXPECTEDFAIL") and not bad_cases:
                failed += 1
                failures.append(f"{name}: exited {result} after its cases")
        elif result in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif result == "SKIP":
            skipped += 1
        else:
            failed += 1
            failures.append(f"{name}: {result}")

for name, result, out in tails:
    print(f"===== {name} ({result}): last {len(out)} lines of its output =====", file=sys.stderr)
    for text in out:
        print(text, file=sys.stderr)
sys.stderr.flush()
for f in failures:
    print(f"FAILED {f}")
line = f"{passed} passed, {failed} failed"
if skipped:
    line += f", {skipped} skipped"
print(line)
sys.exit(1 if failed else 0)
