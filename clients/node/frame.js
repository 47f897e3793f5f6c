// The hub's wire protocol (docs/hub-protocol.md): frames, their encoder and decoder.

export const MAX_BODY = 65536; // largest body length N a frame may announce (type byte included)
export const MAX_NAME = 64; // longest HELLO name
export const MAX_CHANNEL = 63; // PostgreSQL's identifier limit
const VERSION = 1;

export const HELLO = 0x01, SUB = 0x02, UNSUB = 0x03, PING = 0x04;
export const ACK = 0x81, NOTIFY = 0x82, STATUS = 0x83, PONG = 0x84;
export const TYPE_NAMES = Object.freeze({
  [HELLO]: 'HELLO', [SUB]: 'SUB', [UNSUB]: 'UNSUB', [PING]: 'PING',
  [ACK]: 'ACK', [NOTIFY]: 'NOTIFY', [STATUS]: 'STATUS', [PONG]: 'PONG',
});
export const LOSSLESS = 0, WAKE = 1;
export const ACK_CODES = Object.freeze({ 0: 'OK', 1: 'BAD_CHANNEL', 2: 'LISTEN_FAILED', 3: 'LIMIT', 4: 'NOT_SUBSCRIBED' });
export const STATUS_CODES = Object.freeze({
  1: 'READY', 2: 'LISTENER_DOWN', 3: 'RESYNC', 4: 'SHUTDOWN', 5: 'EVICTED', 6: 'PROTOCOL_ERROR',
});
export const READY = 1, LISTENER_DOWN = 2, RESYNC = 3, SHUTDOWN = 4, EVICTED = 5, PROTOCOL_ERROR = 6;

/** Bytes that break docs/hub-protocol.md; the connection cannot go on. */
export class ProtocolError extends Error {
  constructor(message) {
    super(message);
    this.name = 'ProtocolError';
  }
}

const EMPTY = Buffer.alloc(0);

/**
 * A frame: only the fields of its type are meaningful (docs/hub-protocol.md, Frames): HELLO
 * version/pid/name, SUB req/mode/channel, UNSUB req/channel, PING and PONG token (a BigInt),
 * ACK req/code/text, NOTIFY pid/channel/text (the payload), STATUS code/channel/text. Byte
 * fields are Buffers.
 */
export function frame(type, fields = {}) {
  const f = {
    type, version: 0, pid: 0, name: EMPTY, req: 0, mode: 0, channel: EMPTY, code: 0, text: EMPTY, token: 0n,
    ...fields,
  };
  for (const k of ['name', 'channel', 'text']) f[k] = Buffer.from(f[k]);
  f.token = BigInt(f.token);
  return f;
}

function checkChannel(ch, allowEmpty = false) {
  if (ch.length === 0 && allowEmpty) return;
  if (ch.length < 1 || ch.length > MAX_CHANNEL) {
    throw new ProtocolError(`channel must be 1-${MAX_CHANNEL} bytes, got ${ch.length}`);
  }
  if (ch.includes(0)) throw new ProtocolError('channel contains a NUL byte');
}

/**
 * Decodes the frame at buf[start..]. Returns [frame, bytes used], or [null, 0] when buf holds
 * only part of a frame. Throws ProtocolError for a length of 0 or over 65536, an unknown type
 * or code, or a field cut short — as soon as the bytes show it. Byte fields are copies.
 */
