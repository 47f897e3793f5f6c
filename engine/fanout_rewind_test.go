package engine

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// A stream this process starts following from a subscriber's cursor knows that cursor's
// id, not the publish time of the event under it — here the newest event, hidden from the
// subscriber by its audience, so its catch-up never read it. The next stream-level read
// (the LISTEN session came back) must not take that event for another one under a reused id
// (fanout.rewind): there was no crash, and the client must not get a pgsse:gap going back
// (found by the chaos run, seed 1: "a gap moves the cursor back from 514 to 513 without a
// crash that lost commits").
func TestStreamJoinedAtAHiddenHeadIsNotTakenForARewind(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	pgtest.Exec(t, ts.DSN, "SELECT pgsse.publish('rw', 'for everyone')")
	pgtest.Exec(t, ts.DSN, "SELECT pgsse.publish('rw', 'for grp:b', NULL, ARRAY['grp:b'])")
	c := dial(t, ts.Addr().String(), "/streams/rw", bearerH(allStreams(t, "grp:a")), "Last-Event-ID: 0")
	require.Equal(t, 200, c.Status)
	ev := c.mustNextData(10 * time.Second)
	require.Equal(t, "1", ev.IDValue)
	waitFor(t, 10*time.Second, "the subscription live at 2", func() bool {
		live := false
		ts.onLoop(t, func() {
			for _, sc := range ts.conns.list {
				if sub := sc.streamSub("rw"); sub != nil && sub.state == subLive && sub.cursor == 2 {
					live = true
				}
			}
		})
		return live
	})

	require.Equal(t, 1, terminateListen(t, ts.DSN))
	waitFor(t, 15*time.Second, "the LISTEN session back", func() bool { return ts.lsn.ok() })
	pgtest.Exec(t, ts.DSN, "SELECT pgsse.publish('rw', 'after the reconnect')")
	ev = c.mustNextData(10 * time.Second)
	require.Equal(t, "", ev.Event, "got %s %s", ev.Event, ev.Data)
	require.Equal(t, "3", ev.IDValue)
	require.Equal(t, "after the reconnect", ev.Data)
}

