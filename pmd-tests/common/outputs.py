"""A process test's wait for one of its processes."""
import subprocess


def output(p, timeout_s):
    """(status, output) of Popen `p` (stdout piped, text), killed if it is still running
    after timeout_s, which its output then says."""
    try:
        text, _ = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        text, _ = p.communicate()
        text += "\n(killed after %d s)" % timeout_s
    return p.returncode, text
