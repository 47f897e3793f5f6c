package main

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/engine"
)

func TestParseSize(t *testing.T) {
	cases := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"1048576", 1 << 20, true},
		{"64KiB", 64 << 10, true},
		{"1MiB", 1 << 20, true},
		{"1mib", 1 << 20, true},
		{"2GiB", 2 << 30, true},
		{"512B", 512, true},
		{"0", 0, true},
		{"", 0, false},
		{"MiB", 0, false},
		{"1MB", 0, false},
		{"1.5MiB", 0, false},
		{"-1", 0, false},
		{" 1", 0, false},
		{"1 MiB", 0, false},
		{"9999999999999GiB", 0, false},
	}
	for _, tc := range cases {
		got, err := parseSize(tc.in)
		if tc.ok {
			assert.NoError(t, err, tc.in)
			assert.Equal(t, tc.want, got, tc.in)
		} else {
			assert.Error(t, err, tc.in)
		}
	}
	assert.Equal(t, "1MiB", formatSize(1<<20))
	assert.Equal(t, "8192", formatSize(8192), "as docs/operations.md writes --max-header-bytes' default")
	assert.Equal(t, "65540", formatSize(65540))
}

func TestModeValue(t *testing.T) {
	for in, want := range map[string]os.FileMode{"0600": 0o600, "600": 0o600, "0o660": 0o660, "0": 0, "0777": 0o777} {
		var m modeValue
		require.NoError(t, m.Set(in), in)
		assert.Equal(t, want, os.FileMode(m), in)
	}
	for _, in := range []string{"", "0o", "8", "0x1ff", "01000", "rw", "-600"} {
		var m modeValue
		assert.Error(t, m.Set(in), in)
	}
	m := modeValue(0o600)
	assert.Equal(t, "0600", m.String())
}

func TestEnvName(t *testing.T) {
	assert.Equal(t, "PGSSE_MAX_CONNECTIONS", envName("max-connections"))
	assert.Equal(t, "PGSSE_JWT_PUBLIC_KEY_FILE", envName("jwt-public-key-file"))
}

// cli.attribute names the variable behind each flag the environment set, once, as a whole
// word; flags from the command line and longer flags sharing a prefix are left alone.
func TestAttribute(t *testing.T) {
	c := newCLI("serve", "", envMap(map[string]string{"PGSSE_JWT_SECRET": "s", "PGSSE_HUB_SOCKET": "/h.sock"}))
	c.String("jwt-secret", "", "")
	c.String("jwt-secret-file", "", "")
	c.String("hub-socket", "", "")
	c.String("hub-socket-mode", "", "")
	c.String("listen", "", "")
	_, err := c.parse([]string{"--listen", ":1"})
	require.NoError(t, err)
	for in, want := range map[string]string{
		"--hub-socket /h.sock: another process is serving it":   "--hub-socket (from PGSSE_HUB_SOCKET) /h.sock: another process is serving it",
		"--listen :1: bind: address already in use":             "--listen :1: bind: address already in use",
		"--jwt-secret-file and --jwt-secret are exclusive":      "--jwt-secret-file and --jwt-secret (from PGSSE_JWT_SECRET) are exclusive",
		"--hub-socket-mode 0600 is looser":                      "--hub-socket-mode 0600 is looser",
		"(--hub-socket) --hub-socket":                           "(--hub-socket (from PGSSE_HUB_SOCKET)) --hub-socket",
		"--hub-socket (from PGSSE_HUB_SOCKET) /h.sock: already": "--hub-socket (from PGSSE_HUB_SOCKET) /h.sock: already",
	} {
		assert.Equal(t, want, c.attribute(in), in)
	}
	assert.Equal(t, "--hub-socket (from PGSSE_HUB_SOCKET)", c.source("hub-socket"))
	assert.Equal(t, "--listen", c.source("listen"))
}

func TestCheckOrigin(t *testing.T) {
	for _, ok := range []string{"https://app.example.com", "http://localhost:3000", "https://[::1]:8443"} {
		assert.NoError(t, checkOrigin(ok), ok)
	}
	for _, bad := range []string{"*", "null", "app.example.com", "https://app.example.com/", "https://a/b", "ftp://a", "https://u@a", "https://a?x", "https://A.example"} {
		assert.Error(t, checkOrigin(bad), bad)
	}
}

func envMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// TestParseServeConfig checks that flags and variables land in engine.Config.
func TestParseServeConfig(t *testing.T) {
	secretFile := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(secretFile, []byte("file-secret-0123456789abcdef0123\r\n"), 0o600))
	env := envMap(map[string]string{
		"PGSSE_JWT_SECRET":                 "env-secret-is-masked-by-the-file-flag",
		"PGSSE_HEARTBEAT":                  "30s",
		"PGSSE_CORS_ORIGINS":               "https://a.example, https://b.example",
		"PGSSE_JWT_ALLOW_NO_EXP":           "1",
		"DATABASE_URL":                     "postgres://u@db.example:5433/app",
		"PGSSE_HUB_SOCKET_MODE":            "0660",
		"PGSSE_MAX_STREAMS_PER_CONNECTION": "20",
	})
	var stderr bytes.Buffer
	s, err := parseServe([]string{
		"--listen=127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--hub-socket", "/run/pgsse.sock",
		"--hub-worker-buffer", "256KiB", "--jwt-secret-file", secretFile, "--jwt-issuer", "app",
		"--public-streams", "news/*,status", "--max-connections", "1000", "--max-header-bytes", "16KiB", "--max-outbound-memory", "64MiB",
		"--max-publish-bytes", "4MiB",
		"--retry", "3s", "--retention", "0", "--pprof", "--log-format", "json", "--log-level", "debug", "--demo",
		"--procs", "3", "--presence-streams", "room/*,doc/*", "--presence-interval", "250ms", "--presence-max-list", "50",
	}, env, io.Discard, &stderr)
	require.NoError(t, err)
	c := s.cfg
	assert.Equal(t, "postgres://u@db.example:5433/app", c.DatabaseURL)
	assert.Equal(t, "127.0.0.1:0", c.Listen)
	assert.Equal(t, "/run/pgsse.sock", c.HubSocket)
	assert.Equal(t, os.FileMode(0o660), c.HubSocketMode)
	assert.Equal(t, 256<<10, c.HubWorkerBuffer)
	assert.Equal(t, []byte("file-secret-0123456789abcdef0123"), c.Auth.Secret, "file wins over the variable; trailing CRLF dropped")
	assert.Equal(t, "app", c.Auth.Issuer)
	assert.True(t, c.Auth.AllowNoExp)
	assert.Equal(t, []string{"news/*", "status"}, c.PublicStreams)
	assert.Equal(t, []string{"https://a.example", "https://b.example"}, c.CORSOrigins)
	assert.Equal(t, 1000, c.MaxConnections)
	assert.Equal(t, 16384, c.MaxHeaderBytes)
	assert.Equal(t, 20, c.MaxStreamsPerConnection, "from PGSSE_MAX_STREAMS_PER_CONNECTION")
	assert.Equal(t, int64(4<<20), c.MaxPublishBytes)
	assert.Equal(t, 64<<20, c.MaxOutboundMemory)
	assert.Equal(t, 30*time.Second, c.Heartbeat)
	assert.Equal(t, 3*time.Second, c.Retry)
	assert.Equal(t, time.Duration(0), c.Retention)
	assert.True(t, c.Demo)
	assert.Equal(t, []string{"room/*", "doc/*"}, c.PresenceStreams)
	assert.Equal(t, 250*time.Millisecond, c.PresenceInterval)
	assert.Equal(t, 50, c.PresenceMaxList)
	assert.Equal(t, 3, s.procs)
	assert.False(t, c.ShareListen, "the first process of --procs binds the port as if alone: a port another server holds is refused")
	assert.True(t, s.pprof)
	assert.Same(t, s.registry, c.Registry.(*prometheus.Registry))
	assert.NotNil(t, c.Logger)
	assert.Equal(t, []string{"HS256"}, s.algorithms)
	assert.Empty(t, stderr.String(), "a 32-byte secret is not reported as short")

	// Defaults.
	s, err = parseServe([]string{"--jwt-secret", "short"}, envMap(nil), io.Discard, &stderr)
	require.NoError(t, err)
	c = s.cfg
	assert.Equal(t, ":8080", c.Listen)
	assert.Equal(t, "127.0.0.1:9090", s.adminListen)
	assert.Equal(t, os.FileMode(0o600), c.HubSocketMode)
	assert.Equal(t, 1<<20, c.HubWorkerBuffer)
	assert.Equal(t, 8192, c.MaxHeaderBytes)
	assert.Equal(t, 64, c.MaxStreamsPerConnection)
	assert.Equal(t, time.Second, c.PresenceInterval)
	assert.Equal(t, 1000, c.PresenceMaxList)
	assert.Empty(t, c.PresenceStreams)
	assert.Equal(t, int64(1<<20), c.MaxPublishBytes)
	assert.Equal(t, 256<<20, c.MaxOutboundMemory)
	assert.Equal(t, os.Getenv("GOMEMLIMIT") == "", c.GoMemoryLimit, "the engine sets the Go memory limit unless GOMEMLIMIT is set")
	assert.Equal(t, 15*time.Second, c.Heartbeat)
	assert.Equal(t, 2*time.Second, c.Retry)
	assert.Equal(t, 24*time.Hour, c.Retention)
	assert.Equal(t, engine.MaxConnectionsFor(engine.FDLimit()), c.MaxConnections)
	assert.Equal(t, "", c.DatabaseURL, "libpq environment")
	assert.Equal(t, 1, s.procs)
	assert.False(t, c.ShareListen, "one process binds the port alone: a second server on it fails")
	s, err = parseServe([]string{"--jwt-secret", "short", "--procs", "auto"}, envMap(nil), io.Discard, &stderr)
	require.NoError(t, err)
	assert.Equal(t, engine.ProcsAuto(), s.procs)
	assert.Equal(t, len("short"), s.shortSecret, "warned about once serving (TestServeShortSecret)")
	assert.Empty(t, stderr.String(), "parsing logs nothing: a start that fails says one line")
}

