// pgsse-hub against the real hub of a real `pgsse serve` and a real PostgreSQL.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { describe, test } from 'node:test';
import * as h from '../index.js';
import { pgSession } from '../examples/pg-session.js';
import { DSN, Events, noOwnSessions, notify, ownSessions, Server, skipLive, sql, terminateListenSession } from './support.js';

const quiet = { warn() {}, info() {}, error() {} };

describe('HubClient against a real hub', { skip: skipLive }, () => {
  const withHub = (fn) => async () => {
    const server = await Server.start();
    const hub = await h.HubClient.connect(server.socket, { name: 'node-test' });
    try {
      await fn(hub, new Events(hub), server);
    } finally {
      hub.close();
      await server.close();
    }
  };

  test('ACK only after LISTEN: a NOTIFY right after subscribe resolves arrives', withHub(async (hub, events) => {
    for (let i = 0; i < 25; i++) {
      const ch = `ack_${i}_${process.pid}`; // fresh channels: every SUB waits for a LISTEN
      await hub.subscribe(ch);
      await notify(ch, `n${i}`);
      const ev = await events.nextNotification();
      assert.deepEqual([ev.channel, ev.payload], [ch, `n${i}`]);
      assert.ok(ev.pid > 0);
    }
  }));

  test('lossless: 10,000 notifications in order', withHub(async (hub, events) => {
    await hub.subscribe('bulk');
    for (let k = 0; k < 10; k++) {
      await sql(`SELECT pg_notify('bulk', g::text) FROM generate_series(${k * 1000 + 1}, ${k * 1000 + 1000}) g`);
    }
    const got = [];
    while (got.length < 10000) {
      const ev = await events.next(`notification ${got.length + 1} of 10000`);
      assert.equal(ev.kind, 'notification', JSON.stringify(ev));
      got.push(Number(ev.payload));
    }
    assert.deepEqual(got, Array.from({ length: 10000 }, (_, i) => i + 1));
  }));

  test("RESYNC after the hub's LISTEN session is terminated", withHub(async (hub, events) => {
    await hub.subscribe('jobs');
    assert.equal(await terminateListenSession(), 1);
    assert.deepEqual(await events.next('LISTENER_DOWN', 15000), { kind: 'down' });
    assert.deepEqual(await events.next('RESYNC', 30000), { kind: 'resync', channel: null });
    await notify('jobs', 'after');
    assert.equal((await events.nextNotification()).payload, 'after');
  }));

  test('UNSUB, PING and refused SUBs', withHub(async (hub, events) => {
    await hub.subscribe('a');
    await hub.subscribe('a'); // idempotent
    await hub.subscribe('b');
    assert.deepEqual(hub.channels(), ['a', 'b']);
    await hub.unsubscribe('a');
    await notify('a', 'dropped');
    await notify('b', 'kept');
    assert.equal((await events.nextNotification()).payload, 'kept');
    await assert.rejects(hub.unsubscribe('a'), RangeError);
    await assert.rejects(hub.subscribe('pgsse'), (err) => err instanceof h.AckError && err.codeName === 'BAD_CHANNEL' && err.message.includes('BAD_CHANNEL'));
    await assert.rejects(hub.subscribe('x'.repeat(64)), TypeError);
    assert.ok((await hub.ping()) < 5000);
    await notify('b', 'still usable');
    assert.equal((await events.nextNotification()).payload, 'still usable');
  }));

  test('SHUTDOWN stops the client with the reason', withHub(async (hub, events, server) => {
    await hub.subscribe('jobs');
    await server.stop();
    const ev = await events.next('failure');
    assert.equal(ev.kind, 'failure');
    assert.equal(ev.failure.reason, 'shutdown');
    assert.equal((await hub.done).reason, 'shutdown');
  }));
});

