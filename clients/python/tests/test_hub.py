"""pgsse_hub against the real hub of a real `pgsse serve` and a real PostgreSQL."""
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import support
from support import Collector, Server, need_server, notify, sql
import pgsse_hub as h


@need_server
class HubClientLive(unittest.TestCase):
    def setUp(self):
        self.server = Server()
        self.addCleanup(self.server.close)
        self.hub = h.HubClient(self.server.socket, name="py-test")
        self.addCleanup(self.hub.close)
        self.events = Collector(self.hub)

    def test_ack_only_after_listen(self):
        # A NOTIFY sent the moment subscribe returned must arrive: the hub answered ACK OK
        # only once its LISTEN had completed. Fresh channels, so every SUB waits for a LISTEN.
        for i in range(25):
            ch = f"ack_{i}_{os.getpid()}"
            self.hub.subscribe(ch)
            notify(ch, f"n{i}")
            ev = self.events.next_notification()
            self.assertEqual((ev.channel, ev.payload), (ch, f"n{i}".encode()))
            self.assertGreater(ev.pid, 0)

    def test_lossless_10000_in_order(self):
        self.hub.subscribe("bulk")
        for k in range(10):
            sql(f"SELECT pg_notify('bulk', g::text) FROM generate_series({k * 1000 + 1}, {k * 1000 + 1000}) g")
        got = []
        while len(got) < 10000:
            ev = self.events.next(10, f"notification {len(got) + 1} of 10000")
            self.assertEqual(ev.kind, "notification", ev)
            got.append(int(ev.payload))
        self.assertEqual(got, list(range(1, 10001)))

    def test_resync_after_the_hubs_listen_session_is_terminated(self):
        self.hub.subscribe("jobs")
        self.assertEqual(support.terminate_listen_session(), 1)
        self.assertEqual(self.events.next(15, "LISTENER_DOWN"), h.Event("down"))
        self.assertEqual(self.events.next(30, "RESYNC"), h.Event("resync", None))
        notify("jobs", "after")
        self.assertEqual(self.events.next_notification().payload, b"after")

    def test_unsubscribe_ping_and_refusals(self):
        self.hub.subscribe("a")
        self.hub.subscribe("a")           # idempotent
        self.hub.subscribe("b")
        self.assertEqual(self.hub.channels(), ["a", "b"])
        self.hub.unsubscribe("a")
        notify("a", "dropped")
        notify("b", "kept")
        self.assertEqual(self.events.next_notification().payload, b"kept")
        with self.assertRaises(KeyError):
            self.hub.unsubscribe("a")
        with self.assertRaises(h.AckError) as cm:
            self.hub.subscribe("pgsse")   # reserved for pgsse's streams
        self.assertEqual(cm.exception.code_name, "BAD_CHANNEL")
        self.assertIn("BAD_CHANNEL", str(cm.exception))
        with self.assertRaises(ValueError):
            self.hub.subscribe("x" * 64)
        self.assertLess(self.hub.ping(), 5)
        notify("b", "still usable")
        self.assertEqual(self.events.next_notification().payload, b"still usable")

    def test_shutdown_ends_run_with_the_reason(self):
        self.hub.subscribe("jobs")
        self.server.stop()
        with self.assertRaises(h.HubFailure) as cm:
            self.hub.run()
        self.assertEqual(cm.exception.reason, "shutdown")