type fakeProbe struct {
	healthy, ready bool
	reason         string
}

func (p *fakeProbe) Healthy() bool          { return p.healthy }
func (p *fakeProbe) Ready() bool            { return p.ready }
func (p *fakeProbe) NotReadyReason() string { return p.reason }

type bareProbe struct{ fakeProbe }

func TestAdminHandler(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "pgsse_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	get := func(h http.Handler, path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		return rec.Code, rec.Body.String()
	}

	p := &fakeProbe{}
	h := adminHandler(p, reg, false, &redactor{})
	code, body := get(h, "/healthz")
	assert.Equal(t, 503, code)
	assert.Equal(t, "event loop not responding\n", body)
	code, body = get(h, "/readyz")
	assert.Equal(t, 503, code)
	assert.Equal(t, "not ready: LISTEN session down or schema not at the expected version\n", body)
	p.reason = "LISTEN session down:\nconnection refused"
	code, body = get(h, "/readyz")
	assert.Equal(t, 503, code)
	assert.Equal(t, "not ready: LISTEN session down: connection refused\n", body, "one line")

	p.healthy, p.ready = true, true
	code, body = get(h, "/healthz")
	assert.Equal(t, 200, code)
	assert.Equal(t, "ok\n", body)
	code, body = get(h, "/readyz")
	assert.Equal(t, 200, code)
	assert.Equal(t, "ok\n", body)

	code, body = get(h, "/metrics")
	assert.Equal(t, 200, code)
	assert.Contains(t, body, "pgsse_test_total 3")
	code, _ = get(h, "/debug/pprof/")
	assert.Equal(t, 404, code, "pprof only with --pprof")

	h = adminHandler(&bareProbe{}, reg, true, &redactor{})
	code, body = get(h, "/readyz")
	assert.Equal(t, 503, code)
	assert.True(t, strings.HasPrefix(body, "not ready: "))
	code, body = get(h, "/debug/pprof/")
	assert.Equal(t, 200, code)
	assert.Contains(t, body, "goroutine")
}

