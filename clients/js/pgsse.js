// pgsse.js — the browser client for pgsse (clients/js/README.md). An ES module with no build
// step and no dependencies; pgsse serves this file at GET /pgsse.js.
//
//   import { subscribe } from 'https://rt.example.com/pgsse.js'
//   const sub = subscribe({ streams: ['orders/42', 'chat/7'], token: () => fetch('/pgsse-token').then((r) => r.text()) })
//   sub.addEventListener('message', (e) => console.log(e.stream, e.id, e.data))
//
// What it adds to a bare EventSource:
//   - one stream (GET /streams/{s}) or several on one connection (GET /streams?stream=a&stream=b,
//     whose composite id `k:c0,c1,…` names the event's stream): each event carries its stream
//     and its id within that stream, and is delivered at most once per tab (per-stream cursors);
//   - one connection per browser, not per tab: the tabs of an origin that follow the same
//     streams elect a holder (Web Locks), which owns the EventSource and relays what it
//     receives to the others (BroadcastChannel); when the holder goes away another tab takes
//     over from the cursors it saw last. Without Web Locks or BroadcastChannel, each tab
//     connects on its own;
//   - token refresh: given a function, it is called for a fresh token before the current one's
//     exp, and the connection is reopened with it at the current cursors (the old one is closed
//     once the new one is open), so the server never ends the stream for an expired token;
//   - pgsse:gap and pgsse:presence as events naming their stream; after a failure EventSource
//     gives up on (a 401, a CORS refusal), it reconnects with backoff, with a fresh token.
//
// The object subscribe() returns looks enough like an EventSource (readyState, onopen,
// onmessage, onerror, addEventListener, close) for Turbo.connectStreamSource and
// htmx.createEventSource to take it.

export const VERSION = '0.1.0';

const CONNECTING = 0;
const OPEN = 1;
const CLOSED = 2;

// SPEC §2: stream names are 1–200 bytes of these characters.
const STREAM_NAME = /^[A-Za-z0-9._:@/=+~-]{1,200}$/;
// SPEC §3: a cursor is decimal digits, 0 … 2^63−1 (checked by length here, by the server fully).
const CURSOR = /^[0-9]{1,19}$/;
// Event types the client dispatches itself: never names of events on a stream.
const OWN_TYPES = new Set(['open', 'error', 'statechange']);
const GAP = 'pgsse:gap';
const PRESENCE = 'pgsse:presence';

/**
 * compareCursors orders two cursors given as decimal strings (ids may exceed 2^53, so they are
 * never turned into Numbers): negative, zero or positive as a < b, a = b, a > b.
 */
export function compareCursors(a, b) {
  a = a.replace(/^0+(?=.)/, '');
  b = b.replace(/^0+(?=.)/, '');
  if (a.length !== b.length) return a.length - b.length;
  return a < b ? -1 : a > b ? 1 : 0;
}

/**
 * parseEventId reads the id of a durable event on a connection following `count` streams:
 * a plain id on a one-stream connection (`17`), the composite `k:c0,c1,…` otherwise (SPEC §3c:
 * k is the position of the event's stream, ci each stream's cursor once this event is written;
 * an empty ci is a stream that has no position yet). Returns {index, cursors} (cursors as
 * strings, '' for empty entries), or null when id is not such an id.
 */
export function parseEventId(id, count) {
  if (typeof id !== 'string' || id === '') return null;
  if (count === 1 && CURSOR.test(id)) return { index: 0, cursors: [id] };
  const colon = id.indexOf(':');
  if (colon <= 0 || colon > 5) return null;
  const k = id.slice(0, colon);
  if (!/^[0-9]+$/.test(k)) return null;
  const index = Number(k);
  const cursors = id.slice(colon + 1).split(',');
  if (cursors.length !== count || index >= count) return null;
  for (const c of cursors) {
    if (c !== '' && !CURSOR.test(c)) return null;
  }
  if (cursors[index] === '') return null; // the event's own stream has its id
  return { index, cursors };
}

