// URLs, tokens and option checks of pgsse.js.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { refreshDelay, subscribe, subscriptionURL, tokenExpiry } from '../pgsse.js';

test('subscriptionURL: one stream in the path, several in the query', () => {
  assert.equal(subscriptionURL('https://rt.example.com', ['orders/42']), 'https://rt.example.com/streams/orders/42');
  assert.equal(
    subscriptionURL('https://rt.example.com/pgsse/', ['a+b', 'chat:7@x=1'], { since: '4,', token: 'h.p.s', presence: true }),
    'https://rt.example.com/pgsse/streams?stream=a%2Bb&stream=chat%3A7%40x%3D1&since=4%2C&presence=1&token=h.p.s',
  );
  assert.equal(subscriptionURL('https://rt.example.com/pgsse', ['x'], { since: '0' }), 'https://rt.example.com/pgsse/streams/x?since=0', 'a prefix without its slash');
  assert.equal(subscriptionURL('http://127.0.0.1:8080/pgsse.js?v=1', ['a/b+c'], {}), 'http://127.0.0.1:8080/pgsse.js/streams/a/b%2Bc');
  assert.equal(subscriptionURL(new URL('http://127.0.0.1:8080/'), ['s'], { token: '' }), 'http://127.0.0.1:8080/streams/s');
});

// jwt is an unsigned token with the given claims: the client only decodes.
const jwt = (claims) =>
  ['{"alg":"HS256","typ":"JWT"}', JSON.stringify(claims)].map((s) => Buffer.from(s).toString('base64url')).join('.') + '.sig';

test('tokenExpiry decodes exp without verifying', () => {
  assert.equal(tokenExpiry(jwt({ exp: 1767225600, pgsse: { streams: ['ü/*'] } })), 1767225600000);
  assert.equal(tokenExpiry(jwt({ sub: 'x' })), null);
  assert.equal(tokenExpiry(jwt({ exp: '1767225600' })), null);
  assert.equal(tokenExpiry('not a token'), null);
  assert.equal(tokenExpiry('a.!!!.c'), null);
  // base64url with - and _ and no padding
  const t = jwt({ exp: 2000000000, x: '?>?>~~~' });
  assert.match(t.split('.')[1], /[-_]/);
  assert.equal(tokenExpiry(t), 2000000000000);
});

test('refreshDelay: halfway to exp, 1 s to 2 min before it, never at once', () => {
  const now = 1_000_000;
  assert.equal(refreshDelay(now + 5000, now), 2500);
  assert.equal(refreshDelay(now + 200_000, now), 100_000);
  assert.equal(refreshDelay(now + 2000, now), 1000, 'at least 1 s before');
  assert.equal(refreshDelay(now + 3600_000, now), 3600_000 - 120_000, 'at most 2 min before');
  assert.equal(refreshDelay(now + 600, now), 250, 'never sooner than 250 ms');
  assert.equal(refreshDelay(now - 10, now), 250);
  assert.equal(refreshDelay(now + 60_000, now, 10_000), 50_000, 'refreshBefore');
});

test('subscribe refuses what pgsse would', () => {
  const bad = [
    [{}, /give stream or streams/],
    [{ streams: [] }, /give stream or streams/],
    [{ stream: 'bad name' }, /stream "bad name": a stream name is/],
    [{ stream: 'x'.repeat(201) }, /a stream name is 1–200 bytes/],
    [{ streams: ['a', 'b', 'a'] }, /stream a is named twice/],
    [{ stream: 'a', url: 'http://x/', since: -1 }, /a cursor is decimal digits/],
    [{ stream: 'a', url: 'http://x/', since: { b: 1 } }, /since names b/],
    [{ stream: 'a', url: 'http://x/', token: 42 }, /token is a string or a function/],
  ];
  for (const [opts, re] of bad) assert.throws(() => subscribe(opts), re, JSON.stringify(opts));
});
