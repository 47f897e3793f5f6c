"""The README's examples, as files: the worker (examples/worker.py) with its psycopg session
receives through the hub, and from its own session once pgsse stops — with no traceback."""
import os
import re
import subprocess
import sys
import threading
import time
import unittest

import support
from support import Server, need_server, notify

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(*parts):
    with open(os.path.join(*parts), encoding="utf-8") as f:
        return f.read()


class ExamplesAreDocumented(unittest.TestCase):
    def test_readme_and_hub_protocol_show_the_example_files(self):
        readme = read(HERE, "README.md")
        for name in ("worker.py", "psycopg_session.py"):
            self.assertIn("```python\n" + read(HERE, "examples", name) + "```", readme, f"clients/python/README.md shows examples/{name}")
        self.assertIn("```python\n" + read(HERE, "examples", "worker.py") + "```", read(support.ROOT, "docs", "hub-protocol.md"))


class Lines:
    """A process's output lines, read on a thread; wait() for one matching a pattern."""

    def __init__(self, stream):
        self.lines, self.cv = [], threading.Condition()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream):
        for line in stream:
            with self.cv:
                self.lines.append(line.decode(errors="replace").rstrip("\n"))
                self.cv.notify_all()

    def wait(self, pattern, timeout=30, poke=None):
        deadline = time.monotonic() + timeout
        with self.cv:
            while not any(re.search(pattern, l) for l in self.lines):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no line matching {pattern!r} within {timeout} s; got {self.lines}")
                if poke:
                    self.cv.release()
                    try:
                        poke()
                    finally:
                        self.cv.acquire()
                self.cv.wait(min(left, 0.2))

    def text(self):
        with self.cv:
            return "\n".join(self.lines)


@need_server
class WorkerExample(unittest.TestCase):
    def test_worker_fails_over_without_a_traceback(self):
        server = Server()
        self.addCleanup(server.close)
        env = dict(os.environ, PGSSE_HUB_SOCKET=server.socket, DATABASE_URL=support.DSN, PYTHONPATH=HERE)
        p = subprocess.Popen([sys.executable, os.path.join(HERE, "examples", "worker.py")], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.addCleanup(lambda: (p.kill(), p.wait(), p.stdout.close(), p.stderr.close()))
        out, err = Lines(p.stdout), Lines(p.stderr)
        # Until it has subscribed nothing reaches it: notify until one arrives.
        out.wait(r"^job jobs hub$", poke=lambda: notify("jobs", "hub"))
        server.stop()
        out.wait(r"^re-read every job$")
        notify("jobs", "own session")
        out.wait(r"^job jobs own session$")
        self.assertIsNone(p.poll(), "the worker keeps running on its own session")
        self.assertNotIn("Traceback", err.text())
        self.assertRegex(err.text(), r"shutdown: pgsse is shutting down.*switching to the application's own LISTEN session")


if __name__ == "__main__":
    unittest.main()