/**
 * tokenExpiry returns a JWT's exp in milliseconds since 1970, or null when the token has none
 * or is not a JWT. The token is decoded, not verified: only the server verifies.
 */
export function tokenExpiry(token) {
  if (typeof token !== 'string') return null;
  const parts = token.split('.');
  if (parts.length !== 3) return null;
  try {
    let b64 = parts[1].replace(/-/g, '+').replace(/_/g, '/');
    b64 += '='.repeat((4 - (b64.length % 4)) % 4);
    const bin = atob(b64);
    const bytes = Uint8Array.from(bin, (c) => c.charCodeAt(0));
    const claims = JSON.parse(new TextDecoder().decode(bytes));
    return typeof claims.exp === 'number' && Number.isFinite(claims.exp) ? claims.exp * 1000 : null;
  } catch {
    return null;
  }
}

/**
 * refreshDelay is how long after now (ms) a token expiring at expMS is replaced: halfway
 * through its remaining lifetime, but at least 1 s and at most 2 minutes before exp (timers of
 * a background tab may run up to a minute late; a loaded browser needs a second or two to
 * fetch a token and open a connection), or `before` ms before exp when given; never sooner
 * than 250 ms from now.
 */
export function refreshDelay(expMS, nowMS, before) {
  const life = expMS - nowMS;
  const margin = before ?? Math.min(120000, Math.max(1000, life / 2));
  return Math.max(250, life - margin);
}

/**
 * Cursors holds one tab's position in each stream of a subscription and decides what is new:
 * a durable event is delivered only if its id is past its stream's cursor, so events seen
 * twice — on two connections while one replaces the other, or relayed by a new holder that
 * resumed from an older cursor — reach the application once.
 */
export class Cursors {
  constructor(count, initial) {
    this.c = new Array(count).fill(undefined);
    if (initial) initial.forEach((v, i) => (this.c[i] = v == null ? undefined : String(v)));
  }

  /** get returns the cursor of stream i (a decimal string), or undefined. */
  get(i) {
    return this.c[i];
  }

  /**
   * event records a durable event of stream `index` with the connection's composite cursors
   * and reports whether it is new. A stream this tab had no position in takes the
   * connection's.
   */
  event(index, cursors) {
    const id = cursors[index];
    const cur = this.c[index];
    if (cur !== undefined && compareCursors(id, cur) <= 0) return false;
    this.c[index] = id;
    for (let i = 0; i < cursors.length; i++) {
      if (this.c[i] === undefined && cursors[i] !== '') this.c[i] = cursors[i];
    }
    return true;
  }

  /**
   * gap records a pgsse:gap of stream `index` ({after, resume}) and reports whether it is new
   * to this tab: delivery continues after resume, unless this tab is already past it.
   */
  gap(index, after, resume) {
    const cur = this.c[index];
    if (cur !== undefined && compareCursors(cur, resume) >= 0 && compareCursors(cur, after) > 0) return false;
    this.c[index] = resume;
    return true;
  }

  /**
   * adopt takes the positions of a tab that holds the connection for the streams this tab has
   * none in yet (a tab that joins an open connection starts where it stands), so that if this
   * tab takes over before another event is relayed it resumes from there, not live.
   */
  adopt(cursors) {
    if (!Array.isArray(cursors) || cursors.length !== this.c.length) return;
    cursors.forEach((v, i) => {
      if (this.c[i] === undefined && typeof v === 'string' && CURSOR.test(v)) this.c[i] = v;
    });
  }

  /**
   * since is the `since` query parameter that resumes every stream where this tab stands:
   * the plain cursor for one stream, `c0,c1,…` (empty = live from the head) for several;
   * null when no stream has a position.
   */
  since() {
    if (this.c.every((v) => v === undefined)) return null;
    return this.c.map((v) => v ?? '').join(',');
  }
}

