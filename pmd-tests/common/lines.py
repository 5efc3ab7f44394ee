"""A process's output read line by line on a thread of its own, each line with the time
(time.monotonic()) it was read: for the tests and benchmarks that act on what a process
printed (kill a server at a round) and time it."""
import re
import threading
import time


class Lines:
    def __init__(self, proc):
        self.proc = proc
        self.lines = []  # (time read, line)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line))

    def text(self):
        return "".join(line for _, line in self.lines)

    def first(self, pattern, after=0.0):
        """The time of the first line read at or after `after` that matches, or None."""
        for t, line in list(self.lines):
            if t >= after and re.search(pattern, line):
                return t
        return None