// A crash without synchronous_commit as the chaos run's pg-crash-async leaves it (issue 24),
// made for real but deterministic: the LISTEN session is lost (its backend terminated, the
// database closed to new connections so it stays down) while the HTTP publisher's and the
// replay pool's connections stay up; the stream's last delivered events are deleted and its
// counter reset, as recovery would leave them; then new events take the lost ids and more
// while the session is down:
//
//   - published over HTTP: the one whose id is the next the stream expected (st.last+1) would
//     be delivered early (fanout.committed) and make the stream's check find nothing — the
//     live subscriber silently skipping the new events under the lost ids;
//   - and subscribers that connect meanwhile — with since=0, and with a cursor from the lost
//     history (what a browser sends) — must not read the new history before the stream is
//     checked: their reads' publish times would hide the rewind from the others, one holding
//     only the table's events must not be sent a gap back over them (they would come twice:
//     docs/http.md, resume is the last id the table and what it was sent agree on), and the
//     lost cursor must be told (chaos, seed 11: a reconnection at lost id 366 read 367–376 of
//     the new history, then "gap after 376 resume 366" and 367… again).
//
// Afterwards every client holds exactly the table's events, a client that had the lost ones
// was told by one gap back to where the histories part, and one that reconnects with a lost
// cursor is told too.
func TestStreamWentBackWhileTheListenSessionWasDown(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		connect bool // subscribers connect during the outage
	}{
		{"HTTP publishes during the outage", false},
		{"and subscribers connect meanwhile", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ts := startServer(t, "", nil)
			addr := ts.Addr().String()
			tok := bearerH(allStreams(t))
			authz := bearerH(publishToken(t, "wd"))
			pub := dialPub(t, addr)
			sql := connect(t, ts.DSN) // opened before the database refuses new connections
			const old, kept, news = 10, 5, 8
			const head = kept + news
			httpPublish := func(data string, id int64) {
				t.Helper()
				require.Equal(t, id, *decodePublished(t, pub.do(post("/streams/wd", data, authz))).ID)
			}
			for i := int64(1); i <= old; i++ {
				httpPublish("old"+strconv.FormatInt(i, 10), i)
			}
			live := startReuseClient(t, addr, "/streams/wd?since=0", tok)
			waitFor(t, 10*time.Second, "the old events delivered", func() bool { return live.lastID() >= old })

			release := holdListenDown(t, ts)
			_, err := sql.Exec(context.Background(), "DELETE FROM pgsse.events WHERE stream = 'wd' AND id > "+strconv.Itoa(kept)+
				"; UPDATE pgsse.streams SET head = "+strconv.Itoa(kept)+" WHERE stream = 'wd'").ReadAll()
			require.NoError(t, err)
			early := earlyCount(t, ts)
			for i := int64(1); i <= news; i++ {
				httpPublish("new"+strconv.FormatInt(i, 10), kept+i)
			}
			var during []*reuseClient
			if tc.connect {
				fresh := startReuseClient(t, addr, "/streams/wd?since=0", tok)
				fresh.from = 0
				lost := startReuseClient(t, addr, "/streams/wd", tok, "Last-Event-ID: "+strconv.Itoa(old-1))
				lost.from = old - 1
				during = []*reuseClient{fresh, lost}
				// Both have read the table, or wait for the stream's check to do so.
				waitFor(t, 10*time.Second, "the new subscribers' catch-up read or held", func() bool {
					held := 0
					ts.onLoop(t, func() { held = len(ts.fan.streams["wd"].heldReads) })
					return held == 2 || (fresh.lastID() >= head && lost.lastID() >= head)
				})
			}
			t.Logf("early deliveries while the session was down: %v", earlyCount(t, ts)-early)
			require.False(t, ts.lsn.ok(), "the LISTEN session was down throughout")
			release()
			waitFor(t, 30*time.Second, "the LISTEN session back", func() bool { return ts.lsn.ok() })
			// The stream's check read after the session came back (and a rewind, if it found
			// one) has finished: the stream stands at the head, nothing read or held.
			waitFor(t, 30*time.Second, "the stream checked", func() bool {
				done := false
				ts.onLoop(t, func() {
					st := ts.fan.streams["wd"]
					done = st != nil && !st.unchecked() && !st.fetching && st.last == head && len(st.pending) == 0
				})
				return done
			})
			httpPublish("after", head+1)
			back := startReuseClient(t, addr, "/streams/wd", tok, "Last-Event-ID: "+strconv.Itoa(old-1))
			back.from = old - 1
			final := map[int64]string{head + 1: "after"}
			for i := int64(1); i <= head; i++ {
				final[i] = "old" + strconv.FormatInt(i, 10)
				if i > kept {
					final[i] = "new" + strconv.FormatInt(i-kept, 10)
				}
			}
			for i, c := range append([]*reuseClient{live, back}, during...) {
				waitFor(t, 10*time.Second, "every event delivered", func() bool { return c.lastID() >= head+1 })
				c.halt()
				c.check(t, "client "+strconv.Itoa(i), final, head+1)
			}
			assert.Equal(t, reuseEntry{gap: true, after: old, resume: kept}, live.firstGap(), "the live client: told where the histories part")
			assert.Equal(t, reuseEntry{gap: true, after: old - 1, resume: kept}, back.firstGap(), "the client reconnecting after it: told where the histories part")
			if tc.connect {
				assert.Zero(t, during[0].gaps(), "the subscriber that only read the table holds no lost event: no gap back (it would get the same events again)")
				assert.Equal(t, reuseEntry{gap: true, after: old - 1, resume: kept}, during[1].firstGap(), "the client reconnecting during the outage: told where the histories part")
				assert.Equal(t, 1, during[1].gaps(), "told once")
			}
		})
	}
}

