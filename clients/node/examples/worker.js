import { Failover } from 'pgsse-hub';
import { pgSession } from './pg-session.js';

const hub = new Failover(process.env.PGSSE_HUB_SOCKET, { direct: (sink) => pgSession(process.env.DATABASE_URL, sink) });
hub.on('notification', (ev) => console.log('job', ev.channel, ev.payload));
hub.on('resync', (channel) => console.log(channel ? `re-read ${channel}` : 're-read every job'));
await hub.subscribe('jobs'); // resolves once pgsse (or, after a failover, our own session) LISTENs
