package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Presence across a handoff (presence.go: adopted, closed; presencewriter.go: the successor's
// registration waits for TakeOverPresence): every moved connection counts, once, before,
// during and after the move — in PostgreSQL (pgsse.presence, polled throughout), for a
// watcher on another server (no leave, no join) and for a moved watcher (a full event at most,
// naming everyone) — and the successor counts the moved connections as its own: their leaves
// and the newcomers' joins are announced.

// presenceState is pgsse.presence(stream) as "sub:connections,…" plus the anonymous
// connections of the live processes, read on conn.
func presenceState(ctx context.Context, dsn string, streams ...string) (string, error) {
	conn := connectPlain(dsn)
	if conn == nil {
		return "", fmt.Errorf("cannot connect")
	}
	defer conn.Close(context.Background())
	out := ""
	for _, stream := range streams {
		res := conn.ExecParams(ctx, `SELECT coalesce((SELECT string_agg(sub || ':' || connections, ',' ORDER BY sub COLLATE "C") FROM pgsse.presence($1)), '')
			|| ' anon:' || (SELECT coalesce(sum(e.connections), 0) FROM pgsse.presence_entries e
			                JOIN pgsse.presence_processes p ON p.incarnation = e.incarnation
			                WHERE e.stream = $1 AND e.sub = '' AND p.expires_at >= now())`,
			[][]byte{[]byte(stream)}, nil, nil, nil).Read()
		if res.Err != nil {
			return "", res.Err
		}
		out += stream + "=" + string(res.Rows[0][0]) + ";"
	}
	return out, nil
}

// presenceFold applies presence events to a set, as clients do.
type presenceFold struct {
	present map[string]bool
	anon    int64
}

func (f *presenceFold) apply(ev presenceEvent) {
	if ev.Present != nil {
		f.present = map[string]bool{}
		for _, s := range *ev.Present {
			f.present[s] = true
		}
	}
	for _, s := range ev.Join {
		f.present[s] = true
	}
	for _, s := range ev.Leave {
		delete(f.present, s)
	}
	f.anon = ev.Anonymous
}

func (f *presenceFold) String() string {
	var subs []string
	for s := range f.present {
		subs = append(subs, s)
	}
	slices.Sort(subs)
	return fmt.Sprint(subs, " anon:", f.anon)
}

func TestHandoffKeepsPresence(t *testing.T) {
	t.Parallel()
	withPresence := func(c *Config) {
		c.PresenceStreams = []string{"room/*"}
		c.PresenceInterval = testPresenceInterval
	}
	a := startHub(t, withPresence)
	addr := a.Addr().String()
	obs := presenceServer(t, a.DSN, nil) // another process on the database: not moved

	movedWatcher := dial(t, addr, "/streams/room/1?presence=1", bearerH(subToken(t, "user:w")))
	moved := []*sseClient{movedWatcher,
		dial(t, addr, "/streams/room/1", bearerH(subToken(t, "user:a"))),
		dial(t, addr, "/streams/room/1", bearerH(subToken(t, "user:b"))),
		dial(t, addr, "/streams/room/1", bearerH(subToken(t, "user:b"))),
		dial(t, addr, "/streams/room/1", bearerH(allStreams(t))), // no sub: anonymous
		dial(t, addr, "/streams?stream=room/1&stream=room/2", bearerH(subToken(t, "user:m"))),
	}
	for i, c := range moved {
		require.Equal(t, 200, c.Status, "client %d: %s", i, c.Body)
	}
	watcher := dial(t, obs.Addr().String(), "/streams/room/1?presence=1", bearerH(subToken(t, "user:o")))
	require.Equal(t, 200, watcher.Status, watcher.Body)

	const want = "room/1=user:a:1,user:b:2,user:m:1,user:o:1,user:w:1 anon:1;room/2=user:m:1 anon:0;"
	const wantSet = "[user:a user:b user:m user:o user:w] anon:1"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	waitFor(t, 10*time.Second, "everyone present in PostgreSQL", func() bool {
		got, err := presenceState(ctx, a.DSN, "room/1", "room/2")
		return err == nil && got == want
	})
	var seen, seenMoved presenceFold
	for seen.String() != wantSet {
		seen.apply(watcher.nextPresence(10 * time.Second))
	}
	for seenMoved.String() != wantSet {
		seenMoved.apply(movedWatcher.nextPresence(10 * time.Second))
	}

	// From here to well after the predecessor has gone, PostgreSQL says the same.
	stopPoll := make(chan struct{})
	var pollWG sync.WaitGroup
	var mu sync.Mutex
	var wrong []string
	polls := 0
	pollWG.Add(1)
	go func() {
		defer pollWG.Done()
		for {
			select {
			case <-stopPoll:
				return
			case <-time.After(10 * time.Millisecond):
			}
			got, err := presenceState(ctx, a.DSN, "room/1", "room/2")
			mu.Lock()
			polls++
			if err == nil && got != want && len(wrong) < 10 {
				wrong = append(wrong, time.Now().Format("15:04:05.000")+" "+got)
			}
			mu.Unlock()
		}
	}()

	accept := make(chan struct{})
	b := startSuccessor(t, a, addr, accept, withPresence)
	time.Sleep(3 * testPresenceInterval) // the successor is up, waiting: nothing changes yet
	a.StopAcceptingAll()
	close(accept)
	handed, err := a.HandOver(ctx, func(batch []HandedConn) error {
		fds, recs, err := dupHanded(batch)
		if err != nil {
			return err
		}
		return b.Adopt(fds, recs)
	})
	require.NoError(t, err)
	require.Equal(t, len(moved), handed)
	time.Sleep(2 * testPresenceInterval) // the predecessor writes on meanwhile
	require.NoError(t, b.TakeOverPresence(ctx))
	a.Stop(t) // the predecessor exits, as after 'K'
	time.Sleep(5 * testPresenceInterval)
	close(stopPoll)
	pollWG.Wait()
	mu.Lock()
	assert.Empty(t, wrong, "pgsse.presence before, during and after the handoff (%d reads)", polls)
	mu.Unlock()

	// The moved watcher may be told everyone again (a full event: the successor does not know
	// what it was told); no change. The other process's watcher hears nothing.
	for _, ev := range movedWatcher.events(3, 3*testPresenceInterval) {
		pe := parsePresence(t, ev)
		require.NotNil(t, pe.Present, "the moved watcher gets no change: %+v", pe)
		seenMoved.apply(pe)
		assert.Equal(t, wantSet, seenMoved.String())
	}

	// The successor counts the moved connections as its own: a newcomer joins, a moved
	// subject's last connection leaving is a leave, and so is the moved anonymous one.
	late := dial(t, addr, "/streams/room/1", bearerH(subToken(t, "user:c")))
	require.Equal(t, 200, late.Status, late.Body)
	ev := watcher.nextPresence(10 * time.Second)
	assert.Equal(t, []string{"user:c"}, ev.Join, "the first event the other process's watcher gets after the handoff: %+v", ev)
	assert.Empty(t, ev.Leave)
	for seenMoved.String() != "[user:a user:b user:c user:m user:o user:w] anon:1" { // a full event may come late
		ev := movedWatcher.nextPresence(10 * time.Second)
		assert.Empty(t, ev.Leave, "the moved watcher: %+v", ev)
		if ev.Present != nil {
			assert.Subset(t, *ev.Present, []string{"user:a", "user:b", "user:m", "user:o", "user:w"}, "the moved watcher: %+v", ev)
		}
		seenMoved.apply(ev)
	}

	moved[2].conn.Close() // one of user:b's two: no leave
	waitFor(t, 5*time.Second, "user:b's moved connection closed", func() bool {
		got, err := presenceState(ctx, a.DSN, "room/1")
		return err == nil && got == "room/1=user:a:1,user:b:1,user:c:1,user:m:1,user:o:1,user:w:1 anon:1;"
	})
	moved[3].conn.Close()
	moved[4].conn.Close()
	seen.present["user:c"] = true
	for seen.String() != "[user:a user:c user:m user:o user:w] anon:0" {
		ev := watcher.nextPresence(10 * time.Second)
		assert.NotContains(t, ev.Join, "user:b")
		seen.apply(ev)
	}
	got, err := presenceState(ctx, a.DSN, "room/1", "room/2")
	require.NoError(t, err)
	assert.Equal(t, "room/1=user:a:1,user:c:1,user:m:1,user:o:1,user:w:1 anon:0;room/2=user:m:1 anon:0;", got, "counted once, by the successor")
}

// parsePresence is nextPresence's check for an event already read.
func parsePresence(t *testing.T, ev sseEvent) presenceEvent {
	t.Helper()
	require.Equal(t, "pgsse:presence", ev.Event, "event %v", ev)
	var pe presenceEvent
	require.NoError(t, json.Unmarshal([]byte(ev.Data), &pe), ev.Data)
	return pe
}

// A successor that never takes over (it is not ready in time, the predecessor keeps serving)
// writes no presence: its registration would replace the predecessor's entries — every
// subject gone — and leave the predecessor superseded, writing nothing while it serves on.
func TestHandoffSuccessorThatNeverTakesOverLeavesPresenceAlone(t *testing.T) {
	t.Parallel()
	withPresence := func(c *Config) {
		c.PresenceStreams = []string{"room/*"}
		c.PresenceInterval = testPresenceInterval
	}
	a := startHub(t, withPresence)
	addr := a.Addr().String()
	c := dial(t, addr, "/streams/room/1", bearerH(subToken(t, "user:a")))
	require.Equal(t, 200, c.Status, c.Body)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const want = "room/1=user:a:1 anon:0;"
	waitFor(t, 10*time.Second, "user:a present", func() bool {
		got, err := presenceState(ctx, a.DSN, "room/1")
		return err == nil && got == want
	})

	b := startSuccessor(t, a, addr, make(chan struct{}), withPresence)
	time.Sleep(5 * testPresenceInterval) // a registration would be long done
	got, err := presenceState(ctx, a.DSN, "room/1")
	require.NoError(t, err)
	assert.Equal(t, want, got, "the waiting successor replaced nothing")
	b.Stop(t) // it gives up
	d := dial(t, addr, "/streams/room/1", bearerH(subToken(t, "user:d")))
	require.Equal(t, 200, d.Status, d.Body)
	waitFor(t, 10*time.Second, "the predecessor still writes presence", func() bool {
		got, err := presenceState(ctx, a.DSN, "room/1")
		return err == nil && got == "room/1=user:a:1,user:d:1 anon:0;"
	})
}
