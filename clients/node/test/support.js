// Test support: a real `pgsse serve` (PGSSE_BIN) against a real PostgreSQL (PGSSE_TEST_DSN, a
// migrated database), as clients/clients_test.go provides them.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
export const BIN = process.env.PGSSE_BIN;
export const DSN = process.env.PGSSE_TEST_DSN;
/** Live tests need the binary and the database; `make test` (clients/clients_test.go) sets both. */
export const skipLive = BIN && DSN ? false : 'PGSSE_BIN and PGSSE_TEST_DSN are not set (run by clients/clients_test.go)';

export async function sql(query, params = []) {
  const c = new pg.Client({ connectionString: DSN });
  await c.connect();
  try {
    return (await c.query(query, params)).rows;
  } finally {
    await c.end();
  }
}

export const notify = (channel, payload) => sql('SELECT pg_notify($1, $2)', [channel, payload]);

/** pg_terminate_backend of this database's pgsse-listen backend; the number terminated. */
export async function terminateListenSession() {
  const rows = await sql(`SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity
    WHERE application_name = 'pgsse-listen' AND datname = current_database()`);
  return rows[0].n;
}

export async function ownSessions() {
  const rows = await sql(`SELECT count(*)::int AS n FROM pg_stat_activity
    WHERE application_name = 'worker-listen' AND datname = current_database()`);
  return rows[0].n;
}

const tick = (ms) => new Promise((r) => setTimeout(r, ms));

/** Waits until no own session is left: a closed session's backend leaves pg_stat_activity a
 * moment after its client has gone, and the next test counts its own. */
export async function noOwnSessions(timeoutMs = 15000) {
  const deadline = Date.now() + timeoutMs;
  while ((await ownSessions()) !== 0) {
    if (Date.now() > deadline) throw new Error('a worker-listen session is still there after its client closed');
    await tick(50);
  }
}

/** One `pgsse serve` process with a hub socket in a fresh temp dir. */
export class Server {
  static async start(...extra) {
    const s = new Server();
    s.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pgsse-node-'));
    s.socket = path.join(s.dir, 'hub.sock');
    s.logPath = path.join(s.dir, 'serve.log');
    const out = fs.openSync(s.logPath, 'w');
    s.proc = spawn(BIN, ['serve', '--database-url', DSN, '--listen', '127.0.0.1:0', '--admin-listen', '',
      '--hub-socket', s.socket, '--jwt-secret', '0123456789abcdef0123456789abcdef', '--retention', '0',
      '--log-level', 'debug', ...extra], { stdio: ['ignore', out, out] });
    fs.closeSync(out);
    s.exited = new Promise((resolve) => s.proc.on('exit', resolve));
    let dead = false;
    s.exited.then(() => { dead = true; });
    const deadline = Date.now() + 30000;
    for (;;) {
      const ok = await new Promise((resolve) => {
        const c = net.createConnection(s.socket);
        c.on('connect', () => { c.destroy(); resolve(true); }); // the socket answering is the signal
        c.on('error', () => resolve(false));
      });
      if (ok) return s;
      if (dead) throw new Error(`pgsse serve exited:\n${s.log.slice(-4000)}`);
      if (Date.now() > deadline) throw new Error(`the hub socket does not answer after 30 s:\n${s.log.slice(-4000)}`);
      await tick(20);
    }
  }

  async signal(sig) {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    this.proc.kill(sig);
    const t = setTimeout(() => this.proc.kill('SIGKILL'), 20000);
    await this.exited;
    clearTimeout(t);
  }

  /** The server's log so far (read from its file: readable even while the event loop is blocked). */
  get log() { return fs.readFileSync(this.logPath, 'utf8'); }

  kill() { return this.signal('SIGKILL'); }
  /** SIGTERM: pgsse drains (the hub sends SHUTDOWN) and exits. */
  stop() { return this.signal('SIGTERM'); }
  close() { return this.signal('SIGKILL'); }
}

/** Records a client's events; next() waits for the next one with a deadline. */
export class Events {
  constructor(client) {
    this.items = [];
    this.waiters = [];
    const push = (ev) => {
      this.items.push(ev);
      for (const w of this.waiters.splice(0)) w();
    };
    client.on('notification', (ev) => push({ kind: 'notification', ...ev }));
    client.on('down', () => push({ kind: 'down' }));
    client.on('resync', (channel) => push({ kind: 'resync', channel }));
    client.on('failure', (failure) => push({ kind: 'failure', failure }));
  }

  async next(what = 'an event', timeout = 10000) {
    const deadline = Date.now() + timeout;
    while (this.items.length === 0) {
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no ${what} within ${timeout} ms`);
      await new Promise((resolve) => {
        const t = setTimeout(resolve, left);
        this.waiters.push(() => { clearTimeout(t); resolve(); });
      });
    }
    return this.items.shift();
  }

  async nextNotification(timeout = 10000) {
    const seen = [];
    for (;;) {
      const ev = await this.next(`a notification (saw ${JSON.stringify(seen)})`, timeout);
      if (ev.kind === 'notification') return ev;
      seen.push(ev);
    }
  }
}
