// index.d.ts compiles and describes the API as the README uses it (test/types-check.ts,
// compiled with the locked TypeScript, never run).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';

const HERE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

test('the TypeScript declarations compile against their use', () => {
  const tsc = path.join(HERE, 'node_modules', 'typescript', 'bin', 'tsc');
  const r = spawnSync(process.execPath, [tsc, '-p', path.join(HERE, 'test', 'tsconfig.json')], { encoding: 'utf8' });
  assert.equal(r.status, 0, `tsc:\n${r.stdout}${r.stderr}`);
});