// A subscription's own catch-up can deliver events beyond what the stream's live set has
// accounted for — committed, their notifications not yet come — and then a crash loses them
// together with their notifications: the live set's last id is still the table's, so only
// the catch-up's events tell (chaos, seed 11: a reconnection read 1836–1837 just before the
// crash and was never told). The rows are written here without a notification, as a commit
// whose notification the crash took; the rest is as above.
func TestStreamWentBackBeyondTheLiveSet(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	tok := bearerH(allStreams(t))
	sql := connect(t, ts.DSN)
	publishN(t, sql, "rb", "old", 5)
	live := startReuseClient(t, addr, "/streams/rb?since=0", tok)
	waitFor(t, 10*time.Second, "the live client at 5", func() bool { return live.lastID() >= 5 })
	_, err := sql.Exec(context.Background(), "INSERT INTO pgsse.events (stream, id, data) VALUES ('rb', 6, 'old6'), ('rb', 7, 'old7');"+
		" UPDATE pgsse.streams SET head = 7 WHERE stream = 'rb'").ReadAll()
	require.NoError(t, err)
	ahead := startReuseClient(t, addr, "/streams/rb", tok, "Last-Event-ID: 5")
	ahead.from = 5
	waitFor(t, 10*time.Second, "the catch-up past the live set", func() bool { return ahead.lastID() >= 7 })

	release := holdListenDown(t, ts)
	_, err = sql.Exec(context.Background(), "DELETE FROM pgsse.events WHERE stream = 'rb' AND id > 5; UPDATE pgsse.streams SET head = 5 WHERE stream = 'rb'").ReadAll()
	require.NoError(t, err)
	publishN(t, sql, "rb", "new", 3)
	release()
	waitFor(t, 30*time.Second, "the LISTEN session back", func() bool { return ts.lsn.ok() })
	final := map[int64]string{}
	for i := int64(1); i <= 8; i++ {
		final[i] = "old" + strconv.FormatInt(i, 10)
		if i > 5 {
			final[i] = "new" + strconv.FormatInt(i-5, 10)
		}
	}
	for i, c := range []*reuseClient{live, ahead} {
		waitFor(t, 30*time.Second, "every event delivered", func() bool { return c.lastID() >= 8 })
		c.halt()
		c.check(t, "client "+strconv.Itoa(i), final, 8)
	}
	assert.Zero(t, live.gaps(), "the live client had only the table's events")
	assert.Equal(t, reuseEntry{gap: true, after: 7, resume: 5}, ahead.firstGap(), "the client that read the lost events: told where the histories part")
}

