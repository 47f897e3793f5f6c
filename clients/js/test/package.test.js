// The npm package: exactly the module, its declarations and the README (npm pack), and the
// declarations compile against their use (types-check.ts, with the locked TypeScript).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';

const HERE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

test('npm pack holds the module, its declarations and the README', () => {
  const r = spawnSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { cwd: HERE, encoding: 'utf8' });
  assert.equal(r.status, 0, `npm pack:\n${r.stdout}${r.stderr}`);
  const [pack] = JSON.parse(r.stdout);
  assert.equal(pack.name, 'pgsse-browser');
  assert.deepEqual(pack.files.map((f) => f.path).sort(), ['README.md', 'package.json', 'pgsse.d.ts', 'pgsse.js']);
});

test('the TypeScript declarations compile against their use', () => {
  const tsc = path.join(HERE, 'node_modules', 'typescript', 'bin', 'tsc');
  const r = spawnSync(process.execPath, [tsc, '-p', path.join(HERE, 'test', 'tsconfig.json')], { encoding: 'utf8' });
  assert.equal(r.status, 0, `tsc:\n${r.stdout}${r.stderr}`);
});
