import os, sys
import pgsse_hub
from psycopg_session import PsycopgSession

def handle(event): print("job", event.channel, event.text, flush=True)
def reload(channel): print("re-read every job" if channel is None else f"re-read {channel}", flush=True)

hub = pgsse_hub.Failover(os.environ["PGSSE_HUB_SOCKET"], direct=lambda: PsycopgSession(os.environ["DATABASE_URL"]),
                         on_notification=handle, on_resync=reload)
hub.subscribe("jobs")  # returns once pgsse (or, after a failover, our own session) LISTENs
hub.run()
