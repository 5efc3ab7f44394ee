#!/usr/bin/python3
"""The C ABI keeps old trainers working as it grows, checked with real
binaries, the dynamic linker and a real job.

Builds abi_trainer.c twice: against the frozen 0.3.0 header (v1/), linked
against a stand-in of that library (same SONAME, no symbol versions), as a
trainer built before mercury_worker_options carried its size; and against
today's header, linked against the library under test. Checks the ELF facts
the compatibility rests on (the old binary's references are unversioned; the
library's oldest version is MERCURY_1, holding the old entry points, and
MERCURY_2 the default), that the stand-in really is inert, then runs one job
over net_memif (config/memif.yaml, optimizer sum): ps-server and four trainers
with the library under test on the library path: w0 and w3 the old binary, w1
the new one, w2 the new one with the struct of a caller built against a newer
header (a nonzero unknown field is refused, zeros are accepted). Every trainer must deliver version 0 and every
round's aggregate bit for bit and exit 0; the server must end the job.

  abi_test.py BUILD_DIR SOURCE_DIR CONFIG_DIR    (SOURCE_DIR: pmd-tests/worker/abi)
"""
import os
import re
import subprocess
import sys
import tempfile

CFLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off"]


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          check=False, **kw)


def must(cmd):
    r = run(cmd)
    if r.returncode != 0:
        raise SystemExit("%s: exit %d\n%s" % (" ".join(cmd), r.returncode, r.stdout))
    return r.stdout


def elf_checks(library, old, new):
    """The facts glibc's binding rests on. Returns a list of problems."""
    problems = []
    dyn = must(["readelf", "--dyn-syms", "-W", library])
    for fn in ("mercury_worker_options_init", "mercury_worker_connect"):
        for v in ("@MERCURY_1", "@@MERCURY_2"):
            if not re.search(r"\bFUNC\s+GLOBAL\s+DEFAULT\s+\d+\s+%s%s$" % (fn, v), dyn, re.M):
                problems.append("the library does not define %s%s" % (fn, v))
    if re.search(r"\bv1_mercury", dyn):
        problems.append("the library exports the v1_ implementation names")
    # glibc binds an unversioned reference to a library's oldest version: the
    # first after the base (index 2) must be MERCURY_1.
    ver = must(["readelf", "-V", "-W", library])
    if not re.search(r"Index: 2 .*Name: MERCURY_1\b", ver):
        problems.append("MERCURY_1 is not the library's oldest version (index 2):\n" + ver)
    soname = re.search(r"SONAME.*\[(.*)\]", must(["readelf", "-d", library]))
    if not soname or soname.group(1) != "libmercury-worker.so.1":
        problems.append("the SONAME is %s, not libmercury-worker.so.1" % soname)
    old_ver = must(["readelf", "-V", "-W", old])
    if "File: libmercury-worker.so.1" in old_ver:
        problems.append("the old trainer's references are versioned:\n" + old_ver)
    old_dyn = must(["readelf", "--dyn-syms", "-W", old])
    if not re.search(r"UND mercury_worker_connect$", old_dyn, re.M):
        problems.append("the old trainer has no unversioned mercury_worker_connect:\n" + old_dyn)
    new_ver = must(["readelf", "-V", "-W", new])
    if not re.search(r"File: libmercury-worker\.so\.1[^\n]*\n(\s+0x\w+:\s+Name: MERCURY_\d[^\n]*\n)*"
                     r"\s+0x\w+:\s+Name: MERCURY_2", new_ver):
        problems.append("the new trainer does not need MERCURY_2:\n" + new_ver)
    return problems