/**
 * LinkReader turns what one EventSource delivers into routed messages. EventSource keeps the
 * last id for events without an `id:` line (WHATWG), so an event whose lastEventId did not
 * change is ephemeral (pgsse.broadcast): it has no id, and on a several-stream connection no
 * stream either (SPEC §3c). Returns {kind: 'event'|'gap'|'presence'|'bad', …}.
 */
export class LinkReader {
  constructor(streams) {
    this.streams = streams;
    this.lastId = '';
  }

  read(type, data, lastEventId) {
    const n = this.streams.length;
    if (type === GAP || type === PRESENCE) {
      let json;
      try {
        json = JSON.parse(data);
      } catch {
        return { kind: 'bad', reason: `${type} with data that is not JSON` };
      }
      const index = n === 1 && json?.stream === undefined ? 0 : this.streams.indexOf(json?.stream);
      if (index < 0) return { kind: 'bad', reason: `${type} names a stream this subscription does not follow` };
      return { kind: type === GAP ? 'gap' : 'presence', type, data, index, json };
    }
    if (lastEventId === this.lastId) {
      return { kind: 'event', type, data, lastEventId, index: n === 1 ? 0 : null, cursors: null };
    }
    this.lastId = lastEventId;
    const id = parseEventId(lastEventId, n);
    if (!id) return { kind: 'bad', reason: `an event id that is not one of pgsse's: ${JSON.stringify(lastEventId)}` };
    return { kind: 'event', type, data, lastEventId, index: id.index, cursors: id.cursors };
  }
}

/**
 * subscriptionURL is the EventSource URL following streams from base (pgsse's URL: scheme,
 * host and any path prefix), with the cursors `since`, `?presence=1` and `?token=`.
 */
export function subscriptionURL(base, streams, { since = null, token = null, presence = false } = {}) {
  const root = new URL(base);
  if (!root.pathname.endsWith('/')) root.pathname += '/';
  root.search = '';
  root.hash = '';
  const q = new URLSearchParams();
  let url;
  if (streams.length === 1) {
    url = new URL('streams/' + streams[0].split('/').map(encodeURIComponent).join('/'), root);
  } else {
    url = new URL('streams', root);
    for (const s of streams) q.append('stream', s);
  }
  if (since != null) q.set('since', since);
  if (presence) q.set('presence', '1');
  if (token != null && token !== '') q.set('token', token);
  const qs = q.toString();
  if (qs) url.search = '?' + qs;
  return url.href;
}

/**
 * PgsseEvent is what listeners receive for stream events: a MessageEvent (data, lastEventId)
 * that also names its stream (null for an ephemeral event on a several-stream connection) and
 * its id in that stream (a decimal string; null when ephemeral). pgsse:gap and pgsse:presence
 * carry their parsed data in json.
 */
export class PgsseEvent extends MessageEvent {
  constructor(type, init, stream, id, json) {
    super(type, init);
    this.stream = stream;
    this.id = id;
    this.json = json;
  }
}

function defaultBase() {
  try {
    return new URL('.', import.meta.url).href;
  } catch {
    return undefined;
  }
}

function jittered(ms) {
  return Math.round(ms * (0.5 + Math.random()));
}

let tabCounter = 0;

/**
 * Subscription follows one or several streams; see subscribe.
 */
