// The composite-id parsing and routing of pgsse.js, without a browser: what an EventSource
// delivers (type, data, lastEventId) becomes events of named streams, each delivered once per
// tab however many connections or tabs it arrives through.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { compareCursors, Cursors, LinkReader, parseEventId } from '../pgsse.js';

test('parseEventId reads plain and composite ids (SPEC §3c)', () => {
  const cases = [
    // [id, count, want]
    ['17', 1, { index: 0, cursors: ['17'] }],
    ['0:17', 1, { index: 0, cursors: ['17'] }],
    ['1:4,9,', 3, { index: 1, cursors: ['4', '9', ''] }],
    ['2:,,1', 3, { index: 2, cursors: ['', '', '1'] }],
    ['0:9223372036854775807,0', 2, { index: 0, cursors: ['9223372036854775807', '0'] }],
    ['17', 2, null], // a plain id on a several-stream connection
    ['3:1,2,3', 3, null], // k out of range
    ['1:4,9', 3, null], // wrong count
    ['1:4,9,1,2', 3, null],
    ['1:4,,1', 3, null], // the event's own entry is empty
    ['-1:4,9', 2, null],
    ['a:4,9', 2, null],
    [':4,9', 2, null],
    ['1:4,x', 2, null],
    ['1:4, 9', 2, null],
    ['1:4,99999999999999999999', 2, null], // over 19 digits
    ['', 1, null],
    ['1.5', 1, null],
  ];
  for (const [id, count, want] of cases) {
    assert.deepEqual(parseEventId(id, count), want, `parseEventId(${JSON.stringify(id)}, ${count})`);
  }
});

test('compareCursors orders decimal strings beyond 2^53', () => {
  assert.ok(compareCursors('9007199254740993', '9007199254740992') > 0);
  assert.ok(compareCursors('10', '9') > 0);
  assert.ok(compareCursors('9', '10') < 0);
  assert.equal(compareCursors('007', '7'), 0);
  assert.equal(compareCursors('0', '0'), 0);
});

test('LinkReader routes each event to its stream from the composite id', () => {
  const r = new LinkReader(['orders/42', 'chat/7', 'news']);
  assert.deepEqual(r.read('message', 'a', '0:5,,'), { kind: 'event', type: 'message', data: 'a', lastEventId: '0:5,,', index: 0, cursors: ['5', '', ''] });
  assert.equal(r.read('status', 'b', '1:5,3,').index, 1);
  assert.equal(r.read('message', 'c', '2:5,3,1').index, 2);
  // An event without an id: line keeps lastEventId (WHATWG): ephemeral, no stream, no cursors.
  assert.deepEqual(r.read('typing', 'd', '2:5,3,1'), { kind: 'event', type: 'typing', data: 'd', lastEventId: '2:5,3,1', index: null, cursors: null });
  assert.equal(r.read('message', 'e', '0:6,3,1').index, 0);
  // pgsse:gap and pgsse:presence name their stream in their data.
  const gap = r.read('pgsse:gap', '{"stream":"chat/7","after":3,"resume":9}', '0:6,3,1');
  assert.equal(gap.kind, 'gap');
  assert.equal(gap.index, 1);
  assert.deepEqual(gap.json, { stream: 'chat/7', after: 3, resume: 9 });
  const pres = r.read('pgsse:presence', '{"stream":"news","present":["user:7"],"anonymous":1}', '0:6,3,1');
  assert.equal(pres.kind, 'presence');
  assert.equal(pres.index, 2);
  assert.equal(r.read('pgsse:gap', '{"stream":"other","after":1,"resume":2}', '').kind, 'bad');
  assert.equal(r.read('pgsse:gap', 'not json', '').kind, 'bad');
  assert.equal(r.read('message', 'x', '17').kind, 'bad', 'a plain id on a several-stream connection');
});

test('LinkReader on one stream: plain ids, ephemeral events belong to the stream', () => {
  const r = new LinkReader(['orders/42']);
  assert.equal(r.read('message', 'e', '').index, 0, 'ephemeral before any durable event');
  assert.equal(r.read('message', 'e', '').cursors, null);
  assert.deepEqual(r.read('message', 'a', '1').cursors, ['1']);
  const eph = r.read('typing', 'x', '1');
  assert.equal(eph.index, 0);
  assert.equal(eph.cursors, null);
  assert.equal(r.read('pgsse:gap', '{"stream":"orders/42","after":1,"resume":4}', '1').index, 0);
});