@need_server
class FailoverLive(unittest.TestCase):
    def setUp(self):
        # A closed session's backend leaves pg_stat_activity a moment after its client has
        # gone: the counts below are this test's own only once the last test's has left.
        deadline = time.monotonic() + 15
        while self.own_sessions() != 0:
            self.assertLess(time.monotonic(), deadline, "a worker-listen session of an earlier test is still there")
            time.sleep(0.05)

    def new(self, path, **kw):
        from psycopg_session import PsycopgSession
        f = h.Failover(path, direct=lambda: PsycopgSession(support.DSN), name="py-failover", **kw)
        self.addCleanup(f.close)
        return f, Collector(f)

    def own_sessions(self):
        return sql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'worker-listen' "
                   "AND datname = current_database()")[0][0]

    def check_switch(self, f, events, reason, down=True):
        if down:
            ev = events.next(15, "down")
            while ev.kind == "down":          # the hub may report its session down as it stops
                ev = events.next(30, "resync")
        else:
            ev = events.next(30, "resync")
        self.assertEqual(ev, h.Event("resync", None), "the switch is one resync of everything")
        self.assertEqual(f.source, "direct")
        self.assertEqual(f.reason.reason, reason)
        self.assertEqual(self.own_sessions(), 1)
        notify("jobs", "direct")
        ev = events.next(10, "a notification on the own session")
        self.assertEqual((ev.kind, ev.channel, ev.payload), ("notification", "jobs", b"direct"),
                         "after the switch's resync comes the notification, not a second resync")
        f.subscribe("later")              # subscribing after the switch LISTENs on the own session
        notify("later", "x")
        self.assertEqual(events.next_notification().channel, "later")

    def test_failover_when_pgsse_is_killed(self):
        server = Server()
        self.addCleanup(server.close)
        f, events = self.new(server.socket)
        f.subscribe("jobs")
        self.assertEqual(f.source, "hub")
        self.assertEqual(self.own_sessions(), 0, "no own session while the hub serves")
        notify("jobs", "via the hub")
        self.assertEqual(events.next_notification().payload, b"via the hub")
        server.kill()
        self.check_switch(f, events, "closed")
        # The own session is lost too: reopened with backoff, reported as down, then resync.
        self.assertEqual(sql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                             "WHERE application_name = 'worker-listen' AND datname = current_database()")[0][0], 1)
        self.assertEqual(events.next(15, "down"), h.Event("down"))
        self.assertEqual(events.next(30, "resync"), h.Event("resync", None))
        notify("jobs", "reopened")
        self.assertEqual(events.next_notification().payload, b"reopened")

    def test_failover_on_shutdown(self):
        server = Server()
        self.addCleanup(server.close)
        f, events = self.new(server.socket)
        f.subscribe("jobs")
        server.stop()
        self.check_switch(f, events, "shutdown")

    def test_failover_when_the_socket_refuses(self):
        path = os.path.join(tempfile.mkdtemp(), "nobody.sock")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(path)                      # a socket file nobody accepts on: connection refused
        s.close()
        f, events = self.new(path)
        f.subscribe("jobs")
        self.check_switch(f, events, "unavailable", down=False)

    def test_failover_on_eviction(self):
        server = Server("--hub-worker-buffer", "131080")
        self.addCleanup(server.close)
        f, events = self.new(server.socket, event_buffer=1)
        f.subscribe("jobs")
        # Nobody takes events: the reader stalls, the socket and then the hub's ring fill up.
        sql("SELECT pg_notify('jobs', repeat('x', 7000) || g) FROM generate_series(1, 400) g")
        deadline = time.monotonic() + 30
        while "evicting a worker" not in server.output(tail=None):
            self.assertLess(time.monotonic(), deadline, "the hub did not evict within 30 s")
            time.sleep(0.05)   # polling the hub's log: it is the observable
        while True:
            ev = events.next(30, "the switch after eviction")
            if ev.kind != "notification":
                break
        self.assertEqual(ev, h.Event("down"))
        self.assertEqual(events.next(30, "resync"), h.Event("resync", None))
        self.assertEqual(f.reason.reason, "evicted")
        notify("jobs", "direct")
        self.assertEqual(events.next_notification().payload, b"direct")

    def test_run_delivers_to_callbacks_and_close_ends_it(self):
        server = Server()
        self.addCleanup(server.close)
        got, received, resyncs = [], queue.Queue(), queue.Queue()

        def on_notification(ev):
            got.append(ev.text)
            received.put(ev.text)
            if len(got) == 2:
                f.close()
        from psycopg_session import PsycopgSession
        f = h.Failover(server.socket, direct=lambda: PsycopgSession(support.DSN),
                       on_notification=on_notification, on_resync=resyncs.put)
        f.subscribe("jobs")
        t = threading.Thread(target=f.run)
        t.start()
        notify("jobs", "one")
        self.assertEqual(received.get(timeout=10), "one")   # through the hub, before it is killed
        server.kill()
        self.assertIsNone(resyncs.get(timeout=30))           # the switch's resync of everything
        notify("jobs", "two")
        t.join(30)
        self.assertFalse(t.is_alive(), "run() returns after close()")
        self.assertEqual(got, ["one", "two"])