describe("Failover to the application's own session", { skip: skipLive }, () => {
  const withFailover = (serverArgs, fn, opts = {}) => async () => {
    const server = serverArgs ? await Server.start(...serverArgs) : null;
    let sockPath = server?.socket;
    if (!server) { // a socket file nobody accepts on: connection refused
      sockPath = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'pgsse-node-')), 'nobody.sock');
      const l = net.createServer();
      await new Promise((resolve) => l.listen(sockPath, resolve));
      await new Promise((resolve) => l.close(resolve));
      fs.writeFileSync(sockPath, ''); // the path exists but is no socket anyone listens on
    }
    const f = new h.Failover(sockPath, { direct: (sink) => pgSession(DSN, sink), name: 'node-failover', logger: quiet, ...opts });
    const events = new Events(f);
    try {
      await fn(f, events, server);
    } finally {
      await f.close();
      await server?.close();
      await noOwnSessions();
    }
  };

  async function checkSwitch(f, events, reason, down = true) {
    let ev = await events.next(down ? 'down' : 'resync', 15000);
    while (ev.kind === 'down') ev = await events.next('resync', 30000); // the hub may report its session down as it stops
    assert.deepEqual(ev, { kind: 'resync', channel: null }, 'the switch is one resync of everything');
    assert.equal(f.source, 'direct');
    assert.equal(f.reason.reason, reason);
    assert.equal(await ownSessions(), 1);
    await notify('jobs', 'direct');
    ev = await events.next('a notification on the own session');
    assert.deepEqual([ev.kind, ev.channel, ev.payload], ['notification', 'jobs', 'direct'],
      "after the switch's resync comes the notification, not a second resync");
    await f.subscribe('later'); // subscribing after the switch LISTENs on the own session
    await notify('later', 'x');
    assert.equal((await events.nextNotification()).channel, 'later');
  }

  test('failover when pgsse is killed', withFailover([], async (f, events, server) => {
    await f.subscribe('jobs');
    assert.equal(f.source, 'hub');
    assert.equal(await ownSessions(), 0, 'no own session while the hub serves');
    await notify('jobs', 'via the hub');
    assert.equal((await events.nextNotification()).payload, 'via the hub');
    await server.kill();
    await checkSwitch(f, events, 'closed');
    // The own session is lost too: reopened with backoff, reported as down, then resync.
    const [{ n }] = await sql(`SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity
      WHERE application_name = 'worker-listen' AND datname = current_database()`);
    assert.equal(n, 1);
    assert.deepEqual(await events.next('down', 15000), { kind: 'down' });
    assert.deepEqual(await events.next('resync', 30000), { kind: 'resync', channel: null });
    await notify('jobs', 'reopened');
    assert.equal((await events.nextNotification()).payload, 'reopened');
  }));

  test('failover on SHUTDOWN', withFailover([], async (f, events, server) => {
    await f.subscribe('jobs');
    await server.stop();
    await checkSwitch(f, events, 'shutdown');
  }));

  test('failover when the socket refuses', withFailover(null, async (f, events) => {
    await f.subscribe('jobs');
    await checkSwitch(f, events, 'unavailable', false);
  }));

  test('failover on eviction', withFailover(['--hub-worker-buffer', '131080'], async (f, events, server) => {
    await f.subscribe('jobs');
    // A worker whose event loop is blocked reads nothing: the socket and then the hub's ring fill
    // up. The notifications are sent by a child process while this one's loop is blocked in
    // execFileSync — sent from here, they would be read as they come (the hub writes a burst as
    // fast as the worker reads, and awaiting the query leaves the loop free to read). Then stay
    // blocked (without spinning) until the hub's log says it evicted us.
    execFileSync(process.execPath, ['--input-type=module', '-e',
      `import { sql } from ${JSON.stringify(new URL('./support.js', import.meta.url).href)};
       await sql("SELECT pg_notify('jobs', repeat('x', 7000) || g) FROM generate_series(1, 400) g");`],
    { env: process.env, stdio: ['ignore', 'ignore', 'inherit'] });
    const pause = new Int32Array(new SharedArrayBuffer(4));
    const deadline = Date.now() + 30000;
    while (!server.log.includes('evicting a worker')) {
      assert.ok(Date.now() < deadline, 'the hub did not evict within 30 s');
      Atomics.wait(pause, 0, 0, 50); // polling the hub's log file: it is the observable
    }
    let ev;
    do ev = await events.next('the switch after eviction', 30000); while (ev.kind === 'notification');
    assert.deepEqual(ev, { kind: 'down' });
    assert.deepEqual(await events.next('resync', 30000), { kind: 'resync', channel: null });
    assert.equal(f.reason.reason, 'evicted');
    await notify('jobs', 'direct');
    assert.equal((await events.nextNotification()).payload, 'direct');
  }));
});

