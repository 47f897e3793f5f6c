"""pgsse_hub: a worker client for the hub socket of `pgsse serve --hub-socket` (standard library only).

Worker processes share pgsse's one PostgreSQL LISTEN session through the hub; the wire
protocol is docs/hub-protocol.md. This module mirrors the Go package pglisten:

- ``HubClient`` speaks the protocol: HELLO, SUB answered only once the LISTEN completed on
  pgsse's session (``subscribe`` returns on ``ACK OK`` and raises ``AckError`` naming the code
  otherwise), UNSUB, PING/PONG keepalive, NOTIFY, every STATUS.
- ``Failover`` is what a worker wants: the hub first and, on connection refused, EOF, no ACK
  within 5 s, a silent hub, EVICTED, PROTOCOL_ERROR or SHUTDOWN, a switch once and for good to
  the application's own LISTEN session (an adapter over its own driver, see ``DirectSession``),
  re-LISTENing every recorded channel and then reporting one resync of everything.

Events are queued (bounded) by the client's reader thread and delivered to the application's
callbacks by ``run()`` on the application's thread, in the order the hub (or PostgreSQL) sent
them. When the application does not keep up, the reader stops reading and the hub applies its
policy (a lossless worker is evicted, and a Failover then switches to its own session).
"""

import collections
import logging
import os
import queue
import select
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass

__all__ = [
    "HubClient", "Failover", "HubFailure", "AckError", "ProtocolError", "Event", "Frame",
    "Decoder", "decode", "encode", "LOSSLESS", "WAKE", "ACK_CODES", "STATUS_CODES",
]

log = logging.getLogger("pgsse_hub")

MAX_BODY = 65536          # largest body length N a frame may announce (type byte included)
MAX_NAME = 64             # longest HELLO name
MAX_CHANNEL = 63          # PostgreSQL's identifier limit
VERSION = 1

HELLO, SUB, UNSUB, PING = 0x01, 0x02, 0x03, 0x04
ACK, NOTIFY, STATUS, PONG = 0x81, 0x82, 0x83, 0x84
TYPE_NAMES = {HELLO: "HELLO", SUB: "SUB", UNSUB: "UNSUB", PING: "PING",
              ACK: "ACK", NOTIFY: "NOTIFY", STATUS: "STATUS", PONG: "PONG"}
LOSSLESS, WAKE = 0, 1
ACK_CODES = {0: "OK", 1: "BAD_CHANNEL", 2: "LISTEN_FAILED", 3: "LIMIT", 4: "NOT_SUBSCRIBED"}
STATUS_CODES = {1: "READY", 2: "LISTENER_DOWN", 3: "RESYNC", 4: "SHUTDOWN", 5: "EVICTED",
                6: "PROTOCOL_ERROR"}
READY, LISTENER_DOWN, RESYNC, SHUTDOWN, EVICTED, PROTOCOL_ERROR = 1, 2, 3, 4, 5, 6


# ---------------------------------------------------------------------------------------------
# Frames

class ProtocolError(Exception):
    """Bytes that break docs/hub-protocol.md; the connection cannot go on."""


@dataclass(frozen=True)
class Frame:
    """One decoded frame. Only the fields of its type are set (docs/hub-protocol.md, Frames):
    HELLO version/pid/name, SUB req/mode/channel, UNSUB req/channel, PING and PONG token,
    ACK req/code/text, NOTIFY pid/channel/text (the payload), STATUS code/channel/text."""
    type: int
    version: int = 0
    pid: int = 0
    name: bytes = b""
    req: int = 0
    mode: int = 0
    channel: bytes = b""
    code: int = 0
    text: bytes = b""
    token: int = 0

    def __str__(self):
        t = TYPE_NAMES.get(self.type, hex(self.type))
        if self.type == ACK:
            return f"ACK {self.req} {ACK_CODES[self.code]} {self.text!r}"
        if self.type == STATUS:
            return f"STATUS {STATUS_CODES[self.code]} {self.channel!r} {self.text!r}"
        return f"{t} {self!r}"


def _check_channel(ch, allow_empty=False):
    if not ch and allow_empty:
        return
    if not 1 <= len(ch) <= MAX_CHANNEL:
        raise ProtocolError(f"channel must be 1-{MAX_CHANNEL} bytes, got {len(ch)}")
    if b"\0" in ch:
        raise ProtocolError("channel contains a NUL byte")


