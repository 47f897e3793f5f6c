package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// manyStreamsPage opens ?n= EventSources, one per stream room/0 … room/N-1 of ?src, and reports
// each open and event to the driver.
const manyStreamsPage = `<!doctype html>
<html><head><meta charset="utf-8"><title>e2e many EventSources</title></head><body>
<script>
const q = new URLSearchParams(location.search);
const n = Number(q.get('n'));
window.sources = [];
for (let i = 0; i < n; i++) {
  const es = new EventSource(q.get('src') + '/streams/room/' + i + '?token=' + encodeURIComponent(q.get('token')));
  es.onopen = () => window.report({kind: 'open', data: String(i)});
  es.onmessage = (e) => window.report({kind: 'event', data: String(i) + ' ' + e.data});
  es.onerror = () => window.report({kind: 'error', data: String(i), readyState: es.readyState});
  window.sources.push(es);
}
</script></body></html>
`

// selfSignedCert writes a certificate and key for 127.0.0.1 / localhost into dir.
func selfSignedCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600))
	return certFile, keyFile
}

// docsNginxServer is docs/operations.md's nginx snippet (its only ```nginx block), with this
// test's addresses and certificate put in.
func docsNginxServer(t *testing.T, listen, upstream, cert, key string, http2 bool) string {
	t.Helper()
	snippet := substitute(t, docsBlock(t, "docs/operations.md", "nginx"), "docs/operations.md's nginx snippet",
		[2]string{"listen 443 ssl http2;", "listen " + listen + " ssl http2;"},
		[2]string{"ssl_certificate     /etc/ssl/certs/events.example.com.pem;", "ssl_certificate     " + cert + ";"},
		[2]string{"ssl_certificate_key /etc/ssl/private/events.example.com.key;", "ssl_certificate_key " + key + ";"},
		[2]string{"proxy_pass http://127.0.0.1:8080;", "proxy_pass http://" + upstream + ";"})
	if !http2 {
		snippet = strings.Replace(snippet, " ssl http2;", " ssl;", 1)
	}
	return snippet
}

