// pgsse-hub: a worker client for the hub socket of `pgsse serve --hub-socket` (no dependencies).
//
// Worker processes share pgsse's one PostgreSQL LISTEN session through the hub; the wire
// protocol is docs/hub-protocol.md. It mirrors the Go package pglisten:
//
// - HubClient speaks the protocol: HELLO, SUB answered only once the LISTEN completed on pgsse's
//   session (subscribe resolves on ACK OK and rejects with an AckError naming the code
//   otherwise), UNSUB, PING/PONG keepalive, NOTIFY, every STATUS.
// - Failover is what a worker wants: the hub first and, on connection refused, EOF, no ACK
//   within 5 s, a silent hub, EVICTED, PROTOCOL_ERROR or SHUTDOWN, a switch once and for good to
//   the application's own LISTEN session (an adapter over its own driver, e.g. npm pg),
//   re-LISTENing every recorded channel and then reporting one resync of everything.
//
// Both are EventEmitters: 'notification' ({channel, payload, bytes, pid}), 'down' (notifications
// may be missed until the next resync), 'resync' (channel, or null = every channel: re-read your
// state). Events are emitted in the order the hub (or PostgreSQL) sent them.

import { EventEmitter } from 'node:events';
import net from 'node:net';
import path from 'node:path';
import {
  ACK, ACK_CODES, Decoder, encode, EVICTED, frame, HELLO, LISTENER_DOWN, LOSSLESS, MAX_CHANNEL, MAX_NAME, NOTIFY,
  PING, PONG, PROTOCOL_ERROR, ProtocolError, READY, RESYNC, SHUTDOWN, STATUS, STATUS_CODES, SUB, TYPE_NAMES, UNSUB,
} from './frame.js';

export * from './frame.js';

/**
 * The hub client stopped. reason is one of 'unavailable' (no socket, connection refused),
 * 'closed' (EOF), 'ack_timeout', 'timeout' (no answer to PING), 'evicted', 'shutdown',
 * 'protocol', 'closed_by_application'; detail is what the hub or the socket said.
 */
export class HubFailure extends Error {
  constructor(reason, detail = '') {
    super(`pgsse hub: ${reason}${detail ? `: ${detail}` : ''}`);
    this.name = 'HubFailure';
    this.reason = reason;
    this.detail = detail;
  }
}

/**
 * The hub refused a SUB or UNSUB (codeName 'BAD_CHANNEL', 'LISTEN_FAILED', 'LIMIT' or
 * 'NOT_SUBSCRIBED'). The client stays usable.
 */
export class AckError extends Error {
  constructor(channel, code, message) {
    const codeName = ACK_CODES[code] ?? String(code);
    super(`pgsse hub refused ${JSON.stringify(channel)}: ${codeName}: ${message}`);
    this.name = 'AckError';
    this.channel = channel;
    this.code = code;
    this.codeName = codeName;
    this.ackMessage = message;
  }
}

/** A channel name as the hub and PostgreSQL take it: 1-63 bytes without NUL (else TypeError). */
function channelName(channel) {
  const ch = String(channel);
  const n = Buffer.byteLength(ch);
  if (n < 1 || n > MAX_CHANNEL || ch.includes('\0')) {
    throw new TypeError(`channel ${JSON.stringify(ch)}: must be 1-${MAX_CHANNEL} bytes without NUL`);
  }
  return ch;
}

function statusFailure(f) {
  const reason = { [SHUTDOWN]: 'shutdown', [EVICTED]: 'evicted', [PROTOCOL_ERROR]: 'protocol' }[f.code] ?? 'protocol';
  return new HubFailure(reason, f.text.toString() || STATUS_CODES[f.code]);
}

const defaultLogger = {
  warn: (msg) => console.warn(`pgsse-hub: ${msg}`),
  info: () => {},
  error: (msg) => console.error(`pgsse-hub: ${msg}`),
};

