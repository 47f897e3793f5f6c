// A Subscription's own connection (share: false) over a stand-in for the browser's
// EventSource, which records what the client asks of it: the URL it opens (cursors, token),
// when it closes, and which events reach the listeners. e2e/browser_client_test.go runs the
// same code in Chromium against pgsse; this covers what that cannot provoke at will.
import assert from 'node:assert/strict';
import { afterEach, beforeEach, test } from 'node:test';
import { subscribe } from '../pgsse.js';

class FakeEventSource extends EventTarget {
  static all = [];
  constructor(url, init) {
    super();
    this.url = url;
    this.withCredentials = !!init?.withCredentials;
    this.readyState = 0;
    this.onopen = this.onerror = null;
    this.lastEventId = '';
    FakeEventSource.all.push(this);
  }
  open() {
    this.readyState = 1;
    this.onopen?.(new Event('open'));
  }
  // send delivers an event as EventSource would: id undefined keeps the last event id.
  send(type, data, id) {
    if (id !== undefined) this.lastEventId = id;
    this.dispatchEvent(new MessageEvent(type, { data, lastEventId: this.lastEventId }));
  }
  fail(final) {
    this.readyState = final ? 2 : 0;
    this.onerror?.(new Event('error'));
  }
  close() {
    this.readyState = 2;
    this.closed = true;
  }
}

const jwt = (claims) =>
  ['{"alg":"HS256"}', JSON.stringify(claims)].map((s) => Buffer.from(s).toString('base64url')).join('.') + '.sig';

let subs = [];
beforeEach(() => {
  FakeEventSource.all = [];
  globalThis.EventSource = FakeEventSource;
});
afterEach(() => {
  for (const s of subs) s.close();
  subs = [];
  delete globalThis.EventSource;
});

function start(options) {
  const sub = subscribe({ url: 'https://rt.example.com/', share: false, ...options });
  subs.push(sub);
  const seen = [];
  const record = (e) => seen.push(`${e.type} ${e.stream}#${e.id} ${e.data}`);
  sub.addEventListener('message', record);
  sub.addEventListener('pgsse:gap', (e) => seen.push(`gap ${e.stream} ${e.json.after}..${e.json.resume}`));
  sub.addEventListener('pgsse:presence', (e) => seen.push(`presence ${e.stream} ${JSON.stringify(e.json)}`));
  return { sub, seen, record };
}

const until = async (cond, what) => {
  for (let i = 0; i < 400; i++) {
    if (cond()) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  assert.fail('timed out waiting for ' + what);
};

test('events, ephemeral events, gaps and presence reach listeners with their stream', async () => {
  const { sub, seen, record } = start({ streams: ['a', 'b'], token: 't', events: ['status'], presence: true });
  sub.addEventListener('status', record);
  await until(() => FakeEventSource.all.length === 1, 'the connection');
  const es = FakeEventSource.all[0];
  assert.equal(es.url, 'https://rt.example.com/streams?stream=a&stream=b&presence=1&token=t');
  es.open();
  assert.equal(sub.readyState, 1);
  es.send('pgsse:presence', '{"stream":"b","present":["user:7"],"anonymous":0}');
  es.send('message', 'one', '0:1,4');
  es.send('status', 'two', '1:1,5');
  es.send('message', 'typing'); // no id: line
  es.send('pgsse:gap', '{"stream":"a","after":1,"resume":3}');
  es.send('message', 'four', '0:4,5');
  es.send('message', 'again', '0:4,5'); // equal id: taken as ephemeral, not a repeat of #4
  assert.deepEqual(seen, [
    'presence b {"stream":"b","present":["user:7"],"anonymous":0}',
    'message a#1 one',
    'status b#5 two',
    'message null#null typing',
    'gap a 1..3',
    'message a#4 four',
    'message null#null again',
  ]);
  assert.equal(sub.cursor('a'), '4');
  assert.equal(sub.cursor('b'), '5');
});

test('a refreshed token reopens at the cursors; the old connection closes once the new one is open', async () => {
  let n = 0;
  const token = async () => jwt({ exp: Math.floor(Date.now() / 1000) + 2, n: ++n });
  const { seen } = start({ stream: 'orders/42', token, refreshBefore: 1800 });
  await until(() => FakeEventSource.all.length === 1, 'the first connection');
  const first = FakeEventSource.all[0];
  first.open();
  first.send('message', 'one', '1');
  first.send('message', 'two', '2');
  // refreshBefore 1800 of a token living ≤ 2 s: replaced after ≤ 200 ms (at least 250 ms).
  await until(() => FakeEventSource.all.length === 2, 'the replacement');
  const second = FakeEventSource.all[1];
  assert.match(second.url, /^https:\/\/rt\.example\.com\/streams\/orders\/42\?since=2&token=/);
  assert.equal(new URL(second.url).searchParams.get('token').split('.').length, 3);
  assert.notEqual(new URL(second.url).searchParams.get('token'), new URL(first.url).searchParams.get('token'));
  assert.ok(!first.closed, 'the old one stays until the new one is open');
  first.send('message', 'three', '3');
  second.open();
  assert.ok(first.closed, 'replaced');
  second.send('message', 'three', '3'); // replayed by the new one: already delivered
  second.send('message', 'four', '4');
  assert.deepEqual(seen, ['message orders/42#1 one', 'message orders/42#2 two', 'message orders/42#3 three', 'message orders/42#4 four']);
});

test('after an answer EventSource gives up on, the client reconnects with a fresh token at the cursors', async () => {
  let n = 0;
  const errors = [];
  const { sub, seen } = start({ stream: 's', token: () => `tok${++n}` });
  sub.addEventListener('error', () => errors.push(sub.readyState));
  await until(() => FakeEventSource.all.length === 1, 'the connection');
  const first = FakeEventSource.all[0];
  first.open();
  first.send('message', 'one', '7');
  first.fail(false); // EventSource reconnects by itself
  assert.equal(FakeEventSource.all.length, 1);
  first.fail(true); // a 401: EventSource gives up
  assert.deepEqual(errors, [0, 0]);
  await until(() => FakeEventSource.all.length === 2, 'the client reconnecting (0.5–1.5 s)');
  assert.equal(FakeEventSource.all[1].url, 'https://rt.example.com/streams/s?since=7&token=tok2');
  FakeEventSource.all[1].open();
  assert.equal(sub.readyState, 1);
  assert.deepEqual(seen, ['message s#7 one']);
});

test('a token function that fails is retried; a string token that expired closes the subscription', async () => {
  let calls = 0;
  const errors = [];
  const { sub } = start({ stream: 's', token: () => (++calls === 1 ? Promise.reject(new Error('backend down')) : 'ok') });
  sub.addEventListener('error', (e) => errors.push(e.message));
  await until(() => FakeEventSource.all.length === 1, 'the connection after the retry');
  assert.deepEqual(errors, ['pgsse: the token function failed: backend down']);
  assert.equal(FakeEventSource.all[0].url, 'https://rt.example.com/streams/s?token=ok');

  const expired = start({ stream: 's', token: jwt({ exp: Math.floor(Date.now() / 1000) - 1 }) });
  const why = [];
  expired.sub.addEventListener('error', (e) => why.push(e.message));
  await until(() => expired.sub.readyState === 2, 'closed');
  assert.deepEqual(why, ['pgsse: the token has expired and there is no token function to get another']);
  assert.equal(FakeEventSource.all.length, 1, 'no connection with the expired token');
});