// TestParseServeRegistry: the registry has the Go and process collectors.
func TestParseServeRegistry(t *testing.T) {
	s, err := parseServe([]string{"--public-streams", "*"}, envMap(nil), io.Discard, io.Discard)
	require.NoError(t, err)
	mfs, err := s.registry.Gather()
	require.NoError(t, err)
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	assert.Contains(t, names, "go_goroutines")
	assert.Contains(t, names, "process_open_fds")
	assert.Nil(t, s.algorithms, "public streams only: no key")
}

// TestMergeProcs: the first process's /metrics adds every pgsse_* series of the siblings
// to its own, matched by labels (counters, gauges, histograms), keeps series only a sibling
// has, and shows the SSE connections per process.
func TestMergeProcs(t *testing.T) {
	type proc struct {
		reg   *prometheus.Registry
		conns prometheus.Gauge
		total *prometheus.CounterVec
		lag   prometheus.Histogram
	}
	newProc := func(conns float64, shed, bad float64, lags ...float64) proc {
		p := proc{
			reg:   prometheus.NewRegistry(),
			conns: prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgsse_sse_connections", Help: "h"}),
			total: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgsse_dropped_total", Help: "h"}, []string{"reason"}),
			lag:   prometheus.NewHistogram(prometheus.HistogramOpts{Name: "pgsse_delivery_lag_seconds", Help: "h", Buckets: []float64{.01, .1}}),
		}
		p.reg.MustRegister(p.conns, p.total, p.lag)
		p.conns.Set(conns)
		p.total.WithLabelValues("over_capacity").Add(shed)
		if bad > 0 {
			p.total.WithLabelValues("bad_payload").Add(bad)
		}
		for _, l := range lags {
			p.lag.Observe(l)
		}
		return p
	}
	first := newProc(3, 1, 0, .005)
	first.reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "go_goroutines", Help: "h"}))
	sib1, sib2 := newProc(4, 2, 7, .05, .5), newProc(5, 0, 0)
	gather := func(p proc) []*dto.MetricFamily {
		f, err := p.reg.Gather()
		require.NoError(t, err)
		return f
	}
	own := gather(first)
	merged := mergeProcs(own, map[int][]*dto.MetricFamily{1: gather(sib1), 2: gather(sib2)})
	byName := map[string]*dto.MetricFamily{}
	var names []string
	for _, mf := range merged {
		byName[mf.GetName()] = mf
		names = append(names, mf.GetName())
	}
	assert.IsIncreasing(t, names, "families sorted, none twice")
	assert.Equal(t, 12.0, byName["pgsse_sse_connections"].Metric[0].GetGauge().GetValue())
	dropped := map[string]float64{}
	for _, m := range byName["pgsse_dropped_total"].Metric {
		dropped[m.Label[0].GetValue()] = m.GetCounter().GetValue()
	}
	assert.Equal(t, map[string]float64{"over_capacity": 3, "bad_payload": 7}, dropped)
	h := byName["pgsse_delivery_lag_seconds"].Metric[0].GetHistogram()
	assert.Equal(t, uint64(3), h.GetSampleCount())
	assert.InDelta(t, .555, h.GetSampleSum(), 1e-9)
	assert.Equal(t, uint64(1), h.Bucket[0].GetCumulativeCount(), "≤ 10 ms")
	assert.Equal(t, uint64(2), h.Bucket[1].GetCumulativeCount(), "≤ 100 ms")
	per := map[string]float64{}
	for _, m := range byName["pgsse_process_sse_connections"].Metric {
		per[m.Label[0].GetValue()] = m.GetGauge().GetValue()
	}
	assert.Equal(t, map[string]float64{"0": 3, "1": 4, "2": 5}, per)
	assert.NotNil(t, byName["go_goroutines"], "the first process's own runtime series stay")
}

func TestSiblingListen(t *testing.T) {
	bound := &net.TCPAddr{IP: net.IPv4zero, Port: 41234}
	assert.Equal(t, ":41234", siblingListen(":0", bound), "all addresses, as given")
	assert.Equal(t, "127.0.0.1:41234", siblingListen("127.0.0.1:0", bound))
	assert.Equal(t, "[::1]:41234", siblingListen("[::1]:0", bound))
	assert.Equal(t, "localhost:41234", siblingListen("localhost:8080", bound))
}

