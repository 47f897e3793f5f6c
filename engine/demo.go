package engine

import "strconv"

// demoPage is served at / with --demo: a page that opens an EventSource on a stream and
// shows events as they arrive.
const demoPage = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>pgsse demo</title>
<style>
body{font:15px/1.4 system-ui,sans-serif;margin:2rem;max-width:60rem}
input{font:inherit;padding:.2rem .4rem}#events{font-family:ui-monospace,monospace;white-space:pre-wrap}
.ev{border-bottom:1px solid #ddd;padding:.3rem 0}.meta{color:#666}#state{font-weight:bold}
</style></head><body>
<h1>pgsse demo</h1>
<form id="f">stream <input id="stream" value="demo" size="20">
token <input id="token" size="40" placeholder="(needed unless the stream is public)">
<button>connect</button></form>
<p>state: <span id="state">idle</span> · last id: <span id="last">-</span></p>
<p class="meta">Publish from a shell: <code>pgsse publish demo 'hello'</code> or in SQL: <code>SELECT pgsse.publish('demo', 'hello');</code></p>
<div id="events"></div>
<script>
let es, lastId = '';
const $ = (id) => document.getElementById(id);
const q = new URLSearchParams(location.search);
if (q.get('stream')) $('stream').value = q.get('stream');
if (q.get('token')) $('token').value = q.get('token');
// EventSource keeps lastEventId across events that carry no id: line, so an event whose
// lastEventId did not move is ephemeral (pgsse.broadcast) or a channel notification.
function show(kind, e) {
  const durable = e.lastEventId !== '' && e.lastEventId !== lastId;
  if (durable) lastId = e.lastEventId;
  const d = document.createElement('div');
  d.className = 'ev';
  d.textContent = '[' + kind + (durable ? ' #' + e.lastEventId : ' (ephemeral)') + '] ' + e.data;
  $('events').prepend(d);
  if (durable) $('last').textContent = e.lastEventId;
}
function connect() {
  if (es) es.close();
  lastId = '';
  let url = '/streams/' + encodeURIComponent($('stream').value).replace(/%2F/g, '/');
  if ($('token').value) url += '?token=' + encodeURIComponent($('token').value);
  es = new EventSource(url);
  $('state').textContent = 'connecting';
  es.onopen = () => $('state').textContent = 'open';
  es.onerror = () => $('state').textContent = es.readyState === 2 ? 'closed' : 'reconnecting';
  es.onmessage = (e) => show('message', e);
  es.addEventListener('pgsse:gap', (e) => show('gap', e));
  for (const name of (q.get('events') || '').split(',').filter(Boolean)) es.addEventListener(name, (e) => show(name, e));
}
$('f').onsubmit = (ev) => { ev.preventDefault(); connect(); };
if (q.get('stream')) connect();
</script></body></html>
`

var demoResponse = []byte("HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: " +
	strconv.Itoa(len(demoPage)) + "\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n" + demoPage)