export function decode(buf, start = 0) {
  const avail = buf.length - start;
  if (avail < 4) return [null, 0];
  const n = buf.readUInt32BE(start);
  if (n < 1 || n > MAX_BODY) throw new ProtocolError(`frame length ${n} is outside 1-${MAX_BODY}`);
  if (avail < 5) return [null, 0];
  const t = buf[start + 4];
  if (!(t in TYPE_NAMES)) throw new ProtocolError(`unknown frame type 0x${t.toString(16).padStart(2, '0')}`);
  if (avail < 4 + n) return [null, 0];
  const b = buf.subarray(start + 5, start + 4 + n);
  const name = TYPE_NAMES[t];
  const need = (k) => {
    if (b.length < k) throw new ProtocolError(`${name} frame ends inside a field`);
  };
  let f;
  switch (t) {
    case HELLO:
      need(5);
      if (b[0] !== VERSION) throw new ProtocolError(`HELLO version ${b[0]} (want ${VERSION})`);
      if (b.length - 5 > MAX_NAME) throw new ProtocolError(`HELLO name longer than ${MAX_NAME} bytes`);
      f = frame(t, { version: b[0], pid: b.readUInt32BE(1), name: b.subarray(5) });
      break;
    case SUB:
      need(5);
      if (b[4] > WAKE) throw new ProtocolError(`SUB mode ${b[4]} (want 0 or 1)`);
      checkChannel(b.subarray(5));
      f = frame(t, { req: b.readUInt32BE(0), mode: b[4], channel: b.subarray(5) });
      break;
    case UNSUB:
      need(4);
      checkChannel(b.subarray(4));
      f = frame(t, { req: b.readUInt32BE(0), channel: b.subarray(4) });
      break;
    case PING:
    case PONG:
      need(8);
      if (b.length > 8) throw new ProtocolError(`${name} body must be exactly a u64 token`);
      f = frame(t, { token: b.readBigUInt64BE(0) });
      break;
    case ACK:
      need(5);
      if (!(b[4] in ACK_CODES)) throw new ProtocolError(`ACK code ${b[4]} is not 0-4`);
      f = frame(t, { req: b.readUInt32BE(0), code: b[4], text: b.subarray(5) });
      break;
    case NOTIFY: {
      need(5);
      const end = 5 + b[4];
      need(end);
      checkChannel(b.subarray(5, end));
      f = frame(t, { pid: b.readUInt32BE(0), channel: b.subarray(5, end), text: b.subarray(end) });
      break;
    }
    default: { // STATUS
      need(2);
      if (!(b[0] in STATUS_CODES)) throw new ProtocolError(`STATUS code ${b[0]} is not 1-6`);
      const end = 2 + b[1];
      need(end);
      checkChannel(b.subarray(2, end), true);
      f = frame(t, { code: b[0], channel: b.subarray(2, end), text: b.subarray(end) });
    }
  }
  return [f, 4 + n];
}

/** Encodes a frame (any type) to its bytes: length, type, fields. */
export function encode(f) {
  const u32 = (v) => { const x = Buffer.alloc(4); x.writeUInt32BE(v); return x; };
  const u64 = (v) => { const x = Buffer.alloc(8); x.writeBigUInt64BE(BigInt(v)); return x; };
  const u8 = (...v) => Buffer.from(v);
  const ch = Buffer.from(f.channel ?? EMPTY), text = Buffer.from(f.text ?? EMPTY);
  let parts;
  switch (f.type) {
    case HELLO: parts = [u8(HELLO, f.version || VERSION), u32(f.pid ?? 0), Buffer.from(f.name ?? EMPTY).subarray(0, MAX_NAME)]; break;
    case SUB: parts = [u8(SUB), u32(f.req ?? 0), u8(f.mode ?? 0), ch]; break;
    case UNSUB: parts = [u8(UNSUB), u32(f.req ?? 0), ch]; break;
    case PING: case PONG: parts = [u8(f.type), u64(f.token ?? 0n)]; break;
    case ACK: parts = [u8(ACK), u32(f.req ?? 0), u8(f.code ?? 0), text]; break;
    case NOTIFY: parts = [u8(NOTIFY), u32(f.pid ?? 0), u8(ch.length), ch, text]; break;
    case STATUS: parts = [u8(STATUS, f.code ?? 0, ch.length), ch, text]; break;
    default: throw new TypeError(`unknown frame type ${f.type}`);
  }
  const body = Buffer.concat(parts);
  if (body.length > MAX_BODY) throw new RangeError(`frame body of ${body.length} bytes exceeds ${MAX_BODY}`);
  return Buffer.concat([u32(body.length), body]);
}

/** Buffers bytes as they arrive (frames come in arbitrary pieces) and yields whole frames. */
export class Decoder {
  #buf = EMPTY;
  #off = 0;

  feed(data) {
    const rest = this.#buf.subarray(this.#off);
    this.#buf = rest.length === 0 ? data : Buffer.concat([rest, data]);
    this.#off = 0;
  }

  /** The next whole frame, or null until more bytes arrive; throws ProtocolError. */
  next() {
    const [f, n] = decode(this.#buf, this.#off);
    this.#off += n;
    return f;
  }
}