/**
 * One connection to the hub (docs/hub-protocol.md). HubClient.connect resolves once the hub
 * answered HELLO with STATUS READY and rejects with a HubFailure if it is not there or does not
 * take the worker. On any later failure the client stops and emits 'failure' (a HubFailure;
 * also `client.failure`, and `client.done` resolves with it). Use Failover to fall back to the
 * application's own session.
 */
export class HubClient extends EventEmitter {
  #sock;
  #dec = new Decoder();
  #subs = new Set();
  #pending = new Map(); // req -> {channel, unsub, resolve, reject, timer}
  #pongs = new Map();
  #req = 0;
  #opts;
  #pingTimer = null;
  #pingSent = 0;
  #lastRecv = Date.now();
  #resolveDone;

  /** The HubFailure that stopped the client (null while it runs). */
  failure = null;
  /** The last state STATUS was LISTENER_DOWN (no RESYNC since). */
  lastDown = false;

  constructor(sock, opts) {
    super();
    this.#sock = sock;
    this.#opts = opts;
    this.done = new Promise((resolve) => { this.#resolveDone = resolve; });
  }

  /**
   * Connects to the hub socket at socketPath, says HELLO and waits for STATUS READY.
   * Options: name (≤ 64 bytes, default the script's name), mode (LOSSLESS or WAKE),
   * connectTimeout (ms, 2000), ackTimeout (ms, 5000), pingInterval (ms, 5000; 0 = off).
   */
  static connect(socketPath, opts = {}) {
    const o = {
      name: path.basename(process.argv[1] ?? 'node'), mode: LOSSLESS, connectTimeout: 2000, ackTimeout: 5000,
      pingInterval: 5000, ...opts,
    };
    return new Promise((resolve, reject) => {
      const sock = net.createConnection(socketPath);
      const dec = new Decoder();
      let settled = false;
      const settle = (err) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        sock.removeAllListeners('data');
        sock.removeAllListeners('error');
        sock.removeAllListeners('close');
        if (err) {
          sock.destroy();
          reject(err);
          return;
        }
        const c = new HubClient(sock, o);
        c.#dec = dec;
        c.#start();
        resolve(c);
      };
      const timer = setTimeout(() => settle(new HubFailure('unavailable', `${socketPath}: no STATUS READY within ${o.connectTimeout} ms`)), o.connectTimeout);
      sock.on('connect', () => {
        sock.write(encode(frame(HELLO, { pid: process.pid, name: Buffer.from(o.name).subarray(0, MAX_NAME) })));
      });
      sock.on('data', (data) => {
        dec.feed(data);
        try {
          const f = dec.next();
          if (!f) return;
          if (f.type === STATUS && f.code === READY) settle(null);
          else if (f.type === STATUS) settle(statusFailure(f));
          else settle(new HubFailure('protocol', `expected STATUS READY, got ${TYPE_NAMES[f.type]}`));
        } catch (err) {
          settle(new HubFailure('protocol', err.message));
        }
      });
      sock.on('error', (err) => settle(new HubFailure('unavailable', `${socketPath}: ${err.message}`)));
      sock.on('close', () => settle(new HubFailure('closed', 'EOF before READY')));
    });
  }

  #start() {
    this.#sock.on('data', (data) => {
      this.#lastRecv = Date.now();
      this.#dec.feed(data);
      this.#drain();
    });
    this.#sock.on('error', (err) => this.#fail(new HubFailure('closed', err.message)));
    this.#sock.on('close', () => this.#fail(new HubFailure('closed', 'EOF')));
    if (this.#opts.pingInterval > 0) {
      let lastSeen = null, stale = 0, token = 0n;
      this.#pingTimer = setInterval(() => {
        const recv = this.#lastRecv;
        if (this.#pingSent && recv === lastSeen) {
          if (++stale >= 2) this.#fail(new HubFailure('timeout', 'no answer to PING'));
          return;
        }
        stale = 0;
        lastSeen = recv;
        if (!this.#pingSent) {
          this.#pingSent = Date.now();
          this.#write(encode(frame(PING, { token: ++token })));
        }
      }, this.#opts.pingInterval);
      this.#pingTimer.unref();
    }
    // Frames that arrived together with READY: once the caller of connect has its listeners on.
    setImmediate(() => this.#drain());
  }

  #drain() {
    try {
      for (let f = this.#dec.next(); f && !this.failure; f = this.#dec.next()) this.#handle(f);
    } catch (err) {
      if (err instanceof ProtocolError) this.#fail(new HubFailure('protocol', err.message));
      else throw err; // the application's listener threw: not ours to hide
    }
  }

  #handle(f) {
    switch (f.type) {
      case NOTIFY: {
        const ch = f.channel.toString();
        if (!this.#subs.has(ch)) return; // unsubscribed while it was in flight
        this.emit('notification', { channel: ch, payload: f.text.toString(), bytes: f.text, pid: f.pid });
        return;
      }
      case ACK: {
        const p = this.#pending.get(f.req);
        if (!p) return;
        this.#pending.delete(f.req);
        clearTimeout(p.timer);
        // Subscribed from this frame on: a NOTIFY right behind the ACK is delivered.
        if (!p.unsub && f.code === 0) this.#subs.add(p.channel);
        p.resolve([f.code, f.text.toString()]);
        return;
      }
      case STATUS:
        switch (f.code) {
          case READY: return;
          case LISTENER_DOWN:
            this.lastDown = true;
            this.emit('down');
            return;
          case RESYNC:
            if (f.channel.length === 0) {
              this.lastDown = false;
              this.emit('resync', null);
            } else if (this.#subs.has(f.channel.toString())) {
              this.emit('resync', f.channel.toString());
            }
            return;
          default:
            this.#fail(statusFailure(f));
            return;
        }
      case PONG: {
        this.#pingSent = 0;
        const w = this.#pongs.get(f.token);
        if (w) {
          this.#pongs.delete(f.token);
          w.resolve();
        }
        return;
      }
      default:
        this.#fail(new HubFailure('protocol', `unexpected ${TYPE_NAMES[f.type]} frame from the hub`));
    }
  }

  #fail(failure) {
    if (this.failure) return;
    this.failure = failure;
    clearInterval(this.#pingTimer);
    this.#sock.destroy();
    for (const p of this.#pending.values()) {
      clearTimeout(p.timer);
      p.reject(failure);
    }
    this.#pending.clear();
    for (const w of this.#pongs.values()) w.reject(failure);
    this.#pongs.clear();
    this.#resolveDone(failure);
    if (failure.reason !== 'closed_by_application') this.emit('failure', failure);
  }

  #write(buf) {
    if (this.failure) throw this.failure;
    this.#sock.write(buf);
  }

  #request(channel, unsub) {
    if (this.failure) return Promise.reject(this.failure);
    this.#req = (this.#req + 1) >>> 0;
    const req = this.#req;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#fail(new HubFailure('ack_timeout', `no ACK for ${JSON.stringify(channel)} within ${this.#opts.ackTimeout} ms`));
      }, this.#opts.ackTimeout);
      this.#pending.set(req, { channel, unsub, resolve, reject, timer });
      this.#write(encode(unsub
        ? frame(UNSUB, { req, channel: Buffer.from(channel) })
        : frame(SUB, { req, mode: this.#opts.mode, channel: Buffer.from(channel) })));
    });
  }

  /**
   * Sends SUB and resolves once the hub answered ACK OK — which it does only once the LISTEN
   * completed on pgsse's PostgreSQL session: every notification committed after it resolved is
   * delivered. Rejects with an AckError (codeName says why) or a HubFailure.
   */
  async subscribe(channel) {
    const ch = channelName(channel);
    if (this.#subs.has(ch)) return;
    const [code, msg] = await this.#request(ch, false);
    if (code !== 0) throw new AckError(ch, code, msg);
  }

  /** Sends UNSUB; notifications for channel stop at once. Rejects if it was not subscribed. */
  async unsubscribe(channel) {
    const ch = channelName(channel);
    if (!this.#subs.delete(ch)) throw new RangeError(`not subscribed to ${JSON.stringify(ch)}`);
    const [code, msg] = await this.#request(ch, true);
    if (code !== 0 && code !== 4) throw new AckError(ch, code, msg);
  }

  /** Sends PING and resolves with the round trip in milliseconds once its PONG arrives. */
  ping(timeout = 5000) {
    this.#req = (this.#req + 1) >>> 0;
    const token = (1n << 63n) | BigInt(this.#req);
    const t0 = performance.now();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#pongs.delete(token);
        reject(new HubFailure('timeout', `no PONG within ${timeout} ms`));
      }, timeout);
      this.#pongs.set(token, {
        resolve: () => { clearTimeout(timer); resolve(performance.now() - t0); },
        reject: (e) => { clearTimeout(timer); reject(e); },
      });
      this.#write(encode(frame(PING, { token })));
    });
  }

  channels() { return [...this.#subs].sort(); }

  /** Closes the connection. */
  close() { this.#fail(new HubFailure('closed_by_application')); }
}

/**
 * The hub first; on its failure (see HubFailure) a switch once and for good to the
 * application's own LISTEN session, made by `direct(sink)` only then. After the switch every
 * recorded channel is LISTENed again and one 'resync' of everything (null) is emitted, preceded
 * by a 'down' if the hub had been connected: notifications between the two may have been
 * missed. A direct session that is lost later is reopened with backoff and reported the same
 * way ('down', then 'resync').
 *
 * `direct(sink)` returns (a promise of) the application's session: `listen(channel)` and
 * `unlisten(channel)` run LISTEN/UNLISTEN with the channel quoted as an identifier and resolve
 * once PostgreSQL answered; `close()`. The session calls `sink.notification(channel, payload,
 * pid)` for each notification and `sink.lost(err)` when its connection is gone
 * (clients/node/README.md has one for npm pg).
 */
export class Failover extends EventEmitter {
  #opts;
  #chans = new Set(); // recorded: subscribe called, not failed or unsubscribed
  #hub = null;
  #session = null; // the live direct session
  #live = null; // promise resolved when a direct session is live
  #setLive = null;
  #connecting;
  #closed = false;
  #switching = null;
  #interrupt = null; // ends the direct loop's current wait (a backoff, or a live session) at close

  /** 'hub' while notifications come from the hub, 'direct' once switched. */
  source = 'hub';
  /** The HubFailure that made it switch (null while on the hub). */
  reason = null;
  /** The last error of the direct session, if any. */
  directError = null;

  constructor(socketPath, { direct, logger = defaultLogger, ...opts } = {}) {
    super();
    if (typeof direct !== 'function') throw new TypeError('Failover needs direct: (sink) => session');
    this.#opts = { direct, logger, ...opts };
    this.#newLive();
    this.#connecting = HubClient.connect(socketPath, opts).then((hub) => {
      if (this.#closed) {
        hub.close();
        return;
      }
      this.#hub = hub;
      hub.on('notification', (ev) => this.emit('notification', ev));
      hub.on('down', () => this.emit('down'));
      hub.on('resync', (ch) => this.emit('resync', ch));
      hub.on('failure', (failure) => this.#switch(failure, !hub.lastDown));
    }, (failure) => this.#switch(failure, false));
  }

  #newLive() {
    this.#live = new Promise((resolve) => { this.#setLive = resolve; });
  }

  #switch(failure, reportDown) {
    if (this.#switching || this.#closed) return;
    this.reason = failure;
    this.source = 'direct';
    this.#hub = null;
    this.#opts.logger.warn(`${failure.message}; switching to the application's own LISTEN session for good`);
    this.#switching = this.#directSessions(reportDown);
  }

  async #directSessions(reportDown) {
    if (reportDown) this.emit('down');
    let backoff = 100, first = true;
    while (!this.#closed) {
      let session = null, lost;
      const gone = new Promise((resolve) => { lost = resolve; });
      this.#interrupt = () => lost(null);
      const sink = {
        dead: false,
        notification: (channel, payload, pid) => {
          if (sink.dead || !this.#chans.has(channel)) return;
          const bytes = Buffer.from(payload ?? '');
          this.emit('notification', { channel, payload: bytes.toString(), bytes, pid });
        },
        lost: (err) => { if (!sink.dead) lost(err ?? new Error('connection lost')); },
      };
      try {
        session = await this.#opts.direct(sink);
        for (const ch of [...this.#chans]) await session.listen(ch);
        if (this.#closed) return;
        this.#opts.logger.info(`own LISTEN session live (${this.#chans.size} channels); resyncing`);
        this.#session = session;
        this.#setLive(session);
        this.emit('resync', null);
        backoff = 100;
        first = false;
        const err = await gone; // null: close
        if (err === null) return;
        throw err;
      } catch (err) {
        if (this.#closed) return;
        this.directError = err;
        this.#opts.logger.error(`own LISTEN session: ${err.message} (retrying in ${backoff} ms)`);
        if (this.#session) {
          this.#session = null;
          this.#newLive();
        }
        if (!first) this.emit('down');
        first = true; // report the next loss only after a resync
      } finally {
        sink.dead = true;
        this.#interrupt = null;
        if (this.#closed && this.#session === session) this.#session = null;
        if (session && this.#session !== session) {
          try { await session.close(); } catch { /* gone anyway */ }
        }
      }
      await new Promise((resolve) => {
        const t = setTimeout(resolve, backoff);
        this.#interrupt = () => { clearTimeout(t); resolve(); };
      });
      this.#interrupt = null;
      backoff = Math.min(backoff * 2, 5000);
    }
  }

  async #directCall(op, ch) {
    for (;;) {
      if (this.#closed) throw new HubFailure('closed_by_application');
      const session = this.#session ?? await this.#live; // null once closed
      if (!session) throw new HubFailure('closed_by_application');
      try {
        return await session[op](ch);
      } catch (err) {
        if (this.#session === session) throw err; // refused, the session is fine
        // lost meanwhile: the next session re-LISTENs recorded channels; wait for it
      }
    }
  }

  /**
   * Records channel (a switch re-LISTENs it) and subscribes on the current side: resolves once
   * the LISTEN completed — on pgsse's session (ACK OK) or, after a switch, on the application's
   * own. Rejects with an AckError for a refused SUB, or the direct session's error.
   */
  async subscribe(channel) {
    const ch = channelName(channel);
    const had = this.#chans.has(ch);
    this.#chans.add(ch);
    try {
      await this.#connecting;
      const hub = this.#hub;
      if (hub) {
        try {
          return await hub.subscribe(ch);
        } catch (err) {
          if (!(err instanceof HubFailure)) throw err;
        }
      }
      await this.#directCall('listen', ch);
    } catch (err) {
      if (!had) this.#chans.delete(ch);
      throw err;
    }
  }

  /** Forgets channel and unsubscribes on the current side. Rejects if it was not subscribed. */
  async unsubscribe(channel) {
    const ch = channelName(channel);
    if (!this.#chans.delete(ch)) throw new RangeError(`not subscribed to ${JSON.stringify(ch)}`);
    await this.#connecting;
    const hub = this.#hub;
    if (hub) {
      try {
        return await hub.unsubscribe(ch);
      } catch (err) {
        if (err instanceof RangeError) return; // its SUB had not been acknowledged
        if (!(err instanceof HubFailure)) throw err;
      }
    }
    await this.#directCall('unlisten', ch);
  }

  /** PING/PONG round trip to the hub in ms (null once switched to the own session). */
  async ping(timeout = 5000) {
    await this.#connecting;
    return this.#hub ? this.#hub.ping(timeout) : null;
  }

  channels() { return [...this.#chans].sort(); }

  /** Stops the hub client or the own session (a switch in progress too); resolves once closed. */
  async close() {
    if (this.#closed) return;
    this.#closed = true;
    this.#setLive(null);
    this.#interrupt?.();
    this.#hub?.close();
    await this.#connecting;
    await this.#switching;
    const s = this.#session;
    this.#session = null;
    if (s) {
      try { await s.close(); } catch { /* gone anyway */ }
    }
  }
}
