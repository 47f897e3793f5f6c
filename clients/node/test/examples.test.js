// The README's examples, as files: the worker (examples/worker.js) with its npm-pg session
// receives through the hub, and from its own session once pgsse stops — with no stack trace.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';
import { DSN, notify, ROOT, Server, skipLive } from './support.js';

const HERE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const read = (...p) => fs.readFileSync(path.join(...p), 'utf8');

test('the README and docs/hub-protocol.md show the example files', () => {
  const readme = read(HERE, 'README.md');
  for (const name of ['worker.js', 'pg-session.js']) {
    assert.ok(readme.includes('```js\n' + read(HERE, 'examples', name) + '```'), `clients/node/README.md shows examples/${name}`);
  }
  assert.ok(read(ROOT, 'docs', 'hub-protocol.md').includes('```js\n' + read(HERE, 'examples', 'worker.js') + '```'));
});

/** A process's output, with a wait for a line matching a pattern. */
function lines(stream) {
  let text = '';
  const waiters = new Set();
  stream.setEncoding('utf8');
  stream.on('data', (d) => { text += d; for (const w of waiters) w(); });
  return {
    text: () => text,
    async wait(re, { timeout = 30000, poke } = {}) {
      const deadline = Date.now() + timeout;
      while (!text.split('\n').some((l) => re.test(l))) {
        if (Date.now() > deadline) throw new Error(`no line matching ${re} within ${timeout} ms; got ${text}`);
        if (poke) await poke();
        await new Promise((resolve) => {
          const t = setTimeout(done, 200);
          function done() { clearTimeout(t); waiters.delete(done); resolve(); }
          waiters.add(done);
        });
      }
    },
  };
}

test('the worker fails over without a stack trace', { skip: skipLive }, async () => {
  const server = await Server.start();
  const p = spawn(process.execPath, [path.join(HERE, 'examples', 'worker.js')], {
    env: { ...process.env, PGSSE_HUB_SOCKET: server.socket, DATABASE_URL: DSN },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const exited = new Promise((resolve) => p.on('exit', resolve));
  try {
    const out = lines(p.stdout), err = lines(p.stderr);
    // Until it has subscribed nothing reaches it: notify until one arrives.
    await out.wait(/^job jobs hub$/, { poke: () => notify('jobs', 'hub') });
    await server.stop();
    await out.wait(/^re-read every job$/);
    await notify('jobs', 'own session');
    await out.wait(/^job jobs own session$/);
    assert.equal(p.exitCode, null, 'the worker keeps running on its own session');
    assert.doesNotMatch(err.text(), /\n\s+at /, 'no stack trace');
    assert.match(err.text(), /shutdown: pgsse is shutting down.*switching to the application's own LISTEN session/);
  } finally {
    p.kill('SIGKILL');
    await exited;
    await server.close();
  }
});
