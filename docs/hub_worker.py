"""A minimal pgsse hub client: python3 docs/hub_worker.py SOCKET CHANNEL...

Connects to the hub socket of `pgsse serve --hub-socket SOCKET`, subscribes to each CHANNEL
(lossless mode) and prints every notification. Standard library only. docs/hub-protocol.md
explains each frame; on any failure a real worker switches to its own PostgreSQL session.
"""
import os, socket, struct, sys

def frame(body): return struct.pack(">I", len(body)) + body

class Hub:
    def __init__(self, path, name=b"py"):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(path)                      # ConnectionRefused/FileNotFound: fail over
        self.buf, self.req, self.subs = b"", 0, set()
        self.s.sendall(frame(b"\x01\x01" + struct.pack(">I", os.getpid()) + name[:64]))
        t, body = self.read()
        if t != 0x83 or body[0] != 1:
            raise ConnectionError("hub did not say READY")

    def read(self):
        while True:
            if len(self.buf) >= 4:
                n = struct.unpack(">I", self.buf[:4])[0]
                if not 1 <= n <= 65536:
                    raise ConnectionError("bad frame length")
                if len(self.buf) >= 4 + n:
                    body, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
                    return body[0], body[1:]
            chunk = self.s.recv(65536)
            if not chunk:
                raise ConnectionError("EOF")           # fail over
            self.buf += chunk

    def sub(self, channel, mode=0):                     # call before consuming events
        self.req += 1
        self.s.sendall(frame(b"\x02" + struct.pack(">IB", self.req, mode) + channel))
        while True:
            t, body = self.read()
            if t == 0x81 and struct.unpack(">I", body[:4])[0] == self.req:
                if body[4] != 0:
                    raise ValueError(body[5:].decode(errors="replace"))
                self.subs.add(channel)
                return
            self.handle(t, body)                       # a real client queues these

    def handle(self, t, body):
        if t == 0x82:
            pid = struct.unpack(">I", body[:4])[0]
            n = body[4]
            channel, payload = body[5:5 + n], body[5 + n:]
            if channel in self.subs:
                print("notify", pid, channel.decode(), payload.decode(errors="replace"), flush=True)
        elif t == 0x83:
            code, n = body[0], body[1]
            channel, text = body[2:2 + n], body[2 + n:]
            if code == 2: print("listener down", flush=True)
            elif code == 3: print("resync", channel.decode() or "(all)", flush=True)
            elif code in (4, 5, 6): raise ConnectionError(f"status {code}: {text!r}")  # fail over

if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: python3 docs/hub_worker.py SOCKET CHANNEL...")
    h = Hub(sys.argv[1])
    for c in sys.argv[2:]:
        h.sub(c.encode())
    print("subscribed to", ", ".join(sys.argv[2:]), flush=True)
    while True:
        h.handle(*h.read())
