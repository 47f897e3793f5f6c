// chromium.mjs: Debian's Chromium (/usr/bin/chromium), headless, driven through
// playwright-core for the e2e Go tests. Never downloads a browser.
//
//   node chromium.mjs '{"userDataDir": "/tmp/…", "watch": "http://127.0.0.1:8080/",
//                       "extraArgs": ["--ignore-certificate-errors"]}'
//
// Every line on stdout is one JSON object:
//   {"kind":"ready"}                                  the browser is up
//   {"kind":"reply","id":N,"ok":true,"value":…}       answer to command N
//   {"kind":"reply","id":N,"ok":false,"error":"…"}
//   {"kind":"page","page":N, …}                       what a test page reports through
//                                                     window.report(obj) (EventSource callbacks);
//                                                     page is the tab's number (0: the first)
//   {"kind":"request","url":"…","headers":{…}}        requests to URLs starting with `watch`
//   {"kind":"response","url":"…","status":200}
//   {"kind":"requestfinished","url":"…"}              its body ended (an event stream: server closed it)
//   {"kind":"requestfailed","url":"…","error":"…"}    it failed or the page aborted it
//   {"kind":"console","text":"…"}, {"kind":"pageerror","text":"…"}
// Commands on stdin, one JSON object per line, each with an "id":
//   {"cmd":"cookies","cookies":[{name,value,url}]}    context.addCookies
//   {"cmd":"goto","url":"…","page":N}                  open the URL in tab N (default 0)
//   {"cmd":"eval","expr":"…","page":N}                 evaluate in tab N, JSON result
//   {"cmd":"screenshot","path":"…","page":N}           full-page PNG of tab N
//   {"cmd":"newPage"}                                  open another tab of the same browser
//                                                     context (same origin rules, cookies,
//                                                     Web Locks, BroadcastChannel); its number
//   {"cmd":"closePage","page":N}                       close tab N as a user closing it would
//   {"cmd":"quit"}
// Exits when stdin ends.
import {chromium} from 'playwright-core'
import {createInterface} from 'node:readline'

const opts = JSON.parse(process.argv[2] || '{}')
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n')

const context = await chromium.launchPersistentContext(opts.userDataDir, {
  executablePath: opts.executablePath || '/usr/bin/chromium',
  headless: true,
  args: [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    ...(opts.extraArgs || []),
  ],
  viewport: {width: 1000, height: 700},
})
const pages = []
await context.exposeBinding('report', (source, obj) =>
  out({...obj, kind: 'page', what: obj.kind, page: pages.indexOf(source.page)}),
)
const watched = (url) => opts.watch && url.startsWith(opts.watch)
context.on('request', async (req) => {
  if (!watched(req.url())) return
  let headers = req.headers()
  try {
    headers = await req.allHeaders()
  } catch {}
  out({kind: 'request', url: req.url(), method: req.method(), resourceType: req.resourceType(), headers})
})
context.on('response', (res) => {
  if (watched(res.url())) out({kind: 'response', url: res.url(), status: res.status()})
})
context.on('requestfailed', (req) => {
  if (watched(req.url())) out({kind: 'requestfailed', url: req.url(), error: req.failure()?.errorText || ''})
})
// A response that ended (for an event stream: the server closed it), as opposed to
// requestfailed (the page closed it, net::ERR_ABORTED).
context.on('requestfinished', (req) => {
  if (watched(req.url())) out({kind: 'requestfinished', url: req.url()})
})
function track(page) {
  pages.push(page)
  const n = pages.length - 1
  page.on('console', (m) => out({kind: 'console', page: n, text: m.text()}))
  page.on('pageerror', (e) => out({kind: 'pageerror', page: n, text: String(e)}))
  return n
}
track(context.pages()[0] || (await context.newPage()))
const pageOf = (c) => {
  const p = pages[c.page ?? 0]
  if (!p) throw new Error('no open tab ' + (c.page ?? 0))
  return p
}
out({kind: 'ready', version: context.browser()?.version() ?? null})

async function handle(c) {
  switch (c.cmd) {
    case 'cookies':
      await context.addCookies(c.cookies)
      return null
    case 'goto': {
      const page = pageOf(c)
      await page.goto(c.url, {waitUntil: 'load'})
      return page.url()
    }
    case 'eval':
      return await pageOf(c).evaluate(c.expr)
    case 'screenshot':
      await pageOf(c).screenshot({path: c.path, fullPage: true})
      return c.path
    case 'newPage':
      return track(await context.newPage())
    case 'closePage': {
      const page = pageOf(c)
      pages[c.page] = null
      await page.close({runBeforeUnload: false})
      return null
    }
    case 'quit':
      await context.close()
      out({kind: 'reply', id: c.id, ok: true, value: null})
      process.exit(0)
    default:
      throw new Error('unknown command ' + c.cmd)
  }
}

// Commands run one at a time, in order.
let chain = Promise.resolve()
const rl = createInterface({input: process.stdin})
rl.on('line', (line) => {
  if (!line.trim()) return
  const c = JSON.parse(line)
  chain = chain.then(async () => {
    try {
      out({kind: 'reply', id: c.id, ok: true, value: (await handle(c)) ?? null})
    } catch (e) {
      out({kind: 'reply', id: c.id, ok: false, error: String(e && e.message ? e.message : e)})
    }
  })
})
rl.on('close', async () => {
  await chain.catch(() => {})
  await context.close().catch(() => {})
  process.exit(0)
})