def decode(buf, start=0):
    """Decodes the frame at buf[start:]. Returns (frame, bytes used), or (None, 0) when buf
    holds only part of a frame. Raises ProtocolError for a length of 0 or over 65536, an
    unknown type or code, or a field cut short — as soon as the bytes show it."""
    avail = len(buf) - start
    if avail < 4:
        return None, 0
    (n,) = struct.unpack_from(">I", buf, start)
    if not 1 <= n <= MAX_BODY:
        raise ProtocolError(f"frame length {n} is outside 1-{MAX_BODY}")
    if avail < 5:
        return None, 0
    t = buf[start + 4]
    if t not in TYPE_NAMES:
        raise ProtocolError(f"unknown frame type 0x{t:02x}")
    if avail < 4 + n:
        return None, 0
    b = bytes(buf[start + 5:start + 4 + n])
    name = TYPE_NAMES[t]

    def need(k):
        if len(b) < k:
            raise ProtocolError(f"{name} frame ends inside a field")

    if t == HELLO:
        need(5)
        if b[0] != VERSION:
            raise ProtocolError(f"HELLO version {b[0]} (want {VERSION})")
        if len(b) - 5 > MAX_NAME:
            raise ProtocolError(f"HELLO name longer than {MAX_NAME} bytes")
        f = Frame(t, version=b[0], pid=struct.unpack_from(">I", b, 1)[0], name=b[5:])
    elif t == SUB:
        need(5)
        if b[4] > WAKE:
            raise ProtocolError(f"SUB mode {b[4]} (want 0 or 1)")
        _check_channel(b[5:])
        f = Frame(t, req=struct.unpack_from(">I", b)[0], mode=b[4], channel=b[5:])
    elif t == UNSUB:
        need(4)
        _check_channel(b[4:])
        f = Frame(t, req=struct.unpack_from(">I", b)[0], channel=b[4:])
    elif t in (PING, PONG):
        need(8)
        if len(b) > 8:
            raise ProtocolError(f"{name} body must be exactly a u64 token")
        f = Frame(t, token=struct.unpack_from(">Q", b)[0])
    elif t == ACK:
        need(5)
        if b[4] not in ACK_CODES:
            raise ProtocolError(f"ACK code {b[4]} is not 0-4")
        f = Frame(t, req=struct.unpack_from(">I", b)[0], code=b[4], text=b[5:])
    elif t == NOTIFY:
        need(5)
        end = 5 + b[4]
        need(end)
        _check_channel(b[5:end])
        f = Frame(t, pid=struct.unpack_from(">I", b)[0], channel=b[5:end], text=b[end:])
    else:  # STATUS
        need(2)
        if b[0] not in STATUS_CODES:
            raise ProtocolError(f"STATUS code {b[0]} is not 1-6")
        end = 2 + b[1]
        need(end)
        _check_channel(b[2:end], allow_empty=True)
        f = Frame(t, code=b[0], channel=b[2:end], text=b[end:])
    return f, 4 + n


def encode(f):
    """Encodes a Frame (any type) to its bytes: length, type, fields."""
    t = f.type
    if t == HELLO:
        body = struct.pack(">BBI", t, f.version or VERSION, f.pid) + f.name[:MAX_NAME]
    elif t == SUB:
        body = struct.pack(">BIB", t, f.req, f.mode) + f.channel
    elif t == UNSUB:
        body = struct.pack(">BI", t, f.req) + f.channel
    elif t in (PING, PONG):
        body = struct.pack(">BQ", t, f.token)
    elif t == ACK:
        body = struct.pack(">BIB", t, f.req, f.code) + f.text
    elif t == NOTIFY:
        body = struct.pack(">BIB", t, f.pid, len(f.channel)) + f.channel + f.text
    elif t == STATUS:
        body = struct.pack(">BBB", t, f.code, len(f.channel)) + f.channel + f.text
    else:
        raise ValueError(f"unknown frame type {t!r}")
    if len(body) > MAX_BODY:
        raise ValueError(f"frame body of {len(body)} bytes exceeds {MAX_BODY}")
    return struct.pack(">I", len(body)) + body