// A rewind one process of the host finds is known to the others (rewinds.go; issue 24, the
// chaos run's pg-crash-async): a client that had the lost events, got its pgsse:gap back, and
// reconnects with its lost id as Last-Event-ID (EventSource keeps it: a gap has no id) to
// another --procs process — which never followed the stream, so it cannot find the rewind
// itself — is told the same gap back there, not served the ids after its cursor, which would
// silently skip the new events under the reused ids below it. Both ways: the first process
// finds it and tells the siblings; a sibling finds it, tells the first process, which tells
// the other sibling. And when the client's connection ends in the crash, taking the stream's
// last subscriber with it (chaos, seed 11: a flaky subscriber's lost 1104–1106, and no process
// logged a rewind of its stream), the process that delivered the lost events still finds it
// (rewinds.go, ghosts) and tells the others; the reconnection is told wherever it lands. The
// crash is made as in the tests above.
func TestRewindIsKnownToTheSiblings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		finder int  // the process with the live client, which finds the rewind: 0 the first
		leaves bool // the live client's connection ends during the outage
		early  bool // and reconnects during the outage, before any process can find the rewind
		news   int  // new events under the lost ids (default 8, more than were lost)
	}{
		{"the first process finds it", 0, false, false, 0},
		{"a sibling finds it", 1, false, false, 0},
		{"the sibling's only client left in the crash", 1, true, false, 0},
		{"the first process's only client left in the crash", 0, true, false, 0},
		{"the client reconnected during the outage", 0, true, true, 0},
		// the reconnection's cursor is past the new head: a gap down to where the histories
		// part, not to the head (which would skip the new events below it)
		{"fewer new events than were lost", 1, false, false, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			first := startServer(t, "", nil)
			procs := []*testServer{first, startSibling(t, first, nil), startSibling(t, first, nil)}
			tok := bearerH(allStreams(t))
			sql := connect(t, first.DSN) // opened before the database refuses new connections
			const old, kept = 10, 5
			news := 8
			if tc.news > 0 {
				news = tc.news
			}
			head := int64(kept + news)
			publishN(t, sql, "rs", "old", old)
			finder := procs[tc.finder]
			live := startReuseClient(t, finder.Addr().String(), "/streams/rs?since=0", tok)
			waitFor(t, 10*time.Second, "the old events delivered", func() bool { return live.lastID() >= old })

			release := holdListenDown(t, first)
			_, err := sql.Exec(context.Background(), "DELETE FROM pgsse.events WHERE stream = 'rs' AND id > "+strconv.Itoa(kept)+
				"; UPDATE pgsse.streams SET head = "+strconv.Itoa(kept)+" WHERE stream = 'rs'").ReadAll()
			require.NoError(t, err)
			publishN(t, sql, "rs", "new", news)
			if tc.leaves {
				live.halt()
				waitFor(t, 10*time.Second, "the stream dropped", func() bool {
					gone := false
					finder.onLoop(t, func() { gone = finder.fan.streams["rs"] == nil })
					return gone
				})
			}
			backs := map[int]*reuseClient{}
			if tc.early {
				// Reconnections that land on processes that do not follow the stream, while
				// nobody can know yet: their catch-up waits for the session, and for the
				// others' telling (settling).
				for i, ts := range procs[1:] {
					backs[i+1] = startReuseClient(t, ts.Addr().String(), "/streams/rs", tok, "Last-Event-ID: "+strconv.Itoa(old))
				}
			}
			release()
			if !tc.leaves {
				waitFor(t, 30*time.Second, "the live client told where the histories part", func() bool { return live.gaps() > 0 })
				live.halt()
			}
			live.mu.Lock()
			var prior []reuseEntry // what the client had when it got the gap: the lost events
			for _, e := range live.log {
				if e.gap {
					break
				}
				prior = append(prior, e)
			}
			if !tc.leaves {
				require.Equal(t, reuseEntry{gap: true, after: old, resume: kept}, live.log[len(prior)])
			}
			live.mu.Unlock()
			require.Len(t, prior, old)

			final := map[int64]string{}
			for i := int64(1); i <= head; i++ {
				final[i] = "old" + strconv.FormatInt(i, 10)
				if i > kept {
					final[i] = "new" + strconv.FormatInt(i-kept, 10)
				}
			}
			for i, ts := range procs {
				if i == tc.finder && !tc.leaves {
					continue
				}
				// The notice travels beside the client's reconnection; a client reconnecting
				// faster than it does is not told (docs/http.md says so).
				back := backs[i]
				if back == nil {
					waitFor(t, 10*time.Second, "process "+strconv.Itoa(i)+" told of the rewind", func() bool {
						told := false
						ts.onLoop(t, func() { _, told = ts.fan.rewinds.known("rs", ts.fan.nowMS) })
						return told
					})
					back = startReuseClient(t, ts.Addr().String(), "/streams/rs", tok, "Last-Event-ID: "+strconv.Itoa(old))
				}
				back.prior = prior
				waitFor(t, 10*time.Second, "every event delivered", func() bool { return back.lastID() >= head })
				back.halt()
				back.check(t, "the reconnection to process "+strconv.Itoa(i), final, head)
				assert.Equal(t, reuseEntry{gap: true, after: old, resume: kept}, back.firstGap(), "process %d: told where the histories part", i)
			}
		})
	}
}
