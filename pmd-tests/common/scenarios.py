"""The main of a test made of named scenarios: each runs with the build directory and
a temporary directory of its own (removed after), returns None when it passed or the
failure's text, and prints one line; the exit status is 1 if any failed."""
import shutil
import sys
import tempfile


def run(scenarios, prefix, default=None):
    """argv: BUILD [SCENARIO...] (none: `default`, or every scenario)."""
    build = sys.argv[1]
    names = sys.argv[2:] or default or list(scenarios)
    failed = 0
    for name in names:
        tmp = tempfile.mkdtemp(prefix=prefix)
        try:
            err = scenarios[name](build, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print("%s: %s" % (name, "ok" if err is None else "FAILED\n" + err))
        failed += err is not None
    return 1 if failed else 0