class ScriptedHub(unittest.TestCase):
    """Each STATUS code, as a hub peer sends it (a Unix socket server speaking the frames)."""

    def serve(self, *frames):
        path = os.path.join(tempfile.mkdtemp(), "hub.sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(1)
        self.addCleanup(srv.close)

        def peer():
            c, _ = srv.accept()
            with c:
                d = h.Decoder()
                while True:
                    f = d.next()
                    if f is None:
                        data = c.recv(4096)
                        if not data:
                            return
                        d.feed(data)
                        continue
                    if f.type == h.HELLO:
                        c.sendall(h.encode(h.Frame(h.STATUS, code=h.READY)))
                    elif f.type == h.SUB:
                        c.sendall(h.encode(h.Frame(h.ACK, req=f.req)) + b"".join(h.encode(x) for x in frames))
        threading.Thread(target=peer, daemon=True).start()
        return path

    def test_status_codes(self):
        cases = [
            ("LISTENER_DOWN", h.Frame(h.STATUS, code=h.LISTENER_DOWN), h.Event("down"), None),
            ("RESYNC all", h.Frame(h.STATUS, code=h.RESYNC), h.Event("resync", None), None),
            ("RESYNC channel", h.Frame(h.STATUS, code=h.RESYNC, channel=b"jobs"), h.Event("resync", "jobs"), None),
            ("RESYNC other channel", h.Frame(h.STATUS, code=h.RESYNC, channel=b"other"), None, None),
            ("READY again", h.Frame(h.STATUS, code=h.READY), None, None),
            ("SHUTDOWN", h.Frame(h.STATUS, code=h.SHUTDOWN, text=b"bye"), None, "shutdown"),
            ("EVICTED", h.Frame(h.STATUS, code=h.EVICTED, text=b"slow"), None, "evicted"),
            ("PROTOCOL_ERROR", h.Frame(h.STATUS, code=h.PROTOCOL_ERROR, text=b"bad"), None, "protocol"),
            ("a worker's frame", h.Frame(h.PING, token=1), None, "protocol"),
        ]
        for name, frame, want_event, want_failure in cases:
            with self.subTest(name):
                marker = h.Frame(h.NOTIFY, pid=1, channel=b"jobs", text=b"marker")
                path = self.serve(frame, marker) if want_failure is None else self.serve(frame)
                c = h.HubClient(path, ping_interval=0)
                self.addCleanup(c.close)
                c.subscribe("jobs")
                if want_failure is None:
                    ev = c.next_event(5)
                    if want_event is not None:
                        self.assertEqual(ev, want_event)
                        ev = c.next_event(5)
                    self.assertEqual(ev.payload, b"marker")
                else:
                    with self.assertRaises(h.HubFailure) as cm:
                        c.next_event(5)
                    self.assertEqual(cm.exception.reason, want_failure)

    def test_a_silent_hub_fails_with_timeout(self):
        # The peer answers HELLO and SUB but never a PING: two silent intervals end the client.
        c = h.HubClient(self.serve(), ping_interval=0.1)
        self.addCleanup(c.close)
        c.subscribe("jobs")
        with self.assertRaises(h.HubFailure) as cm:
            c.next_event(5)
        self.assertEqual(cm.exception.reason, "timeout")

    @need_server
    def test_failover_on_protocol_error(self):
        from psycopg_session import PsycopgSession
        f = h.Failover(self.serve(h.Frame(h.STATUS, code=h.PROTOCOL_ERROR, text=b"bad")),
                       direct=lambda: PsycopgSession(support.DSN), ping_interval=0)
        self.addCleanup(f.close)
        f.subscribe("jobs")
        self.assertEqual(f.next_event(10), h.Event("down"))
        self.assertEqual(f.next_event(30), h.Event("resync", None))
        self.assertEqual((f.source, f.reason.reason, f.reason.detail), ("direct", "protocol", "bad"))
        notify("jobs", "direct")
        self.assertEqual(f.next_event(10).payload, b"direct")

    def test_no_ack_within_the_deadline_fails_over(self):
        path = os.path.join(tempfile.mkdtemp(), "hub.sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(1)
        self.addCleanup(srv.close)
        held = []

        def peer():        # says READY, then never answers a SUB
            c, _ = srv.accept()
            held.append(c)
            c.recv(4096)
            c.sendall(h.encode(h.Frame(h.STATUS, code=h.READY)))
        threading.Thread(target=peer, daemon=True).start()
        c = h.HubClient(path, ack_timeout=0.5, ping_interval=0)
        self.addCleanup(c.close)
        with self.assertRaises(h.HubFailure) as cm:
            c.subscribe("jobs")
        self.assertEqual(cm.exception.reason, "ack_timeout")
        for s in held:
            s.close()


@need_server
class HubWorkerScript(unittest.TestCase):
    """docs/hub_worker.py, which the README tour runs: it stops with one line, no traceback."""

    def run_worker(self, server):
        p = subprocess.Popen([sys.executable, os.path.join(support.ROOT, "docs", "hub_worker.py"), server.socket, "jobs"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.addCleanup(lambda: p.poll() is None and p.kill())
        self.assertIn(b"subscribed to jobs", p.stdout.readline())
        notify("jobs", "hello, worker")
        self.assertIn(b"hello, worker", p.stdout.readline())
        return p

    def test_stops_cleanly_when_pgsse_stops(self):
        server = Server()
        self.addCleanup(server.close)
        p = self.run_worker(server)
        server.stop()
        out, err = p.communicate(timeout=20)
        self.assertEqual(p.returncode, 0, err)
        self.assertNotIn(b"Traceback", err)
        self.assertIn(b"pgsse is shutting down", err)
        self.assertEqual(len(err.decode().strip().splitlines()), 1, err)

    def test_says_what_happened_when_pgsse_is_killed(self):
        server = Server()
        self.addCleanup(server.close)
        p = self.run_worker(server)
        server.kill()
        out, err = p.communicate(timeout=20)
        self.assertEqual(p.returncode, 1, err)
        self.assertNotIn(b"Traceback", err)
        self.assertIn(b"connection to pgsse's hub lost", err)
        self.assertEqual(len(err.decode().strip().splitlines()), 1, err)


if __name__ == "__main__":
    unittest.main()