describe('each STATUS code, from a scripted hub peer', () => {
  async function scripted(frames, { answerSub = true } = {}) {
    const sockPath = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'pgsse-node-')), 'hub.sock');
    const srv = net.createServer((c) => {
      const d = new h.Decoder();
      c.on('data', (data) => {
        d.feed(data);
        for (let f = d.next(); f; f = d.next()) {
          if (f.type === h.HELLO) c.write(h.encode(h.frame(h.STATUS, { code: h.READY })));
          else if (f.type === h.SUB && answerSub) c.write(Buffer.concat([h.encode(h.frame(h.ACK, { req: f.req })), ...frames.map(h.encode)]));
        }
      });
      c.on('error', () => {});
    });
    await new Promise((resolve) => srv.listen(sockPath, resolve));
    return { sockPath, close: () => new Promise((resolve) => { srv.close(resolve); }) };
  }

  const status = (code, channel = '', text = '') => h.frame(h.STATUS, { code, channel: Buffer.from(channel), text: Buffer.from(text) });
  const marker = h.frame(h.NOTIFY, { pid: 1, channel: Buffer.from('jobs'), text: Buffer.from('marker') });
  const cases = [
    ['LISTENER_DOWN', status(h.LISTENER_DOWN), { kind: 'down' }, null],
    ['RESYNC all', status(h.RESYNC), { kind: 'resync', channel: null }, null],
    ['RESYNC channel', status(h.RESYNC, 'jobs'), { kind: 'resync', channel: 'jobs' }, null],
    ['RESYNC other channel', status(h.RESYNC, 'other'), null, null],
    ['READY again', status(h.READY), null, null],
    ['SHUTDOWN', status(h.SHUTDOWN, '', 'bye'), null, 'shutdown'],
    ['EVICTED', status(h.EVICTED, '', 'slow'), null, 'evicted'],
    ['PROTOCOL_ERROR', status(h.PROTOCOL_ERROR, '', 'bad'), null, 'protocol'],
    ["a worker's frame", h.frame(h.PING, { token: 1 }), null, 'protocol'],
  ];
  for (const [name, fr, wantEvent, wantFailure] of cases) {
    test(name, async () => {
      const peer = await scripted(wantFailure ? [fr] : [fr, marker]);
      const c = await h.HubClient.connect(peer.sockPath, { pingInterval: 0 });
      const events = new Events(c);
      try {
        await c.subscribe('jobs');
        let ev = await events.next(name, 5000);
        if (wantFailure) {
          assert.equal(ev.kind, 'failure');
          assert.equal(ev.failure.reason, wantFailure);
          return;
        }
        if (wantEvent) {
          assert.deepEqual(ev, wantEvent);
          ev = await events.next('the marker', 5000);
        }
        assert.equal(ev.payload, 'marker');
      } finally {
        c.close();
        await peer.close();
      }
    });
  }

  test('a silent hub fails with timeout', async () => {
    // The peer answers HELLO and SUB but never a PING: two silent intervals end the client.
    const peer = await scripted([]);
    const c = await h.HubClient.connect(peer.sockPath, { pingInterval: 100 });
    try {
      await c.subscribe('jobs');
      assert.equal((await c.done).reason, 'timeout');
    } finally {
      c.close();
      await peer.close();
    }
  });

  test('failover on PROTOCOL_ERROR', { skip: skipLive }, async () => {
    const peer = await scripted([status(h.PROTOCOL_ERROR, '', 'bad')]);
    const f = new h.Failover(peer.sockPath, { direct: (sink) => pgSession(DSN, sink), pingInterval: 0, logger: quiet });
    const events = new Events(f);
    try {
      await f.subscribe('jobs');
      assert.deepEqual(await events.next('down'), { kind: 'down' });
      assert.deepEqual(await events.next('resync', 30000), { kind: 'resync', channel: null });
      assert.deepEqual([f.source, f.reason.reason, f.reason.detail], ['direct', 'protocol', 'bad']);
      await notify('jobs', 'direct');
      assert.equal((await events.nextNotification()).payload, 'direct');
    } finally {
      await f.close();
      await peer.close();
    }
  });

  test('no ACK within the deadline', async () => {
    const peer = await scripted([], { answerSub: false });
    const c = await h.HubClient.connect(peer.sockPath, { ackTimeout: 500, pingInterval: 0 });
    try {
      await assert.rejects(c.subscribe('jobs'), (err) => err instanceof h.HubFailure && err.reason === 'ack_timeout');
    } finally {
      c.close();
      await peer.close();
    }
  });
});
