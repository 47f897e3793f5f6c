"""Test support: a real `pgsse serve` (PGSSE_BIN) against a real PostgreSQL (PGSSE_TEST_DSN,
a migrated database), as clients/clients_test.go provides them."""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))   # the repository
sys.path.insert(0, os.path.dirname(HERE))                         # pgsse_hub
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

BIN = os.environ.get("PGSSE_BIN")
DSN = os.environ.get("PGSSE_TEST_DSN")


def need_server(test):
    """Live tests need the binary and the database; `make test` (clients/clients_test.go)
    always sets both, so there they never skip."""
    return unittest.skipUnless(BIN and DSN, "PGSSE_BIN and PGSSE_TEST_DSN are not set (run by clients/clients_test.go)")(test)


def sql(query):
    import psycopg
    with psycopg.connect(DSN, autocommit=True) as c:
        cur = c.execute(query)
        return cur.fetchall() if cur.description else None


def notify(channel, payload):
    import psycopg
    with psycopg.connect(DSN, autocommit=True) as c:
        c.execute("SELECT pg_notify(%s, %s)", (channel, payload))


def terminate_listen_session():
    """pg_terminate_backend of this database's pgsse-listen backend; the number terminated."""
    rows = sql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
               "WHERE application_name = 'pgsse-listen' AND datname = current_database()")
    return rows[0][0]


class Server:
    """One `pgsse serve` process with a hub socket in a fresh temp dir."""

    def __init__(self, *extra):
        self.dir = tempfile.mkdtemp(prefix="pgsse-py-")
        self.socket = os.path.join(self.dir, "hub.sock")
        self.log = open(os.path.join(self.dir, "serve.log"), "w+b")
        self.proc = subprocess.Popen(
            [BIN, "serve", "--database-url", DSN, "--listen", "127.0.0.1:0", "--admin-listen", "",
             "--hub-socket", self.socket, "--jwt-secret", "0123456789abcdef0123456789abcdef",
             "--retention", "0", "--log-level", "debug", *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.socket)
                break                     # the socket answering is the signal
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("pgsse serve exited:\n" + self.output())
                if time.monotonic() > deadline:
                    raise RuntimeError("the hub socket does not answer after 30 s:\n" + self.output())
                time.sleep(0.02)
            finally:
                s.close()

    def output(self, tail=4000):
        """The server's log so far (its last tail characters; None = all of it)."""
        self.log.flush()
        self.log.seek(0)
        text = self.log.read().decode(errors="replace")
        return text if tail is None else text[-tail:]

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(20)

    def stop(self):
        """SIGTERM: pgsse drains (the hub sends SHUTDOWN) and exits."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("pgsse serve did not exit within 20 s of SIGTERM")

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Collector:
    """Callbacks that record events, with waits that fail the test after a deadline."""

    def __init__(self, client):
        self.client = client

    def next(self, timeout=10, what="an event"):
        ev = self.client.next_event(timeout)
        if ev is None:
            raise AssertionError(f"no {what} within {timeout} s")
        return ev

    def next_notification(self, timeout=10):
        skipped = []
        deadline = time.monotonic() + timeout
        while True:
            ev = self.client.next_event(max(0.01, deadline - time.monotonic()))
            if ev is None:
                raise AssertionError(f"no notification within {timeout} s; saw {skipped}")
            if ev.kind == "notification":
                return ev
            skipped.append(ev)
