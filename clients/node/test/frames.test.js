// The frame decoder against the hex examples of docs/hub-protocol.md (read from the doc, not
// copied), and against malformed input.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import * as h from '../index.js';
import { ROOT } from './support.js';

const invert = (o) => Object.fromEntries(Object.entries(o).map(([k, v]) => [v, Number(k)]));
const TYPES = invert(h.TYPE_NAMES), ACKS = invert(h.ACK_CODES), STATUSES = invert(h.STATUS_CODES);

function section() {
  const text = fs.readFileSync(path.join(ROOT, 'docs', 'hub-protocol.md'), 'utf8');
  return text.split('## Worked example (hex)')[1].split('\n## ')[0];
}

/** [description, bytes] for each row of the 'Worked example (hex)' table. */
function rows() {
  const out = [];
  for (const line of section().split('\n')) {
    const cells = line.trim().replace(/^\|/, '').replace(/\|$/, '').split('|').map((c) => c.trim());
    if (cells.length !== 2 || !cells[1].startsWith('`')) continue;
    out.push([cells[0], Buffer.from([...cells[1].matchAll(/`([0-9a-f]+)`/g)].map((m) => m[1]).join(''), 'hex')]);
  }
  return out;
}

/** The frame a row's description names: 'SUB req 7, lossless, `jobs`'. */
function expected(desc) {
  const t = TYPES[desc.split(' ')[0]];
  const f = {};
  for (const k of ['req', 'pid', 'token', 'version']) {
    const m = desc.match(new RegExp(`\\b${k} (\\d+)`));
    if (m) f[k] = k === 'token' ? BigInt(m[1]) : Number(m[1]);
  }
  if (/\blossless\b/.test(desc)) f.mode = h.LOSSLESS;
  if (/\bwake\b/.test(desc)) f.mode = h.WAKE;
  const codes = t === h.ACK ? ACKS : t === h.STATUS ? STATUSES : {};
  for (const [name, code] of Object.entries(codes)) if (new RegExp(`\\b${name}\\b`).test(desc)) f.code = code;
  for (const [, label, value] of desc.matchAll(/(\w+)? ?`([^`]*)`/g)) {
    if (label === 'name') f.name = Buffer.from(value);
    else if (label === 'payload' || label === 'text' || t === h.ACK) f.text = Buffer.from(value);
    else f.channel = Buffer.from(value);
  }
  if (t === h.HELLO) f.version ??= 1;
  return h.frame(t, f);
}

test('the hex table rows decode to what they say', () => {
  const all = rows();
  assert.ok(all.length >= 16, 'rows of the hex table in docs/hub-protocol.md');
  const seen = new Set();
  for (const [desc, data] of all) {
    const want = expected(desc);
    const [f, n] = h.decode(data);
    assert.equal(n, data.length, `${desc}: one whole frame per row`);
    assert.deepEqual(f, want, desc);
    assert.deepEqual(h.encode(f), data, `${desc}: re-encodes to the same bytes`);
    const d = new h.Decoder(); // frames arrive in arbitrary pieces
    const got = [];
    for (let i = 0; i < data.length; i++) {
      d.feed(data.subarray(i, i + 1));
      const fr = d.next();
      if (fr) got.push([i, fr]);
    }
    assert.deepEqual(got, [[data.length - 1, want]], `${desc}: byte by byte`);
    if (f.type === h.STATUS) seen.add(f.code);
  }
  for (const [code, name] of Object.entries(h.STATUS_CODES)) assert.ok(seen.has(Number(code)), `the doc shows STATUS ${name}`);
});

test('the session decodes in order', () => {
  const session = [...section().matchAll(/(sends|reads) `([0-9a-f]+)`/g)].map((m) => [m[1], Buffer.from(m[2], 'hex')]);
  assert.deepEqual(session.map((s) => s[0]), ['sends', 'reads', 'sends', 'reads', 'reads']);
  assert.deepEqual(session.map(([, b]) => h.decode(b)[0].type), [h.HELLO, h.STATUS, h.SUB, h.ACK, h.NOTIFY]);
  const d = new h.Decoder();
  d.feed(Buffer.concat(session.filter(([v]) => v === 'reads').map(([, b]) => b)));
  assert.deepEqual([d.next().type, d.next().type, d.next().type, d.next()], [h.STATUS, h.ACK, h.NOTIFY, null]);
  const notify = h.decode(session.at(-1)[1])[0];
  assert.deepEqual([notify.channel.toString(), notify.text.toString()], ['jobs', '42']);
});

const MALFORMED = [
  ['length 0', '0000000083', 'length 0'],
  ['length over 65536', '0001000183', 'length 65537'],
  ['unknown type', '000000017f', 'unknown frame type 0x7f'],
  ['ACK cut short', '00000003810000', 'ends inside a field'],
  ['ACK code 5', '00000006810000000105', 'ACK code 5'],
  ['STATUS code 0', '00000003830000', 'STATUS code 0'],
  ['STATUS channel past the end', '0000000483' + '03' + '05' + '6a', 'ends inside a field'],
  ['NOTIFY channel empty', '0000000782' + '00000001' + '00' + '78', 'channel must be 1-63'],
  ['NOTIFY channel with NUL', '0000000882' + '00000001' + '02' + '6100', 'NUL'],
  ['PONG with trailing bytes', '0000000a84' + '000000000000000101', 'exactly a u64'],
  ['SUB mode 2', '0000000702' + '00000001' + '02' + '61', 'SUB mode 2'],
  ['HELLO version 2', '0000000601' + '02' + '00000001', 'HELLO version 2'],
];

test('malformed frames are protocol errors', () => {
  for (const [name, hx, msg] of MALFORMED) {
    assert.throws(() => h.decode(Buffer.from(hx, 'hex')), (err) => err instanceof h.ProtocolError && err.message.includes(msg), name);
  }
});

test('an incomplete frame is not an error', () => {
  const data = Buffer.from('0000000c8200007a69046a6f62733432', 'hex');
  for (let i = 0; i < data.length; i++) assert.deepEqual(h.decode(data.subarray(0, i)), [null, 0]);
});