// staleRunEnv (issue 26): an error in a shell that sourced bin/run.env says to source it again
// when make run has rewritten it with other values, or removed it; not when it is current.
func TestStaleRunEnv(t *testing.T) {
	dir := t.TempDir()
	current := filepath.Join(dir, "run.env")
	require.NoError(t, os.WriteFile(current, []byte("# make run\nexport PGSSE_RUN_STAMP=abc\nexport TOKEN=x\n"), 0o600))
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"not from make run", map[string]string{}, ""},
		{"current", map[string]string{runEnvVar: current, runStampVar: "abc"}, ""},
		{"rewritten", map[string]string{runEnvVar: current, runStampVar: "old"}, " — make run restarted with other values since this shell sourced " + current + ": source it again"},
		{"gone", map[string]string{runEnvVar: filepath.Join(dir, "gone.env"), runStampVar: "abc"}, " — make run has stopped since this shell sourced " + filepath.Join(dir, "gone.env") + ": start it, then source it again"},
	} {
		assert.Equal(t, tc.want, staleRunEnv(envMap(tc.env), ""), tc.name)
	}
}

// Presence's writer session counts in the descriptor budget (engine.Config.FDBudget): the
// --max-connections the limit leaves without --presence-streams is one too many with it.
func TestServeBudgetCountsPresence(t *testing.T) {
	limit := engine.FDLimit()
	require.NotZero(t, limit, "RLIMIT_NOFILE")
	allowed := engine.Config{}.FDBudget(limit).MaxConnections
	require.Positive(t, allowed)
	args := []string{"--listen=127.0.0.1:0", "--jwt-secret", "0123456789abcdef0123456789abcdef", "--max-connections", strconv.Itoa(allowed)}
	_, err := parseServe(args, envMap(nil), io.Discard, io.Discard)
	require.NoError(t, err)
	_, err = parseServe(append(args, "--presence-streams", "room/*"), envMap(nil), io.Discard, io.Discard)
	require.ErrorContains(t, err, "--max-connections: "+strconv.Itoa(allowed)+" exceeds what the file-descriptor limit allows")
	_, err = parseServe(append(args[:len(args)-1], strconv.Itoa(allowed-1), "--presence-streams", "room/*"), envMap(nil), io.Discard, io.Discard)
	require.NoError(t, err)
}

// A shell that never sourced bin/run.env, while make run is running beside the binary, is told
// to source it — unless it configured pgsse itself, or nothing runs there.
func TestUnsourcedRunEnv(t *testing.T) {
	dir := t.TempDir()
	running := filepath.Join(dir, "run.env")
	require.NoError(t, os.WriteFile(running, []byte("# Written by make run\nexport PGSSE_RUN_ENV="+running+"\nexport PGSSE_RUN_STAMP=abc\n"), 0o600))
	other := filepath.Join(dir, "other.env")
	require.NoError(t, os.WriteFile(other, []byte("export TOKEN=x\n"), 0o600))
	want := " — make run is running in this checkout, but this shell has not taken its variables: source " + running
	for _, tc := range []struct {
		name   string
		env    map[string]string
		beside string
		want   string
	}{
		{"a fresh shell", map[string]string{}, running, want},
		{"DATABASE_URL set by hand", map[string]string{"DATABASE_URL": "postgres://x"}, running, ""},
		{"a secret set by hand", map[string]string{"PGSSE_JWT_SECRET": "s"}, running, ""},
		{"make run not running", map[string]string{}, filepath.Join(dir, "gone.env"), ""},
		{"not make run's file", map[string]string{}, other, ""},
		{"sourced and current", map[string]string{runEnvVar: running, runStampVar: "abc"}, running, ""},
	} {
		assert.Equal(t, tc.want, staleRunEnv(envMap(tc.env), tc.beside), tc.name)
	}
}

// doctor's presence line counts in English: make run's one process is "1 pgsse process holds".
func TestPresenceLeasesLine(t *testing.T) {
	assert.Equal(t, "1 pgsse process holds a presence lease (0 lapsed)", presenceLeases(1, 0))
	assert.Equal(t, "3 pgsse processes hold presence leases (1 lapsed)", presenceLeases(3, 1))
}