def main():
    build, src, config_dir = sys.argv[1:4]
    libdir = os.path.join(build, "lib", "worker")
    library = os.path.join(libdir, "libmercury-worker.so.1")
    include = os.path.join(src, "..", "..", "..", "lib", "worker", "include")
    trainer = os.path.join(src, "abi_trainer.c")
    with tempfile.TemporaryDirectory(prefix="wk-abi-") as tmp:
        standin = os.path.join(tmp, "standin")
        os.mkdir(standin)
        must(["cc"] + CFLAGS + ["-shared", "-fPIC", "-I", os.path.join(src, "v1"),
                                os.path.join(src, "standin_v1.c"),
                                "-Wl,-soname,libmercury-worker.so.1",
                                "-o", os.path.join(standin, "libmercury-worker.so.1")])
        os.symlink("libmercury-worker.so.1", os.path.join(standin, "libmercury-worker.so"))
        old = os.path.join(tmp, "trainer_0.3.0")
        new = os.path.join(tmp, "trainer_today")
        must(["cc"] + CFLAGS + ["-DABI_V1", "-I", os.path.join(src, "v1"), trainer,
                                "-L", standin, "-lmercury-worker", "-o", old])
        must(["cc"] + CFLAGS + ["-I", include, trainer, "-L", libdir, "-lmercury-worker",
                                "-o", new])
        problems = elf_checks(library, old, new)

        # The stand-in is for the linker only: loaded, it aborts.
        r = run([old, "/nonexistent.yaml", "w0"], env=dict(os.environ, LD_LIBRARY_PATH=standin))
        if r.returncode != -6:
            problems.append("the old trainer on the stand-in: exit %d, not SIGABRT" % r.returncode)

        # The shipped four-worker job, made unique to this run, with optimizer
        # sum: what comes back is the rank-order average, which the trainers
        # check bit for bit.
        text = open(os.path.join(config_dir, "memif.yaml")).read()
        text = text.replace("/tmp/mercury/", tmp + "/")
        text = re.sub(r"(\n  name:) memif", r"\1 wkabi%d" % os.getpid(), text)
        text, n = re.subn(r"optimizer: \w+\n(\s+learning_rate: \S+.*\n)?", "optimizer: sum\n",
                          text)
        if n != 1:
            raise SystemExit("config/memif.yaml: no training.optimizer to replace")
        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as f:
            f.write(text)
        env = dict(os.environ, LD_LIBRARY_PATH=libdir)
        server = subprocess.Popen([os.path.join(build, "apps", "ps-server"), "--config", job,
                                   "--seconds", "100"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        commands = {"w0": [old, job, "w0"], "w1": [new, job, "w1"],
                    "w2": [new, job, "w2", "newer"], "w3": [old, job, "w3"]}
        workers = {}
        outs = {}
        try:
            for n, c in commands.items():
                workers[n] = subprocess.Popen(c, env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True)
            for n, w in workers.items():
                try:
                    outs[n], _ = w.communicate(timeout=120)
                except subprocess.TimeoutExpired:
                    w.kill()
                    outs[n], _ = w.communicate()
                    problems.append("%s timed out" % n)
                print("--- %s (exit %d)\n%s" % (n, w.returncode, outs[n]), end="")
                if w.returncode != 0 or "3 rounds of push_pull exact" not in outs[n]:
                    problems.append("%s: exit %d, not every round exact" % (n, w.returncode))
            try:
                out, _ = server.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                out, _ = server.communicate()
                problems.append("ps-server did not end with the job")
            print("--- server0 (exit %d)\n%s" % (server.returncode, out[-2000:]), end="")
            if server.returncode != 0 or "every worker left; the job is done" not in out:
                problems.append("ps-server: exit %d, the job did not end" % server.returncode)
        finally:
            for p in list(workers.values()) + [server]:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        old_layout = "the 0.3.0 layout (56 bytes), defaults set, nothing written past it"
        expected = {"w0": old_layout, "w3": old_layout,
                    "w1": "options: today's layout",
                    "w2": "sets an option this library does not have"}
        for n, line in expected.items():
            if line not in outs.get(n, ""):
                problems.append("%s did not say %r" % (n, line))
    for p in problems:
        print("FAILED: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
