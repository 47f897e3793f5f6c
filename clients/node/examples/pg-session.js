import pg from 'pg';

// The application's own LISTEN session for Failover, over node-postgres (npm pg).
export async function pgSession(connectionString, sink) {
  const client = new pg.Client({ connectionString, application_name: 'worker-listen' });
  client.on('notification', (n) => sink.notification(n.channel, n.payload, n.processId));
  client.on('error', (err) => sink.lost(err));
  client.on('end', () => sink.lost(new Error('connection ended')));
  await client.connect();
  const run = (verb, channel) => client.query(`${verb} ${client.escapeIdentifier(channel)}`);
  return { listen: (ch) => run('LISTEN', ch), unlisten: (ch) => run('UNLISTEN', ch), close: () => client.end() };
}
