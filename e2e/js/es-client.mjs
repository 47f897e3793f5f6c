// es-client.mjs: the npm `eventsource` package (v4, the newest major that runs on Node 20;
// v5 needs Node >= 22.12) as a subscriber, driven by the e2e Go tests.
//
//   node es-client.mjs '{"url": "...", "headers": {"Authorization": "Bearer …"}, "events": ["name"]}'
//
// Prints one JSON object per line on stdout for everything the EventSource does:
//   {"kind":"open","readyState":1}
//   {"kind":"event","type":"message","data":"…","lastEventId":"3","readyState":1}
//   {"kind":"error","readyState":0|2,"message":"…","code":401}
// Reads commands from stdin, one per line: "close" closes the EventSource and exits.
// Exits by itself when stdin ends (the Go test went away).
//
// API of eventsource v4: `import {EventSource} from 'eventsource'`; request headers are set
// through the `fetch` option (there is no `headers` option since v3); MessageEvent.lastEventId
// is the event's own id or "" (the library keeps the Last-Event-ID for reconnects internally).
import {EventSource} from 'eventsource'
import {createInterface} from 'node:readline'

const opts = JSON.parse(process.argv[2] || '{}')
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n')

const headers = opts.headers || {}
const es = new EventSource(opts.url, {
  fetch: (input, init) => fetch(input, {...init, headers: {...(init.headers || {}), ...headers}}),
})
es.onopen = () => out({kind: 'open', readyState: es.readyState})
es.onerror = (e) => out({kind: 'error', readyState: es.readyState, message: e.message || '', code: e.code ?? null})
const onEvent = (e) =>
  out({kind: 'event', type: e.type, data: e.data, lastEventId: e.lastEventId, readyState: es.readyState})
es.onmessage = onEvent
for (const name of opts.events || []) es.addEventListener(name, onEvent)

const rl = createInterface({input: process.stdin})
rl.on('line', (line) => {
  if (line.trim() === 'close') {
    es.close()
    out({kind: 'closed', readyState: es.readyState})
    process.exit(0)
  }
})
rl.on('close', () => {
  es.close()
  process.exit(0)
})
