// Compiled (not run) by types.test.js with tsc --noEmit: index.d.ts describes the API as the
// README uses it. A wrong declaration fails the compile.
import { AckError, decode, Decoder, encode, Failover, frame, HubClient, HubFailure, STATUS, WAKE } from 'pgsse-hub';
import type { DirectSession, DirectSink, Notification } from 'pgsse-hub';

async function worker(socket: string): Promise<void> {
  const session = (sink: DirectSink): Promise<DirectSession> => {
    sink.notification('jobs', 'payload', 42);
    return Promise.resolve({ listen: async () => undefined, unlisten: async () => undefined, close: () => undefined });
  };
  const hub = new Failover(socket, { direct: session, mode: WAKE, ackTimeout: 5000 });
  hub.on('notification', (ev: Notification) => {
    const s: string = ev.payload;
    const b: Buffer = ev.bytes;
    const n: number = ev.pid + ev.channel.length + s.length + b.length;
    void n;
  });
  hub.on('resync', (channel: string | null) => void channel);
  hub.on('down', () => undefined);
  try {
    await hub.subscribe('jobs');
  } catch (err) {
    if (err instanceof AckError) {
      const code: 'OK' | 'BAD_CHANNEL' | 'LISTEN_FAILED' | 'LIMIT' | 'NOT_SUBSCRIBED' = err.codeName;
      void code;
    }
  }
  const source: 'hub' | 'direct' = hub.source;
  const reason: HubFailure | null = hub.reason;
  void source; void reason;
  await hub.close();

  const c = await HubClient.connect(socket, { name: 'w', pingInterval: 0 });
  c.on('failure', (f: HubFailure) => void f.reason);
  const rtt: number = await c.ping();
  void rtt;
  const done: HubFailure = await c.done;
  void done;
  c.close();

  const [f, used] = decode(encode(frame(STATUS, { code: 1 })));
  if (f !== null) {
    const t: bigint = f.token;
    void t; void used;
  }
  const d = new Decoder();
  d.feed(Buffer.alloc(0));
  void d.next();
}
void worker;