// deliverAll runs what connections delivered through one tab's cursors and returns what the
// tab's listeners see, as "stream#id".
function deliverAll(streams, cursors, deliveries) {
  const seen = [];
  for (const m of deliveries) {
    if (m.kind === 'event' && m.cursors && cursors.event(m.index, m.cursors)) seen.push(`${streams[m.index]}#${m.cursors[m.index]}`);
  }
  return seen;
}

test('Cursors deliver each durable event once across two overlapping connections', () => {
  const streams = ['a', 'b', 'c'];
  const cursors = new Cursors(3, null);
  const old = new LinkReader(streams);
  const fresh = new LinkReader(streams);
  const got = deliverAll(streams, cursors, [
    old.read('message', '', '0:1,,'),
    old.read('message', '', '1:1,1,'),
    old.read('message', '', '1:1,2,'),
  ]);
  // The replacement opened at the cursors so far: since=1,2, (c has no position yet).
  assert.equal(cursors.since(), '1,2,');
  got.push(
    ...deliverAll(streams, cursors, [
      old.read('message', '', '2:1,2,1'), // still arriving on the old one
      fresh.read('message', '', '2:1,2,1'), // the same event on the new one
      old.read('message', '', '0:2,2,1'),
      fresh.read('message', '', '0:2,2,1'),
      fresh.read('message', '', '1:2,3,1'),
    ]),
  );
  assert.deepEqual(got, ['a#1', 'b#1', 'b#2', 'c#1', 'a#2', 'b#3']);
  assert.equal(cursors.since(), '2,3,1');
});

test('Cursors: a tab that joins late takes the connection\'s positions', () => {
  const cursors = new Cursors(3, null);
  assert.equal(cursors.since(), null, 'no position: live from the head');
  assert.ok(cursors.event(1, ['7', '12', '']));
  assert.equal(cursors.since(), '7,12,', 'a takes the position the connection reports; c has none');
  assert.ok(!cursors.event(0, ['7', '12', '']), 'a#7 is where a stood: not new');
  assert.ok(cursors.event(0, ['8', '12', '']));
});

test('Cursors adopt the holder\'s positions only where this tab has none', () => {
  const cursors = new Cursors(3, [null, '4', null]);
  cursors.adopt(['9', '2', undefined]); // as structured-cloned from the holder's Cursors
  assert.equal(cursors.since(), '9,4,', 'a from the holder, b kept (this tab\'s own), c still none');
  assert.ok(!cursors.event(0, ['9', '4', '1']), 'a#9: the holder had relayed it before this tab joined');
  assert.ok(cursors.event(0, ['10', '4', '1']));
  for (const bad of [null, ['1', '2'], ['x', '1', '1']]) {
    const c = new Cursors(3, null);
    c.adopt(bad);
    assert.equal(c.since(), bad && bad.length === 3 ? ',1,1' : null, JSON.stringify(bad));
  }
});

test('Cursors start where since says and skip what is older', () => {
  const cursors = new Cursors(2, ['5', null]);
  assert.equal(cursors.since(), '5,');
  assert.ok(!cursors.event(0, ['5', '']));
  assert.ok(!cursors.event(0, ['3', '']));
  assert.ok(cursors.event(0, ['6', '']));
  assert.ok(cursors.event(1, ['6', '1']));
});

test('Cursors announce a gap once and move past it', () => {
  const cursors = new Cursors(1, ['2']);
  assert.ok(cursors.gap(0, '2', '7'));
  assert.equal(cursors.get(0), '7');
  assert.ok(!cursors.gap(0, '2', '7'), 'the same gap relayed again');
  assert.ok(!cursors.event(0, ['6']));
  assert.ok(cursors.event(0, ['8']));
  // A cursor newer than the head (a restored database): the gap moves the cursor back.
  const restored = new Cursors(1, ['50']);
  assert.ok(restored.gap(0, '50', '30'));
  assert.equal(restored.get(0), '30');
  assert.ok(restored.event(0, ['31']));
});