export class Subscription extends EventTarget {
  constructor(options = {}) {
    super();
    const streams = options.streams ?? (options.stream != null ? [options.stream] : []);
    if (!Array.isArray(streams) || streams.length === 0) throw new TypeError('pgsse: give stream or streams');
    const seen = new Set();
    for (const s of streams) {
      if (typeof s !== 'string' || !STREAM_NAME.test(s)) {
        throw new TypeError(`pgsse: stream ${JSON.stringify(s)}: a stream name is 1–200 bytes of A-Z a-z 0-9 and . _ : @ / = + ~ -`);
      }
      if (seen.has(s)) throw new TypeError(`pgsse: stream ${s} is named twice`);
      seen.add(s);
    }
    const base = options.url ?? defaultBase();
    if (!base) throw new TypeError("pgsse: give url (pgsse's address), e.g. 'https://rt.example.com/'");
    this.streams = Object.freeze([...streams]);
    this.url = new URL(base).href;
    this.withCredentials = !!options.withCredentials;
    this.readyState = CONNECTING;
    /** 'holder' (this tab holds the connection), 'follower' (another tab does), 'alone' (not shared). */
    this.role = null;
    this.onopen = null;
    this.onmessage = null;
    this.onerror = null;

    this._presence = !!options.presence;
    this._token = options.token ?? null;
    if (this._token != null && typeof this._token !== 'string' && typeof this._token !== 'function') {
      throw new TypeError('pgsse: token is a string or a function returning one (or a Promise of one)');
    }
    this._refreshBefore = options.refreshBefore;
    this._names = new Set(['message']);
    for (const name of options.events ?? []) this._want(name, false);
    this._cursors = new Cursors(streams.length, initialSince(options.since, streams));
    this._share = options.share !== false;
    this._key = 'pgsse ' + JSON.stringify([this.url, this.streams, this._presence, this.withCredentials, String(options.shareKey ?? '')]);
    this._tab = `${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}-${++tabCounter}`;
    this._closed = false;
    this._link = null; // the connection events come from
    this._next = null; // while replacing it: the one being opened
    this._timer = null; // reconnect or refresh
    this._failures = 0;
    this._gen = 0; // of _connect calls: a later one supersedes one still waiting for its token
    this._presenceState = new Map(); // index → {present: Set, anonymous}: for tabs that join
    this._channel = null;
    this._abort = null;
    this._release = null;
    // Start once the caller has added its listeners (their event names count).
    queueMicrotask(() => this._start());
  }

  /** The position of this tab in stream (a decimal string), or undefined before any. */
  cursor(stream) {
    return this._cursors.get(this.streams.indexOf(stream));
  }

  addEventListener(type, listener, options) {
    super.addEventListener(type, listener, options);
    this._want(type);
  }

  /** close ends the subscription in this tab; if it held the connection, another tab takes over. */
  close() {
    if (this._closed) return;
    if (this.role === 'holder' && this.readyState === OPEN) this._post({ kind: 'state', state: CONNECTING });
    if (this._onPageHide) removeEventListener('pagehide', this._onPageHide);
    this._closed = true;
    this.readyState = CLOSED;
    clearTimeout(this._timer);
    this._drop(this._link);
    this._drop(this._next);
    this._link = this._next = null;
    this._abort?.abort();
    this._release?.();
    this._channel?.close();
  }

  // --- roles ------------------------------------------------------------------------------

  _start() {
    if (this._closed) return;
    const locks = globalThis.navigator?.locks;
    if (this._share && locks && typeof BroadcastChannel === 'function') {
      this._channel = new BroadcastChannel(this._key);
      this._channel.onmessage = (m) => this._onChannel(m.data);
      this._setRole('follower');
      this._post({ kind: 'hello', from: this._tab, names: [...this._names] });
      this._abort = new AbortController();
      locks
        .request(this._key, { signal: this._abort.signal }, () => this._hold())
        .catch((err) => {
          if (!this._closed) this._fail('pgsse: could not wait for the connection lock: ' + err);
        });
    } else {
      this._setRole('alone');
      this._connect();
    }
  }

  // _hold runs while this tab holds the lock: until close() or the tab goes away.
  _hold() {
    if (this._closed) return undefined;
    // A closing tab lets go of the lock at once rather than when the browser has torn the page
    // down, so that the next tab takes over sooner.
    if (!this._onPageHide && typeof addEventListener === 'function') {
      this._onPageHide = (e) => {
        if (!e.persisted) this.close();
      };
      addEventListener('pagehide', this._onPageHide);
    }
    this._setRole('holder');
    if (this.readyState === OPEN) this._setState(CONNECTING); // the previous holder's connection is gone
    this._post({ kind: 'holder', from: this._tab });
    this._connect();
    return new Promise((resolve) => (this._release = resolve));
  }