class Decoder:
    """Buffers bytes as they arrive (frames come in arbitrary pieces) and yields whole frames."""

    def __init__(self):
        self._buf = bytearray()

    def feed(self, data):
        self._buf += data

    def next(self):
        """The next whole frame, or None until more bytes arrive; raises ProtocolError."""
        f, n = decode(self._buf)
        if f is not None:
            del self._buf[:n]
        return f


# ---------------------------------------------------------------------------------------------
# Events and errors

@dataclass(frozen=True)
class Event:
    """What the application receives: kind "notification" (channel, payload bytes exactly as
    PostgreSQL sent them, pid of the notifying backend), "down" (notifications may be missed
    until the next resync) or "resync" (re-read the state behind channel; None = every channel)."""
    kind: str
    channel: str = None
    payload: bytes = b""
    pid: int = 0

    @property
    def text(self):
        return self.payload.decode("utf-8", errors="replace")


class HubFailure(Exception):
    """The hub client stopped. reason is one of: "unavailable" (no socket, connection refused),
    "closed" (EOF), "ack_timeout", "timeout" (no answer to PING, a write that did not finish),
    "evicted", "shutdown", "protocol", "closed_by_application"; detail is what the hub or the
    socket said."""

    def __init__(self, reason, detail=""):
        self.reason, self.detail = reason, detail
        super().__init__(f"pgsse hub: {reason}" + (f": {detail}" if detail else ""))


class AckError(Exception):
    """The hub refused a SUB or UNSUB (code_name BAD_CHANNEL, LISTEN_FAILED, LIMIT or
    NOT_SUBSCRIBED). The client stays usable."""

    def __init__(self, channel, code, message):
        self.channel, self.code, self.message = channel, code, message
        self.code_name = ACK_CODES.get(code, str(code))
        super().__init__(f"pgsse hub refused {channel!r}: {self.code_name}: {message}")


def _channel_bytes(channel):
    b = channel.encode("utf-8", "surrogateescape") if isinstance(channel, str) else bytes(channel)
    if not 1 <= len(b) <= MAX_CHANNEL or b"\0" in b:
        raise ValueError(f"channel {channel!r}: must be 1-{MAX_CHANNEL} bytes without NUL")
    return b


def _channel_str(b):
    return b.decode("utf-8", "surrogateescape")


_END = object()   # queued when the client has stopped: run() returns


