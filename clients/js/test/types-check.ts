// Compiled (not run) by package.test.js with tsc --noEmit: pgsse.d.ts describes the API as
// README.md uses it. A wrong declaration fails the compile.
import { parseEventId, subscribe, Subscription } from 'pgsse-browser';
import type { GapInfo, PgsseEvent, PresenceInfo, Role } from 'pgsse-browser';

const sub = subscribe({
  streams: ['orders/42', 'chat/7'],
  url: 'https://rt.example.com/',
  events: ['status'],
  since: { 'orders/42': 0 },
  token: () => fetch('/pgsse-token').then((r) => r.text()),
  presence: true,
  shareKey: 'user:7',
});
sub.addEventListener('message', (e) => {
  const stream: string | null = e.stream;
  const id: string | null = e.id;
  const data: string = e.data;
  void [stream, id, data, e.lastEventId];
});
sub.addEventListener('status', (e) => void e.data);
sub.addEventListener('pgsse:gap', (e) => {
  const g: GapInfo = e.json;
  void [g.stream, g.after, g.resume];
});
sub.addEventListener('pgsse:presence', (e: PgsseEvent<PresenceInfo>) => void e.json.anonymous);
sub.addEventListener('statechange', () => {
  const role: Role | null = sub.role;
  const open: boolean = sub.readyState === Subscription.OPEN;
  void [role, open];
});
sub.onerror = (e) => void e.message;
const cursor: string | undefined = sub.cursor('orders/42');
void cursor;
sub.close();

// Whatever takes an EventSource-like object (Turbo.connectStreamSource) can take a subscription.
function connectStreamSource(source: { addEventListener(type: 'message', l: (e: MessageEvent) => void): void }): void {
  void source;
}
connectStreamSource(subscribe({ stream: 'board/1', url: 'https://rt.example.com/', token: 'abc' }));
const id = parseEventId('1:4,9', 2);
if (id) void id.cursors[id.index];
