package e2e

import (
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/internal/testkit/servetest"
	"github.com/pgsse/pgsse/internal/testkit/ssetest"
)

// TestHosts_NginxInFrontOfThree: several hosts, simulated — three `pgsse serve` on
// 127.0.0.11–13 behind nginx configured as docs/scaling.md says, 300 clients through nginx. One host
// is SIGKILLed while 1,000 durable events are published: its clients reconnect through nginx
// with Last-Event-ID, land on the others, and every client ends with all 1,000 exactly once,
// in order. The census: one LISTEN session per host, nothing more.
func TestHosts_NginxInFrontOfThree(t *testing.T) {
	dsn := newDatabase(t)
	var hosts []*servetest.Server
	var upstreams []string
	for _, ip := range []string{"127.0.0.11", "127.0.0.12", "127.0.0.13"} {
		s := startServer(t, dsn, ip)
		hosts = append(hosts, s)
		upstreams = append(upstreams, s.Listen)
	}
	port := freePort(t)
	conf := substitute(t, docsBlock(t, "docs/scaling.md", "nginx"), "docs/scaling.md's nginx snippet",
		[2]string{"server 10.0.0.11:8080 ", "server " + upstreams[0] + " "},
		[2]string{"server 10.0.0.12:8080 ", "server " + upstreams[1] + " "},
		[2]string{"server 10.0.0.13:8080 ", "server " + upstreams[2] + " "},
		[2]string{"listen 443 ssl http2;", "listen 127.0.0.1:" + strconv.Itoa(port) + ";"},
		[2]string{"ssl_certificate     /etc/ssl/certs/events.example.com.pem;", ""},
		[2]string{"ssl_certificate_key /etc/ssl/private/events.example.com.key;", ""})
	runNginx(t, "hosts.conf.tmpl", map[string]any{"Config": conf}, port)
	listen := func() int {
		n, err := strconv.Atoi(pgtest.QueryValue(t, dsn,
			"SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgsse-listen' AND datname = current_database()"))
		require.NoError(t, err)
		return n
	}
	assert.Equal(t, 3, listen(), "one LISTEN session per host")

	rs := ssetest.StartResuming(t, "http://127.0.0.1:"+strconv.Itoa(port)+"/streams/hosts?since=0", mintToken(t, "hosts"), 300, 60*time.Second)
	for _, h := range hosts {
		assert.Positive(t, h.Metric("pgsse_sse_connections"), "nginx spreads the clients over %s", h.Listen)
	}
	victim := hosts[1]
	ssetest.PublishRange(t, dsn, "hosts", 1, 1000, func(id int) {
		if id == 300 {
			victim.Signal(syscall.SIGKILL)
		}
	})
	ssetest.RequireAll(t, rs, 1000, 2*time.Minute)
	moved := 0
	for _, r := range rs {
		if r.Connects() > 1 {
			moved++
		}
	}
	assert.Positive(t, moved, "the dead host's clients reconnected")
	t.Logf("%d of %d clients reconnected after the kill", moved, len(rs))
	assert.Eventually(t, func() bool { return listen() == 2 }, 15*time.Second, 50*time.Millisecond,
		"the dead host's session goes; the others hold one each")
}