class _Dispatcher:
    """The event queue shared by the reader thread(s) and the application's run()."""

    def __init__(self, on_notification, on_resync, on_down, event_buffer):
        self.on_notification, self.on_resync, self.on_down = on_notification, on_resync, on_down
        self._q = queue.Queue(maxsize=event_buffer)
        self._closing = threading.Event()   # close() was called
        self._end = None                    # (error or None) once the client can go on no longer

    def _put(self, item):
        """Queues item, blocking while the queue is full (the application is behind); False if
        close() was called meanwhile."""
        while not self._closing.is_set():
            try:
                self._q.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _finish(self, err):
        """Ends the event stream after what is queued: run() raises err (returns if None)."""
        self._end = (err,)
        self._put(_END)

    def next_event(self, timeout=None):
        """The next Event; None after timeout or once closed; raises the failure that ended
        the client once everything before it was taken."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._closing.is_set():
            wait = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
            if wait <= 0:
                return None
            try:
                item = self._q.get(timeout=wait)
            except queue.Empty:
                continue
            if item is _END:
                self._q.put_nowait(_END)    # every later call ends the same way
                if self._end[0] is not None:
                    raise self._end[0]
                return None
            return item
        return None

    def run(self):
        """Delivers events to the callbacks (on_notification(event), on_resync(channel or
        None), on_down()) on the calling thread until close() — then it returns — or until the
        client can go on no longer: then it raises the HubFailure."""
        while True:
            ev = self.next_event()
            if ev is None:
                return
            if ev.kind == "notification":
                if self.on_notification:
                    self.on_notification(ev)
            elif ev.kind == "resync":
                if self.on_resync:
                    self.on_resync(ev.channel)
            elif ev.kind == "down":
                if self.on_down:
                    self.on_down()


# ---------------------------------------------------------------------------------------------
# The hub client

class HubClient(_Dispatcher):
    """One connection to the hub (docs/hub-protocol.md). Connects, says HELLO and waits for
    STATUS READY in the constructor, raising HubFailure if the hub is not there or does not
    take the worker. On any later failure the client stops: run() raises the HubFailure
    (``failure`` holds it). Use Failover to fall back to the application's own session."""

    def __init__(self, path, name=None, mode=LOSSLESS, *, on_notification=None, on_resync=None,
                 on_down=None, connect_timeout=2.0, ack_timeout=5.0, ping_interval=5.0,
                 event_buffer=4096, _on_fail=None, _dispatcher=None):
        if _dispatcher is None:
            super().__init__(on_notification, on_resync, on_down, event_buffer)
            _dispatcher = self
        self._d = _dispatcher
        self.path, self.mode = path, mode
        self.ack_timeout, self.ping_interval = ack_timeout, ping_interval
        self.name = (name or os.path.basename(sys.argv[0]) or "python").encode()[:MAX_NAME]
        self.failure = None
        self.last_down = False   # the last state STATUS was LISTENER_DOWN (no RESYNC since)
        self._on_fail = _on_fail
        self._lock = threading.Lock()
        self._wlock = threading.Lock()
        self._subs = set()
        self._pending = {}       # req -> [channel, is_unsub, threading.Event, result]
        self._req = 0
        self._failed = threading.Event()
        self._ping_sent = 0.0    # monotonic time of the outstanding PING, 0 = none
        self._pongs = {}
        self._last_recv = time.monotonic()
        self._dec = Decoder()
        try:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as e:
            raise HubFailure("unavailable", str(e)) from None
        try:
            self._sock.settimeout(connect_timeout)
            self._sock.connect(path)
            self._sock.sendall(encode(Frame(HELLO, pid=os.getpid(), name=self.name)))
            self._handshake()
        except HubFailure:
            self._sock.close()
            raise
        except (OSError, socket.timeout) as e:
            self._sock.close()
            raise HubFailure("unavailable", f"{path}: {e}") from None
        self._sock.settimeout(None)
        self._reader = threading.Thread(target=self._read_loop, name="pgsse-hub-reader", daemon=True)
        self._reader.start()
        if ping_interval and ping_interval > 0:
            threading.Thread(target=self._ping_loop, name="pgsse-hub-ping", daemon=True).start()

    def _handshake(self):
        while True:
            f = self._dec.next()
            if f is not None:
                if f.type == STATUS and f.code == READY:
                    return
                if f.type == STATUS:
                    raise _status_failure(f)
                raise HubFailure("protocol", f"expected STATUS READY, got {TYPE_NAMES[f.type]}")
            data = self._sock.recv(65536)
            if not data:
                raise HubFailure("closed", "EOF before READY")
            self._dec.feed(data)

    # -- reading -------------------------------------------------------------------------------

    def _read_loop(self):
        try:
            while not self._failed.is_set():
                while True:
                    f = self._dec.next()
                    if f is None:
                        break
                    if not self._handle(f):
                        return
                try:
                    data = self._sock.recv(65536)
                except OSError as e:
                    self._fail(HubFailure("closed", str(e)))
                    return
                if not data:
                    self._fail(HubFailure("closed", "EOF"))
                    return
                self._last_recv = time.monotonic()
                self._dec.feed(data)
        except ProtocolError as e:
            self._fail(HubFailure("protocol", str(e)))

    def _handle(self, f):
        if f.type == NOTIFY:
            ch = _channel_str(f.channel)
            with self._lock:
                if ch not in self._subs:
                    return True     # unsubscribed while it was in flight
            return self._deliver(Event("notification", ch, f.text, f.pid))
        if f.type == ACK:
            with self._lock:
                p = self._pending.pop(f.req, None)
                if p is not None and not p[1] and f.code == 0:
                    # Subscribed from this frame on: a NOTIFY right behind the ACK is delivered.
                    self._subs.add(p[0])
            if p is not None:
                p[3] = (f.code, f.text.decode("utf-8", "replace"))
                p[2].set()
            return True
        if f.type == STATUS:
            if f.code == READY:
                return True
            if f.code == LISTENER_DOWN:
                self.last_down = True
                return self._deliver(Event("down"))
            if f.code == RESYNC:
                if not f.channel:
                    self.last_down = False
                    return self._deliver(Event("resync", None))
                ch = _channel_str(f.channel)
                with self._lock:
                    if ch not in self._subs:
                        return True
                return self._deliver(Event("resync", ch))
            self._fail(_status_failure(f))
            return False
        if f.type == PONG:
            self._ping_sent = 0.0
            ev = self._pongs.pop(f.token, None)
            if ev is not None:
                ev.set()
            return True
        self._fail(HubFailure("protocol", f"unexpected {TYPE_NAMES[f.type]} frame from the hub"))
        return False

    def _deliver(self, ev):
        self._delivering = True
        try:
            return self._d._put(ev) and not self._failed.is_set()
        finally:
            self._delivering = False

    _delivering = False

    def _fail(self, failure):
        with self._lock:
            if self.failure is not None:
                return
            self.failure = failure
            pending = list(self._pending.values())
            self._pending.clear()
        self._failed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        for p in pending:
            p[2].set()
        for ev in list(self._pongs.values()):
            ev.set()
        if failure.reason != "closed_by_application":
            log.info("%s", failure)
        if self._on_fail is not None:
            self._on_fail(failure, self)
        elif failure.reason != "closed_by_application":
            self._d._finish(failure)

    # -- writing and requests ------------------------------------------------------------------

    def _write(self, data, timeout=5.0):
        # The reader thread blocks in recv on the same socket, so no socket timeout here: each
        # send is non-blocking, waiting for room with select up to the deadline.
        with self._wlock:
            if self._failed.is_set():
                raise self.failure
            deadline = time.monotonic() + timeout
            view = memoryview(data)
            try:
                while view:
                    try:
                        view = view[self._sock.send(view, socket.MSG_DONTWAIT):]
                    except BlockingIOError:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            self._fail(HubFailure("timeout", f"a write did not finish within {timeout:g} s"))
                            raise self.failure from None
                        select.select([], [self._sock], [], left)
            except OSError as e:
                self._fail(HubFailure("closed", f"write: {e}"))
                raise self.failure from None

    def _request(self, channel, unsub):
        cb = _channel_bytes(channel)
        with self._lock:
            if self.failure is not None:
                raise self.failure
            self._req = (self._req + 1) & 0xFFFFFFFF
            req = self._req
            p = [_channel_str(cb), unsub, threading.Event(), None]
            self._pending[req] = p
        if unsub:
            self._write(encode(Frame(UNSUB, req=req, channel=cb)))
        else:
            self._write(encode(Frame(SUB, req=req, mode=self.mode, channel=cb)))
        if not p[2].wait(self.ack_timeout):
            self._fail(HubFailure("ack_timeout", f"no ACK for {p[0]!r} within {self.ack_timeout:g} s"))
        if p[3] is None:
            raise self.failure
        return p[3]

    def subscribe(self, channel):
        """Sends SUB and returns once the hub answered ACK OK — which it does only once the
        LISTEN completed on pgsse's PostgreSQL session: every notification committed after this
        returns is delivered. Raises AckError (code_name says why) or HubFailure."""
        ch = _channel_str(_channel_bytes(channel))
        with self._lock:
            if ch in self._subs:
                return
        code, msg = self._request(ch, False)
        if code != 0:
            raise AckError(ch, code, msg)

    def unsubscribe(self, channel):
        """Sends UNSUB; notifications for channel stop at once. Raises KeyError if the channel
        was not subscribed."""
        ch = _channel_str(_channel_bytes(channel))
        with self._lock:
            if ch not in self._subs:
                raise KeyError(f"not subscribed to {ch!r}")
            self._subs.discard(ch)
        code, msg = self._request(ch, True)
        if code not in (0, 4):
            raise AckError(ch, code, msg)

    def ping(self, timeout=5.0):
        """Sends PING and waits for its PONG; returns the round trip in seconds."""
        with self._lock:
            self._req += 1
            token = (1 << 63) | self._req
            ev = self._pongs[token] = threading.Event()
        t0 = time.monotonic()
        self._write(encode(Frame(PING, token=token)))
        if not ev.wait(timeout):
            self._pongs.pop(token, None)
            raise TimeoutError(f"no PONG within {timeout:g} s")
        if self.failure is not None:
            raise self.failure
        return time.monotonic() - t0

    def channels(self):
        with self._lock:
            return sorted(self._subs)

    def _ping_loop(self):
        token, last_seen, stale = 0, None, 0
        while not self._failed.wait(self.ping_interval):
            recv = self._last_recv
            if self._ping_sent and recv == last_seen and not self._delivering:
                stale += 1
                if stale >= 2:
                    self._fail(HubFailure("timeout", "no answer to PING"))
                    return
                continue
            stale, last_seen = 0, recv
            if not self._ping_sent:
                token += 1
                self._ping_sent = time.monotonic()
                try:
                    self._write(encode(Frame(PING, token=token)))
                except HubFailure:
                    return

    def close(self):
        """Closes the connection; run() returns."""
        if self._d is self:
            self._closing.set()
        self._fail(HubFailure("closed_by_application"))


