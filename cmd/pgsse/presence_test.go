package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/internal/testkit"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/internal/testkit/servetest"
)

// Presence across real processes (SPEC §3d; issue 21's "Must show"): `pgsse serve --procs 2`
// (A) and a single `pgsse serve` on another address (B), one database.

const presenceInterval = 300 * time.Millisecond

// servePresence starts `pgsse serve` with presence for room/* (internal/testkit/servetest: on
// listen, a free port when ""), waiting until it is ready; it is stopped when the test ends.
func servePresence(t *testing.T, dsn, listen string, procs int, interval time.Duration) *servetest.Server {
	t.Helper()
	return servetest.Start(t, servetest.Options{Bin: binary(t), Procs: procs, Listen: listen,
		Env: []string{"DATABASE_URL=" + dsn, "PGSSE_JWT_SECRET=" + procsSecret},
		Args: []string{"--retention", "0", "--procs", strconv.Itoa(procs),
			"--presence-streams", "room/*", "--presence-interval", interval.String()}})
}

func presenceToken(t *testing.T, sub string) string {
	t.Helper()
	tok, err := auth.Mint(auth.MintKey{Secret: []byte(procsSecret)}, auth.Claims{Streams: []string{"*"}, Subject: sub}, time.Hour, "", "", time.Now())
	require.NoError(t, err)
	return tok
}

// presenceConn is one SSE connection; with presence=1 its pgsse:presence events arrive on events.
type presenceConn struct {
	cancel context.CancelFunc
	events chan presenceData
}

type presenceData struct {
	at        time.Time
	Present   *[]string `json:"present"`
	Join      []string  `json:"join"`
	Leave     []string  `json:"leave"`
	Anonymous int64     `json:"anonymous"`
}

func openPresence(t *testing.T, addr, stream, sub string, watch bool) *presenceConn {
	t.Helper()
	u := "http://" + addr + "/streams/" + stream
	if watch {
		u += "?presence=1"
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", u, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+presenceToken(t, sub))
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
	pc := &presenceConn{cancel: cancel, events: make(chan presenceData, 64)}
	t.Cleanup(pc.close)
	go func() {
		defer resp.Body.Close()
		r := bufio.NewReader(resp.Body)
		event := ""
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimSuffix(line, "\n")
			switch {
			case strings.HasPrefix(line, "event: "):
				event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: ") && event == "pgsse:presence":
				var d presenceData
				if json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &d) == nil {
					d.at = time.Now()
					pc.events <- d
				}
			case line == "":
				event = ""
			}
		}
	}()
	return pc
}

func (pc *presenceConn) close() { pc.cancel() }

// next is the next presence event within d.
func (pc *presenceConn) next(t *testing.T, d time.Duration) presenceData {
	t.Helper()
	select {
	case ev := <-pc.events:
		return ev
	case <-time.After(d):
		t.Fatalf("no presence event within %v", d)
	}
	return presenceData{}
}

// sqlPresence is pgsse.presence(stream)'s subjects, in order, as "sub:connections,…".
func sqlPresence(t *testing.T, dsn, stream string) string {
	t.Helper()
	return pgtest.QueryValue(t, dsn, "SELECT coalesce(string_agg(sub || ':' || connections, ',' ORDER BY sub COLLATE \"C\"), '') FROM pgsse.presence('"+stream+"')")
}

