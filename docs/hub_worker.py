"""A pgsse hub worker: python3 docs/hub_worker.py SOCKET CHANNEL...

Connects to the hub socket of `pgsse serve --hub-socket SOCKET`, subscribes to each CHANNEL
(lossless mode) and prints every notification, with clients/python/pgsse_hub.py (standard
library only). A real worker uses pgsse_hub.Failover, which switches to its own PostgreSQL
session when pgsse goes away (clients/python/README.md); this one says what happened and stops.
"""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python"))
import pgsse_hub

if len(sys.argv) < 3:
    sys.exit("usage: python3 docs/hub_worker.py SOCKET CHANNEL...")
try:
    hub = pgsse_hub.HubClient(sys.argv[1], name="hub_worker.py",
                              on_notification=lambda ev: print("notify", ev.pid, ev.channel, ev.text, flush=True),
                              on_down=lambda: print("listener down", flush=True),
                              on_resync=lambda ch: print("resync", ch or "(all)", flush=True))
    for c in sys.argv[2:]:
        hub.subscribe(c)
    print("subscribed to", ", ".join(sys.argv[2:]), flush=True)
    hub.run()
except pgsse_hub.HubFailure as e:
    if e.reason == "shutdown":
        print(f"hub_worker.py: pgsse is shutting down ({e.detail}); start me again once it is back", file=sys.stderr)
        sys.exit(0)
    sys.exit(f"hub_worker.py: connection to pgsse's hub lost ({e}); is `pgsse serve --hub-socket {sys.argv[1]}` running?")
except pgsse_hub.AckError as e:
    sys.exit(f"hub_worker.py: {e}")
except KeyboardInterrupt:
    pass