def _status_failure(f):
    text = f.text.decode("utf-8", "replace")
    reason = {SHUTDOWN: "shutdown", EVICTED: "evicted", PROTOCOL_ERROR: "protocol"}.get(f.code, "protocol")
    return HubFailure(reason, text or STATUS_CODES[f.code])


# ---------------------------------------------------------------------------------------------
# Failover: the hub, then the application's own LISTEN session

class DirectSession:
    """What a Failover needs from the application's own PostgreSQL session (an adapter over its
    driver; clients/python/README.md has one for psycopg). Every method is called on the
    client's direct-session thread, never concurrently:

    - fileno() -> the connection's socket, watched for readability;
    - listen(channel: str) / unlisten(channel: str): LISTEN/UNLISTEN with the channel quoted as
      an identifier; return once PostgreSQL answered, raise on failure;
    - notifications() -> iterable of (channel, payload, pid): what has arrived; called when
      fileno() is readable and after each listen/unlisten; raises when the connection is lost;
    - close().
    """


class Failover(_Dispatcher):
    """The hub first; on its failure (see HubFailure) a switch once and for good to the
    application's own LISTEN session, made by ``direct()`` (a callable returning a
    DirectSession) only then. After the switch every recorded channel is LISTENed again and one
    resync of everything (channel None) is reported, preceded by a "down" if the hub had been
    connected: notifications between the two may have been missed. A direct session that is
    lost later is reopened with backoff, reported the same way (down, then resync)."""

    def __init__(self, path, direct, name=None, mode=LOSSLESS, *, on_notification=None,
                 on_resync=None, on_down=None, ack_timeout=5.0, ping_interval=5.0,
                 event_buffer=4096, connect_timeout=2.0):
        super().__init__(on_notification, on_resync, on_down, event_buffer)
        self._direct_factory = direct
        self._lock = threading.Lock()
        self._chans = set()                 # recorded: subscribe called, not failed/unsubscribed
        self._cmds = collections.deque()    # (op, channel, threading.Event, [error]) for the direct thread
        self._switched = threading.Event()
        self._closed = False
        self._wake_r, self._wake_w = os.pipe()
        self.source = "hub"
        self.reason = None                  # the HubFailure that made it switch
        self.direct_error = None
        self._hub = None
        self._direct_started = False
        try:
            self._hub = HubClient(path, name, mode, ack_timeout=ack_timeout, ping_interval=ping_interval,
                                  connect_timeout=connect_timeout, _on_fail=self._hub_failed, _dispatcher=self)
        except HubFailure as e:
            self._start_switch(e, report_down=False)

    def _hub_failed(self, failure, hub):
        # On the hub's reader thread (or a caller's), after the hub's last event was queued.
        if failure.reason == "closed_by_application":
            return
        self._start_switch(failure, report_down=not hub.last_down)

    def _start_switch(self, failure, report_down):
        with self._lock:
            if self._closed:
                return
            self.reason = failure
            self._direct_started = True
            self._direct_thread = threading.Thread(target=self._direct_loop, args=(report_down,),
                                                   name="pgsse-hub-direct", daemon=True)
            self._direct_thread.start()

    # -- the direct-session thread -------------------------------------------------------------

    def _direct_loop(self, report_down):
        try:
            self._direct_sessions(report_down)
        finally:
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _direct_sessions(self, report_down):
        log.warning("%s; switching to the application's own LISTEN session for good", self.reason)
        with self._lock:
            self.source, self._hub = "direct", None
        self._switched.set()
        if report_down and not self._put(Event("down")):
            return
        backoff, first = 0.1, True
        while not self._closing.is_set():
            session = None
            try:
                session = self._direct_factory()
                with self._lock:
                    todo = list(self._chans)
                for ch in todo:
                    session.listen(ch)
                    self._drain(session)
                log.info("pgsse hub: own LISTEN session live (%d channels); resyncing", len(todo))
                if not self._put(Event("resync", None)):
                    return
                backoff, first = 0.1, False
                self._serve(session)
                return
            except Exception as e:    # the application's driver: any error means the session is gone
                if self._closing.is_set():
                    return
                self.direct_error = e
                log.error("pgsse hub: own LISTEN session: %s: %s (retrying in %.1f s)",
                          type(e).__name__, e, backoff)
                self._fail_cmds(e)
                if not first and not self._put(Event("down")):
                    return
                first = True        # report the next loss only after a resync
            finally:
                if session is not None:
                    try:
                        session.close()
                    except Exception:
                        pass
            if self._sleep(backoff):
                return
            backoff = min(backoff * 2, 5.0)

    def _serve(self, session):
        fd = session.fileno()
        while not self._closing.is_set():
            self._run_cmds(session)
            r, _, _ = select.select([fd, self._wake_r], [], [], 1.0)
            if self._wake_r in r:
                os.read(self._wake_r, 4096)
            if fd in r:
                self._drain(session)

    def _drain(self, session):
        for channel, payload, pid in session.notifications():
            if isinstance(payload, str):
                payload = payload.encode("utf-8", "surrogateescape")
            with self._lock:
                if channel not in self._chans:
                    continue
            if not self._put(Event("notification", channel, payload, pid)):
                return

    def _run_cmds(self, session):
        while True:
            with self._lock:
                if not self._cmds:
                    return
                op, ch, done, res = self._cmds.popleft()
            try:
                (session.listen if op == "listen" else session.unlisten)(ch)
            except Exception as e:  # refused; a lost connection shows in notifications() next
                res.append(e)
            done.set()
            self._drain(session)

    def _fail_cmds(self, err):
        with self._lock:
            cmds, self._cmds = list(self._cmds), collections.deque()
        for _, _, done, res in cmds:
            res.append(err)
            done.set()

    def _sleep(self, d):
        return self._closing.wait(d)

    def _direct_cmd(self, op, ch):
        done, res = threading.Event(), []
        with self._lock:
            if self._closed:
                raise HubFailure("closed_by_application")
            self._cmds.append((op, ch, done, res))
            os.write(self._wake_w, b"x")
        done.wait()
        if res:
            raise res[0]

    # -- the application's calls ---------------------------------------------------------------

    def subscribe(self, channel):
        """Records channel (a switch re-LISTENs it) and subscribes on the current side: returns
        once the LISTEN completed — on pgsse's session (ACK OK) or, after a switch, on the
        application's own. Raises AckError for a refused SUB, or the direct session's error."""
        ch = _channel_str(_channel_bytes(channel))
        with self._lock:
            had = ch in self._chans
            self._chans.add(ch)
            hub = self._hub
        try:
            if hub is not None:
                try:
                    return hub.subscribe(ch)
                except HubFailure:
                    self._switched.wait()
            elif not self._switched.is_set():
                self._switched.wait()
            self._direct_cmd("listen", ch)
        except BaseException:
            if not had:
                with self._lock:
                    self._chans.discard(ch)
            raise

    def unsubscribe(self, channel):
        """Forgets channel and unsubscribes on the current side. KeyError if not subscribed."""
        ch = _channel_str(_channel_bytes(channel))
        with self._lock:
            if ch not in self._chans:
                raise KeyError(f"not subscribed to {ch!r}")
            self._chans.discard(ch)
            hub = self._hub
        if hub is not None:
            try:
                return hub.unsubscribe(ch)
            except KeyError:
                return           # its SUB had not been acknowledged
            except HubFailure:
                self._switched.wait()
        self._direct_cmd("unlisten", ch)

    def ping(self, timeout=5.0):
        """PING/PONG round trip to the hub in seconds (None once switched to the own session)."""
        hub = self._hub
        return hub.ping(timeout) if hub is not None else None

    def channels(self):
        with self._lock:
            return sorted(self._chans)

    def close(self):
        """Stops the hub client or the own session (a switch in progress too); run() returns."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            hub, started = self._hub, self._direct_started
            if started:
                os.write(self._wake_w, b"x")   # the direct thread closes the pipe as it ends
        self._closing.set()
        if hub is not None:
            hub.close()
        if not started:
            os.close(self._wake_r)
            os.close(self._wake_w)
        self._fail_cmds(HubFailure("closed_by_application"))
        if started and threading.current_thread() is not self._direct_thread:
            self._direct_thread.join(10)   # the own session is closed when close() returns