// listed is GET /presence/{stream}'s subjects on p, as "sub:connections,…".
func listed(t *testing.T, p *servetest.Server, stream string) string {
	t.Helper()
	req, err := http.NewRequest("GET", p.URL("/presence/"+stream), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+presenceToken(t, "reader"))
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	var body struct {
		Subjects []struct {
			Sub         string `json:"sub"`
			Connections int    `json:"connections"`
		} `json:"subjects"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	var parts []string
	for _, s := range body.Subjects {
		parts = append(parts, s.Sub+":"+strconv.Itoa(s.Connections))
	}
	return strings.Join(parts, ",")
}

// TestPresenceAcrossProcesses: a subject connected to A (--procs 2), then B, then leaving A is
// present throughout, with one join and no leave on A's watcher; B's subjects leave within 3
// intervals of a SIGKILL of B, on A's events and in pgsse.presence; B restarted on its address
// brings none of them back.
func TestPresenceAcrossProcesses(t *testing.T) {
	dsn := migrated(t)
	a := servePresence(t, dsn, "", 2, presenceInterval)
	b := servePresence(t, dsn, "", 1, presenceInterval)
	bAddr := b.Listen

	w := openPresence(t, a.Listen, "room/1", "user:w", true)
	first := w.next(t, 5*time.Second)
	require.NotNil(t, first.Present)
	require.Equal(t, []string{"user:w"}, *first.Present)

	var joins, leaves []string
	collect := func(d time.Duration) {
		deadline := time.After(d)
		for {
			select {
			case ev := <-w.events:
				joins, leaves = append(joins, ev.Join...), append(leaves, ev.Leave...)
			case <-deadline:
				return
			}
		}
	}
	sOnA := openPresence(t, a.Listen, "room/1", "user:s", false)
	testkit.WaitFor(t, 10*time.Second, "user:s on A", func() bool { return listed(t, a, "room/1") == "user:s:1,user:w:1" })
	sOnB := openPresence(t, b.Listen, "room/1", "user:s", false)
	testkit.WaitFor(t, 10*time.Second, "user:s on A and B", func() bool { return sqlPresence(t, dsn, "room/1") == "user:s:2,user:w:1" })
	sOnA.close()
	testkit.WaitFor(t, 10*time.Second, "user:s on B only", func() bool { return sqlPresence(t, dsn, "room/1") == "user:s:1,user:w:1" })
	assert.Equal(t, "user:s:1,user:w:1", listed(t, a, "room/1"), "present throughout")
	collect(3 * presenceInterval)
	assert.Equal(t, []string{"user:s"}, joins, "one join")
	assert.Empty(t, leaves, "no leave while B holds it")

	// More of B's subjects, then SIGKILL B.
	for _, sub := range []string{"user:b1", "user:b2"} {
		openPresence(t, b.Listen, "room/1", sub, false)
	}
	testkit.WaitFor(t, 10*time.Second, "B's subjects", func() bool {
		return sqlPresence(t, dsn, "room/1") == "user:b1:1,user:b2:1,user:s:1,user:w:1"
	})
	collect(2 * presenceInterval)
	require.ElementsMatch(t, []string{"user:s", "user:b1", "user:b2"}, joins)
	_ = sOnB
	killed := time.Now()
	b.Kill()
	var left []string
	var lastLeave time.Time
	for len(left) < 3 {
		ev := w.next(t, 10*time.Second)
		assert.Empty(t, ev.Join)
		left = append(left, ev.Leave...)
		lastLeave = ev.at
	}
	assert.ElementsMatch(t, []string{"user:s", "user:b1", "user:b2"}, left)
	took := lastLeave.Sub(killed)
	t.Logf("B's subjects left on A's events %v after the SIGKILL (interval %v)", took, presenceInterval)
	// 3 intervals, and one tick of the loop for the event to go out, on a loaded machine.
	assert.Less(t, took, 3*presenceInterval+500*time.Millisecond, "leaves within 3 intervals")
	assert.Equal(t, "user:w:1", sqlPresence(t, dsn, "room/1"))
	assert.Positive(t, a.Metric("pgsse_presence_lease_expiries_total"), "A counted the lapsed lease")
	assert.Positive(t, a.Metric("pgsse_presence_writes_total"))

	// B again on its address: nothing of its old entries comes back.
	b.Stop()
	b.Start()
	b2 := b
	testkit.WaitFor(t, 10*time.Second, "B registered again", func() bool {
		return pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pgsse.presence_processes WHERE process LIKE '% "+bAddr+" #0'") == "1"
	})
	select {
	case ev := <-w.events:
		t.Fatalf("a presence event after B's restart: %+v", ev)
	case <-time.After(3 * presenceInterval):
	}
	assert.Equal(t, "user:w:1", sqlPresence(t, dsn, "room/1"))
	assert.Equal(t, "user:w:1", listed(t, b2, "room/1"))
	out := pgsse(t, []string{"DATABASE_URL=" + dsn}, "doctor")
	assert.Contains(t, out.stdout, bAddr+" #0", "doctor lists the processes holding presence leases:\n%s", out.stdout)
}

// TestPresenceRestartClearsWhatItHeld: a process whose lease is long (a 5 s interval: 10 s)
// killed and started again at once on its address removes what its predecessor held at its
// first write — the subjects leave then, not when the lease would have lapsed.
func TestPresenceRestartClearsWhatItHeld(t *testing.T) {
	dsn := migrated(t)
	a := servePresence(t, dsn, "", 1, presenceInterval)
	b := servePresence(t, dsn, "", 1, 5*time.Second)
	w := openPresence(t, a.Listen, "room/2", "user:w", true)
	require.NotNil(t, w.next(t, 5*time.Second).Present)
	openPresence(t, b.Listen, "room/2", "user:old", false)
	ev := w.next(t, 15*time.Second) // B writes every 5 s
	require.Equal(t, []string{"user:old"}, ev.Join)
	b.Kill()
	killed := time.Now()
	b.Stop()
	b.Start() // the same address: the same presence key
	ev = w.next(t, 15*time.Second)
	assert.Equal(t, []string{"user:old"}, ev.Leave)
	assert.Less(t, ev.at.Sub(killed), 8*time.Second, "cleared by the restart's first write, before the 10 s lease lapsed")
	assert.Equal(t, "user:w:1", sqlPresence(t, dsn, "room/2"))
}