// startDocsCaddy runs Caddy with docs/operations.md's Caddy snippet (its only ```caddy block)
// for upstream on 127.0.0.1:port. Test-only additions: the site address is
// https://127.0.0.1:port with `tls internal` (a certificate from Caddy's own CA instead of
// one from the web), and global options keep Caddy's admin API, trust store and data out of
// the machine's.
func startDocsCaddy(t *testing.T, port int, upstream string) {
	t.Helper()
	snippet := substitute(t, docsBlock(t, "docs/operations.md", "caddy"), "docs/operations.md's Caddy snippet",
		[2]string{"events.example.com {", "https://127.0.0.1:" + strconv.Itoa(port) + " {\n    tls internal"},
		[2]string{"reverse_proxy 127.0.0.1:8080 {", "reverse_proxy " + upstream + " {"})
	dir := t.TempDir()
	conf := "{\n    admin off\n    skip_install_trust\n    auto_https disable_redirects\n    storage file_system " + filepath.Join(dir, "data") + "\n}\n" + snippet
	path := filepath.Join(dir, "Caddyfile")
	require.NoError(t, os.WriteFile(path, []byte(conf), 0o600))
	caddy, err := exec.LookPath("caddy")
	require.NoError(t, err, "caddy (scripts/e2e-deps.sh installs it)")
	cmd := exec.Command(caddy, "run", "--config", path, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	runProxy(t, cmd, port, func() string { return "Caddyfile:\n" + conf })
}

// substitute replaces each pair's first string, which must be there, in a snippet from the docs.
func substitute(t *testing.T, snippet, what string, pairs ...[2]string) string {
	t.Helper()
	for _, p := range pairs {
		require.Contains(t, snippet, p[0], "%s changed: update this test's substitutions", what)
		snippet = strings.Replace(snippet, p[0], p[1], 1)
	}
	return snippet
}

// Chromium opens 12 EventSources to one origin through nginx configured as
// docs/operations.md says (TLS, HTTP/2), and through its Caddy snippet: all 12 open and
// receive events. The control, nginx's server block without http2, shows why it matters: over
// HTTP/1.1 the browser holds at most 6 connections per origin, and the other 6 EventSources
// never open.
func TestNginx_HTTP2CarriesMoreThanSixEventSourcesPerOrigin(t *testing.T) {
	t.Parallel()
	const n = 12
	dir := t.TempDir()
	cert, key := selfSignedCert(t, dir)
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(manyStreamsPage))
	}))
	t.Cleanup(page.Close)

	dsn := newDatabase(t)
	s := startServer(t, dsn, "127.0.0.1", "--cors-origins", page.URL)
	h2Port, h1Port, caddyPort := freePort(t), freePort(t), freePort(t)
	upstream := "127.0.0.1:" + strconv.Itoa(s.Port())
	servers := docsNginxServer(t, "127.0.0.1:"+strconv.Itoa(h2Port), upstream, cert, key, true) + "\n" +
		docsNginxServer(t, "127.0.0.1:"+strconv.Itoa(h1Port), upstream, cert, key, false)
	runNginx(t, "h2.conf.tmpl", map[string]any{"Servers": servers}, h1Port)
	startDocsCaddy(t, caddyPort, upstream)
	token := mintToken(t, "room/*")

	for _, tc := range []struct {
		name  string
		port  int
		opens int
	}{{"nginx HTTP/2", h2Port, n}, {"Caddy", caddyPort, n}, {"nginx HTTP/1.1 control", h1Port, 6}} {
		t.Run(tc.name, func(t *testing.T) {
			origin := "https://127.0.0.1:" + strconv.Itoa(tc.port)
			b := startNode(t, "chromium.mjs", map[string]any{
				"userDataDir": filepath.Join(t.TempDir(), "profile"),
				"watch":       origin + "/",
				"extraArgs":   []string{"--ignore-certificate-errors"},
			})
			b.waitFor(60*time.Second, "the browser", func(all []obs) bool { return len(filter(all, "ready")) > 0 })
			b.call(map[string]any{"cmd": "goto", "url": page.URL + "/?n=" + strconv.Itoa(n) + "&src=" + url.QueryEscape(origin) + "&token=" + url.QueryEscape(token)})
			b.waitFor(30*time.Second, strconv.Itoa(tc.opens)+" open EventSources", func(all []obs) bool { return len(filter(all, "open")) >= tc.opens })

			for i := 0; i < n; i++ {
				publishSQL(t, dsn, "room/"+strconv.Itoa(i), "to "+strconv.Itoa(i))
			}
			all := b.waitFor(30*time.Second, "an event on each open EventSource", func(all []obs) bool { return len(filter(all, "event")) >= tc.opens })
			opened := map[string]bool{}
			for _, o := range filter(all, "open") {
				opened[o.Data] = true
			}
			for _, o := range filter(all, "event") {
				i, _, _ := strings.Cut(o.Data, " ")
				assert.True(t, opened[i], "event on EventSource %s, which never opened", i)
				assert.Equal(t, i+" to "+i, o.Data)
			}
			if tc.opens == n {
				assert.Len(t, opened, n, "all %d EventSources open over HTTP/2", n)
				assert.Len(t, filter(all, "event"), n)
				assert.Empty(t, filter(all, "error"))
				return
			}
			// HTTP/1.1: the other six wait for a connection that never frees up. Nothing
			// signals "still waiting", so watch for a while that no seventh opens.
			deadline := time.Now().Add(3 * time.Second)
			for time.Now().Before(deadline) {
				all, _ = b.snapshot()
				require.Len(t, filter(all, "open"), 6, "over HTTP/1.1 a browser holds 6 connections per origin")
				time.Sleep(200 * time.Millisecond) // polling: there is no event for "nothing happened"
			}
			assert.Len(t, filter(all, "event"), 6)
		})
	}
}