  _holds() {
    return !this._closed && (this.role === 'holder' || this.role === 'alone');
  }

  _setRole(role) {
    if (this.role === role) return;
    this.role = role;
    this.dispatchEvent(new Event('statechange'));
  }

  // _setState moves readyState; like EventSource, a failed attempt (failed) fires error, and
  // the move to OPEN fires open. The holder tells the other tabs.
  _setState(state, failed = false) {
    if (this._closed) return;
    const changed = this.readyState !== state;
    this.readyState = state;
    if (changed) this.dispatchEvent(new Event('statechange'));
    if ((changed && state === OPEN) || (state === CONNECTING && (changed || failed))) {
      this._emit(new Event(state === OPEN ? 'open' : 'error'));
    }
    if ((changed || failed) && this.role === 'holder') this._post({ kind: 'state', state, failed });
  }

  _fail(message) {
    const ev = new Event('error');
    ev.message = message;
    this._emit(ev);
  }

  // _emit dispatches ev, then calls the matching handler property, as EventSource does.
  _emit(ev) {
    this.dispatchEvent(ev);
    const h = ev.type === 'open' || ev.type === 'message' || ev.type === 'error' ? this['on' + ev.type] : null;
    if (typeof h === 'function') h.call(this, ev);
  }

  _post(msg) {
    try {
      this._channel?.postMessage(msg);
    } catch {
      // closed meanwhile
    }
  }

  // --- the other tabs ---------------------------------------------------------------------

  _onChannel(msg) {
    if (this._closed || !msg || msg.from === this._tab) return;
    switch (msg.kind) {
      case 'event':
      case 'gap':
      case 'presence':
        if (msg.to && msg.to !== this._tab) return;
        // Also as holder: what the previous holder relayed last may arrive after the lock.
        this._deliver(msg);
        return;
      case 'hello':
        // Every tab keeps the names all tabs listen to, so that whichever holds the
        // connection next listens to them from its first event.
        for (const n of msg.names ?? []) this._want(n, false);
        if (this.role !== 'holder') return;
        // Its positions go first: every event relayed after them is past them.
        this._post({ kind: 'state', state: this.readyState, to: msg.from, cursors: this._cursors.c });
        for (const [index, p] of this._presenceState) {
          const json = { stream: this.streams[index], present: [...p.present].sort(), anonymous: p.anonymous };
          this._post({ kind: 'presence', type: PRESENCE, data: JSON.stringify(json), index, json, to: msg.from });
        }
        return;
      case 'names':
        for (const n of msg.names ?? []) this._want(n, false);
        return;
      case 'holder':
        // A new holder: tell it which event names this tab listens to.
        if (this.role === 'follower') {
          this._post({ kind: 'hello', from: this._tab, names: [...this._names] });
          if (this.readyState === OPEN) this._setState(CONNECTING);
        }
        return;
      case 'state':
        if (msg.to && msg.to !== this._tab) return;
        if (msg.to) this._cursors.adopt(msg.cursors); // the holder's answer to this tab's hello
        if (this.role === 'follower') this._setState(msg.state === OPEN ? OPEN : CONNECTING, !!msg.failed);
        return;
    }
  }

  // _want makes the connection listen to events named type (EventSource delivers a named
  // event only to listeners of that name); announce tells the other tabs.
  _want(type, announce = true) {
    type = String(type);
    if (OWN_TYPES.has(type) || type === GAP || type === PRESENCE || this._names.has(type)) return;
    this._names.add(type);
    this._link?.listen(type);
    this._next?.listen(type);
    if (announce && this._channel) this._post({ kind: 'names', from: this._tab, names: [type] });
  }

