package engine

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strconv"

	"github.com/pgsse/pgsse/clients/js"
	"github.com/pgsse/pgsse/sse"
)

// demoPage is served at / with --demo: a page that opens an EventSource on a stream — or on
// several over one connection (GET /streams?stream=…, docs/http.md: Several streams on one
// connection) — and shows what a browser sees: durable events with their ids (with several
// streams, the stream each composite id names), named events, ephemeral ones, pgsse:gap, and
// the connection's state changes and reconnects (with the Last-Event-ID the browser resumes
// from).
//
// Query parameters fill its form: stream (comma-separated for several), token, since (the
// cursor of the first connection; empty = live only; with several streams a composite one),
// events (comma-separated event names to listen for: EventSource fires only `message` for
// events without a name, and a listener per name otherwise, so names the page is not told
// about cannot be shown).
const demoPage = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>pgsse demo</title>
<meta name="viewport" content="width=device-width,initial-scale=1">
<style>
:root{--fg:#1d2430;--muted:#6b7485;--line:#e3e7ee;--bg:#f6f8fb;--accent:#2563eb}
*{box-sizing:border-box}
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:var(--fg);background:var(--bg);margin:0}
main{max-width:68rem;margin:0 auto;padding:1.5rem}
h1{font-size:1.35rem;margin:0 0 1rem}h1 small{color:var(--muted);font-weight:normal;font-size:.9rem;margin-left:.5rem}
.card{background:#fff;border:1px solid var(--line);border-radius:10px;padding:1rem 1.2rem;margin-bottom:1rem}
form{display:grid;grid-template-columns:repeat(4,minmax(0,1fr)) auto;gap:.6rem 1rem;align-items:end}
label{display:flex;flex-direction:column;font-size:.78rem;color:var(--muted);gap:.2rem}
input{font:inherit;font-size:.9rem;padding:.35rem .5rem;border:1px solid #cfd6e0;border-radius:6px;min-width:0}
button{font:inherit;padding:.4rem 1rem;border:0;border-radius:6px;background:var(--accent);color:#fff;cursor:pointer}
.status{display:flex;flex-wrap:wrap;gap:.5rem 1.5rem;align-items:center;font-size:.9rem}
.pill{display:inline-block;padding:.1rem .65rem;border-radius:999px;font-weight:600;font-size:.82rem;background:#e5e7eb}
.pill.open{background:#dcfce7;color:#166534}.pill.connecting,.pill.reconnecting{background:#fef3c7;color:#92400e}.pill.closed{background:#fee2e2;color:#991b1b}
.k{color:var(--muted)}code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.85rem}
table{width:100%;border-collapse:collapse}th{text-align:left;font-size:.75rem;color:var(--muted);font-weight:600;border-bottom:1px solid var(--line);padding:.3rem .5rem}
td{padding:.35rem .5rem;border-bottom:1px solid var(--line);vertical-align:top}td:first-child{color:var(--muted);font-size:.8rem;white-space:nowrap;padding-top:.45rem}td.data{white-space:pre-wrap;word-break:break-word}
tr.ephemeral td{color:#475569;font-style:italic}tr.gap td{background:#fff7ed}tr.conn td{background:#f1f5f9;color:#334155;font-size:.85rem}
.tag{display:inline-block;padding:0 .45rem;border-radius:4px;font-size:.78rem;background:#eef2ff;color:#3730a3}
.tag.gap{background:#ffedd5;color:#9a3412}.tag.eph{background:#f1f5f9;color:#475569}.tag.conn{background:#e2e8f0;color:#334155}
.hint{color:var(--muted);font-size:.82rem;margin:.6rem 0 0}
</style></head><body><main>
<h1>pgsse demo <small>what an EventSource in this browser receives</small></h1>
<div class="card">
<form id="f">
<label>stream (several: comma-separated) <input id="stream" value="demo"></label>
<label>token <input id="token" placeholder="needed unless the stream is public"></label>
<label>since (cursor) <input id="since" placeholder="empty = live only, 0 = all kept" inputmode="numeric"></label>
<label>named events to show <input id="events" placeholder="e.g. status,created"></label>
<button>connect</button>
</form>
<p class="hint">Several streams (<code>demo,demo/2</code>) share one connection: each event's id is then <code>&lt;k&gt;:&lt;c0&gt;,&lt;c1&gt;,…</code>, the position of its stream and where every stream stands, and a cursor takes the same form (<code>,0</code>: the first stream live, everything kept of the second). Events published with <code>event =&gt; 'name'</code> appear only if their name is listed: EventSource fires <code>message</code> for unnamed events and one listener per name. Try <code>pgsse publish demo 'hello'</code>, <code>SELECT pgsse.publish('demo', 'out for delivery', event =&gt; 'status')</code>, or <code>pgsse publish demo 'typing' --ephemeral</code>.</p>
</div>
<div class="card status">
<span><span class="k">connection</span> <span id="state" class="pill">idle</span></span>
<span><span class="k">last event id</span> <b id="last" class="mono">-</b></span>
<span><span class="k">reconnects</span> <b id="reconnects">0</b></span>
<span><span class="k">events</span> <b id="count">0</b></span>
<span class="k mono" id="url"></span>
</div>
<div class="card"><table><thead><tr><th style="width:6.5rem">time</th><th style="width:4rem">id</th><th style="width:8rem" id="stream-col" hidden>stream</th><th style="width:9rem">event</th><th>data</th></tr></thead>
<tbody id="events-list"></tbody></table></div>
</main>
<script>
const $ = (id) => document.getElementById(id);
const q = new URLSearchParams(location.search);
for (const k of ['stream', 'token', 'since', 'events']) if (q.has(k)) $(k).value = q.get(k);
if (!q.has('events')) $('events').value = 'status';
let es = null, lastId = '', wasOpen = false, down = false, reconnects = 0, count = 0, streams = [];

function row(cls, id, tag, tagCls, data, stream) {
  const tr = document.createElement('tr');
  tr.className = cls;
  const cells = [new Date().toLocaleTimeString(), id, '', data];
  cells.forEach((text, i) => {
    const td = document.createElement('td');
    if (i === 2) {
      const s = document.createElement('span');
      s.className = 'tag ' + tagCls;
      s.textContent = tag;
      td.append(s);
    } else td.textContent = text;
    if (i === 3) td.className = 'data';
    if (i === 1) td.className = 'mono';
    tr.append(td);
    if (i === 1 && streams.length > 1) {
      const st = document.createElement('td');
      st.className = 'mono';
      st.textContent = stream || '';
      tr.append(st);
    }
  });
  $('events-list').prepend(tr);
}
function setState(s) { $('state').textContent = s; $('state').className = 'pill ' + s.split(' ')[0]; }
// An event without an id: line (ephemeral, or a channel notification) leaves lastEventId as
// it was, so an unchanged lastEventId means "no id".
// With several streams the id is composite, "<k>:<c0>,<c1>,…": the event is stream k's,
// its number ck.
function onEvent(e) {
  const durable = e.lastEventId !== '' && e.lastEventId !== lastId;
  if (durable) { lastId = e.lastEventId; $('last').textContent = lastId; }
  $('count').textContent = ++count;
  if (!durable) { row('ephemeral', '', e.type + ' (no id)', 'eph', e.data); return; }
  if (streams.length < 2) { row('ev', e.lastEventId, e.type, '', e.data); return; }
  const [k, cursors] = e.lastEventId.split(':');
  row('ev', (cursors || '').split(',')[k] || e.lastEventId, e.type, '', e.data, streams[k]);
}
function onGap(e) {
  let g = {};
  try { g = JSON.parse(e.data); } catch (_) {}
  row('gap', '', 'pgsse:gap', 'gap', 'events after ' + g.after + ' up to ' + g.resume + ' are gone (pruned): reload your state; delivery continues after ' + g.resume, g.stream);
}
function connect() {
  if (es) es.close();
  lastId = ''; wasOpen = false; down = false; reconnects = 0;
  $('last').textContent = '-'; $('reconnects').textContent = '0';
  const stream = $('stream').value.trim();
  streams = stream.split(',').map((s) => s.trim()).filter(Boolean);
  $('stream-col').hidden = streams.length < 2;
  const params = new URLSearchParams();
  if (streams.length > 1) for (const s of streams) params.append('stream', s);
  if ($('since').value.trim() !== '') params.set('since', $('since').value.trim());
  if ($('token').value.trim() !== '') params.set('token', $('token').value.trim());
  const url = streams.length > 1 ? '/streams?' + params
    : '/streams/' + encodeURIComponent(stream).replace(/%2F/g, '/') + (params.toString() ? '?' + params : '');
  $('url').textContent = 'GET ' + url.replace(/token=[^&]*/, 'token=…');
  const page = new URLSearchParams({stream: stream, since: $('since').value.trim(), events: $('events').value.trim()});
  if ($('token').value.trim() !== '') page.set('token', $('token').value.trim());
  history.replaceState(null, '', '?' + page);
  es = new EventSource(url);
  setState('connecting');
  es.onopen = () => {
    if (wasOpen) {
      $('reconnects').textContent = ++reconnects;
      row('conn', '', 'reconnected', 'conn', 'the browser resumed with Last-Event-ID: ' + (lastId || '(none)'));
    } else row('conn', '', 'open', 'conn', 'subscribed to ' + streams.join(', ') + (streams.length > 1 ? ' on one connection' : '') + ({'': ', live only', '0': ', everything kept first'}[$('since').value.trim()] ?? ' after id ' + $('since').value.trim()));
    wasOpen = true; down = false;
    setState('open');
  };
  es.onerror = () => {
    if (es.readyState === EventSource.CLOSED) {
      setState('closed');
      row('conn', '', 'closed', 'conn', wasOpen ? 'the connection ended for good' : 'refused (bad token, stream not granted, or bad cursor): EventSource does not retry');
    } else {
      setState('reconnecting');
      if (wasOpen && !down) row('conn', '', 'lost', 'conn', 'connection lost; the browser retries after the server\'s retry: delay');
      down = true;
    }
  };
  es.onmessage = onEvent;
  es.addEventListener('pgsse:gap', onGap);
  for (const name of $('events').value.split(',').map((s) => s.trim()).filter(Boolean)) {
    if (name !== 'message' && name !== 'pgsse:gap') es.addEventListener(name, onEvent);
  }
}
$('f').onsubmit = (ev) => { ev.preventDefault(); connect(); };
if (q.has('stream')) connect();
</script></body></html>
`

var demoResponse = []byte("HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: " +
	strconv.Itoa(len(demoPage)) + "\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n" + demoPage)

// The browser client (clients/js/pgsse.js) at GET /pgsse.js, on every server (docs/http.md, The
// browser client): public code, so any origin may load it as a module script
// (Access-Control-Allow-Origin: *), cached for 5 minutes and then revalidated by its ETag.
var (
	clientScriptETag = func() string {
		sum := sha256.Sum256([]byte(js.Script))
		return `"` + hex.EncodeToString(sum[:8]) + `"`
	}()
	clientScriptHeaders = "Cache-Control: public, max-age=300\r\nETag: " + clientScriptETag +
		"\r\nAccess-Control-Allow-Origin: *\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n"
	clientScriptHead = []byte("HTTP/1.1 200 OK\r\nContent-Type: text/javascript; charset=utf-8\r\nContent-Length: " +
		strconv.Itoa(len(js.Script)) + "\r\n" + clientScriptHeaders + "\r\n")
	clientScriptResponse    = append(append([]byte(nil), clientScriptHead...), js.Script...)
	clientScriptNotModified = []byte("HTTP/1.1 304 Not Modified\r\n" + clientScriptHeaders + "\r\n")
)

// clientScriptAnswer is the answer to a GET or HEAD of /pgsse.js: 304 when If-None-Match
// names the current ETag (or is *), the head alone for HEAD.
func clientScriptAnswer(req *sse.Request) []byte {
	if inm := req.IfNoneMatch; len(inm) > 0 && (string(inm) == "*" || bytes.Contains(inm, []byte(clientScriptETag))) {
		return clientScriptNotModified
	}
	if req.Method == sse.MethodHEAD {
		return clientScriptHead
	}
	return clientScriptResponse
}