  // --- delivery ---------------------------------------------------------------------------

  // _deliver hands a routed message to this tab's listeners if it is new here, and reports
  // whether it was.
  _deliver(msg) {
    const stream = msg.index == null ? null : this.streams[msg.index];
    switch (msg.kind) {
      case 'event': {
        if (msg.cursors && !this._cursors.event(msg.index, msg.cursors)) return false;
        const id = msg.cursors ? msg.cursors[msg.index] : null;
        this._emit(new PgsseEvent(msg.type, { data: msg.data, lastEventId: msg.lastEventId }, stream, id));
        return true;
      }
      case 'gap': {
        const after = String(msg.json.after);
        const resume = String(msg.json.resume);
        if (!CURSOR.test(after) || !CURSOR.test(resume)) return false;
        if (!this._cursors.gap(msg.index, after, resume)) return false;
        this.dispatchEvent(new PgsseEvent(GAP, { data: msg.data }, stream, null, msg.json));
        return true;
      }
      case 'presence':
        this._notePresence(msg.index, msg.json);
        this.dispatchEvent(new PgsseEvent(PRESENCE, { data: msg.data }, stream, null, msg.json));
        return true;
    }
    return false;
  }

  _notePresence(index, json) {
    let p = this._presenceState.get(index);
    if (Array.isArray(json.present)) {
      p = { present: new Set(json.present), anonymous: json.anonymous ?? 0 };
    } else if (p) {
      for (const s of json.join ?? []) p.present.add(s);
      for (const s of json.leave ?? []) p.present.delete(s);
      if (json.anonymous != null) p.anonymous = json.anonymous;
    } else {
      return; // a change without the list it changes: wait for the next full one
    }
    this._presenceState.set(index, p);
  }

  // _received handles a message from one of this tab's own connections.
  _received(link, msg) {
    if (this._closed) return;
    if (msg.kind === 'bad') {
      this._fail('pgsse: ' + msg.reason);
      return;
    }
    // Ephemeral events and presence are taken from one connection only: the one in use.
    if ((msg.kind === 'presence' || !msg.cursors) && link !== this._link) return;
    if (this._deliver(msg) && this.role === 'holder') this._post({ ...msg, from: this._tab });
  }

  // --- connections ------------------------------------------------------------------------

  // _connect opens a connection at the current cursors (with a fresh token when there is a
  // token function). With one open already, the new one replaces it once it is open.
  async _connect() {
    clearTimeout(this._timer);
    const gen = ++this._gen;
    let token = null;
    if (typeof this._token === 'function') {
      try {
        token = await this._token();
      } catch (err) {
        if (gen !== this._gen || !this._holds()) return;
        this._fail('pgsse: the token function failed: ' + (err?.message ?? err));
        this._retryLater();
        return;
      }
      if (gen !== this._gen || !this._holds()) return;
      if (typeof token !== 'string' || token === '') {
        this._fail('pgsse: the token function returned no token');
        this._retryLater();
        return;
      }
    } else if (typeof this._token === 'string') {
      token = this._token;
      if (this._expired()) return;
    }
    if (!this._holds() || gen !== this._gen) return;
    const url = subscriptionURL(this.url, this.streams, { since: this._cursors.since(), token, presence: this._presence });
    const link = new Link(this, url);
    if (this._link && this._link.es.readyState === OPEN) {
      this._drop(this._next);
      this._next = link;
    } else {
      this._drop(this._link);
      this._link = link;
    }
    if (typeof this._token === 'function') {
      const exp = tokenExpiry(token);
      if (exp !== null) this._timer = setTimeout(() => this._connect(), refreshDelay(exp, Date.now(), this._refreshBefore));
    }
  }

  // _expired closes the subscription, saying why, when its token is a string whose exp has
  // passed: nothing can make it valid again.
  _expired() {
    const exp = typeof this._token === 'string' ? tokenExpiry(this._token) : null;
    if (exp === null || exp > Date.now()) return false;
    this._fail('pgsse: the token has expired and there is no token function to get another');
    this.close();
    return true;
  }

  _retryLater() {
    if (!this._holds()) return;
    clearTimeout(this._timer);
    const ms = jittered(Math.min(30000, 1000 * 2 ** Math.min(this._failures++, 5)));
    this._timer = setTimeout(() => this._connect(), ms);
  }

  _drop(link) {
    if (link) link.close();
  }

  _opened(link) {
    if (this._closed) return;
    if (link === this._next) {
      this._drop(this._link); // replaced: the new one delivers from here on
      this._link = link;
      this._next = null;
    }
    if (link !== this._link) return;
    this._failures = 0;
    this._setState(OPEN);
  }

  _failed(link) {
    if (this._closed) return;
    const final = link.es.readyState === CLOSED;
    if (link === this._next) {
      if (final) {
        // The replacement was refused (the new token?): keep the open one, try again soon.
        this._next = null;
        link.close();
        this._fail('pgsse: could not open the replacement connection');
        this._retryLater();
      }
      return;
    }
    if (link !== this._link) return;
    if (this._expired()) return; // pgsse ended the stream at exp: reconnecting would be refused
    this._setState(CONNECTING, true);
    if (final) {
      // EventSource gives up after a non-200 answer (401 after exp, 403, a CORS refusal):
      // reopen with backoff, at the cursors, with a fresh token if there is a function.
      link.close();
      this._link = null;
      this._retryLater();
    }
    // Otherwise EventSource reconnects by itself after the server's retry: delay, sending
    // Last-Event-ID (the composite cursor of the last durable event).
  }
}

// Link is one EventSource of the tab that holds the connection.
class Link {
  constructor(sub, url) {
    this.sub = sub;
    this.reader = new LinkReader(sub.streams);
    this.names = new Set();
    this.onEvent = (e) => sub._received(this, this.reader.read(e.type, e.data, e.lastEventId));
    this.es = new EventSource(url, { withCredentials: sub.withCredentials });
    this.es.onopen = () => sub._opened(this);
    this.es.onerror = () => sub._failed(this);
    this.es.addEventListener(GAP, this.onEvent);
    this.es.addEventListener(PRESENCE, this.onEvent);
    for (const n of sub._names) this.listen(n);
  }

  listen(name) {
    if (this.names.has(name)) return;
    this.names.add(name);
    this.es.addEventListener(name, this.onEvent);
  }

  close() {
    this.es.onopen = this.es.onerror = null;
    this.es.close();
  }
}

function initialSince(since, streams) {
  if (since == null) return null;
  if (typeof since === 'number' || typeof since === 'bigint' || typeof since === 'string') {
    const s = String(since);
    if (!CURSOR.test(s)) throw new TypeError(`pgsse: since ${JSON.stringify(since)}: a cursor is decimal digits`);
    return streams.map(() => s);
  }
  if (typeof since === 'object') {
    for (const k of Object.keys(since)) {
      if (!streams.includes(k)) throw new TypeError(`pgsse: since names ${k}, which is not among the streams`);
    }
    return streams.map((s) => {
      const v = since[s];
      if (v == null) return null;
      if (!CURSOR.test(String(v))) throw new TypeError(`pgsse: since[${JSON.stringify(s)}]: a cursor is decimal digits`);
      return String(v);
    });
  }
  throw new TypeError('pgsse: since is a cursor or an object {stream: cursor}');
}

/**
 * subscribe follows one stream (`stream`) or several (`streams`, in an order that is part of
 * the subscription) and returns the Subscription; see clients/js/README.md for the options.
 */
export function subscribe(options) {
  return new Subscription(options);
}

Subscription.CONNECTING = CONNECTING;
Subscription.OPEN = OPEN;
Subscription.CLOSED = CLOSED;
