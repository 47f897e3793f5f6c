package engine

import (
	"bufio"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
)

// The publishing path's limits under attack (issue 23): what one publisher can make the
// others wait for.

// A refusal decided by the verifier pool (the token was not in its cache) leaves the
// connection idle with the requests the client pipelined behind it already in the input:
// they are answered at once, not once the client sends more bytes or the keep-alive timeout
// ends the connection (issue 23: 8/8 hung for ≈ 31 s).
func TestPublishPipelinedAfterPoolVerdict(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()
	granted := bearerH(publishToken(t, "pv/*"))
	// Warm the cache for the request behind, so that only the first one goes to the pool.
	require.Equal(t, 200, dialPub(t, addr).do(post("/streams/pv/warm", "x", granted)).Status)

	for i, tc := range []struct {
		name   string
		status int
		behind string // "POST" or "GET"
	}{
		{"401 then POST", 401, "POST"},
		{"401 then GET", 401, "GET"},
		{"403 then POST", 403, "POST"},
		{"403 then GET", 403, "GET"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A token no request has used yet, so that its verdict comes from the pool.
			claims := auth.Claims{Publish: []string{"elsewhere/*"}, Subject: "pv-" + strconv.Itoa(i)}
			var first string
			if tc.status == 401 {
				tok, err := auth.Mint(auth.MintKey{Secret: []byte("another secret, 32 bytes or more!!")}, claims, time.Hour, "", "", time.Now())
				require.NoError(t, err)
				first = bearerH(tok)
			} else {
				first = bearerH(token(t, claims, time.Hour))
			}
			c := dialPub(t, addr)
			raw := post("/streams/pv/"+strconv.Itoa(i), "refused", first)
			if tc.behind == "POST" {
				raw += post("/streams/pv/"+strconv.Itoa(i), "behind", granted)
			} else {
				raw += request("GET", "/streams/pv/"+strconv.Itoa(i), bearerH(allStreams(t)))
			}
			c.send(raw) // one write: nothing more follows
			r, err := c.readErr(5 * time.Second)
			require.NoError(t, err)
			require.Equal(t, tc.status, r.Status, r.Body)
			if tc.behind == "POST" {
				r, err = c.readErr(5 * time.Second)
				require.NoError(t, err, "the pipelined POST is answered without more bytes from the client")
				assert.Equal(t, 200, r.Status, r.Body)
				return
			}
			_ = c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(c.r, &http.Request{Method: "GET"})
			require.NoError(t, err, "the pipelined GET is answered without more bytes from the client")
			assert.Equal(t, 200, resp.StatusCode)
			assert.Equal(t, "text/event-stream; charset=utf-8", resp.Header.Get("Content-Type"))
		})
	}
}

// While a request waits for its token's verdict, what the client sends behind it stays in the
// input, at most publishPipelineBytes of it: more closes the connection at once, as it does
// while a request waits for its COMMIT (it used to pile up in gnet's buffer, without bound,
// for as long as the verdict took).
func TestPublishPipelineBoundWhileVerifying(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	release := holdVerifier(t, ts)
	defer release()
	c := dialPub(t, ts.Addr().String())
	c.send(post("/streams/pb/1", "body", bearerH(publishToken(t, "pb/*"))))
	ahead := make([]byte, publishPipelineBytes+1)
	for i := range ahead {
		ahead[i] = 'x'
	}
	c.send(string(ahead))
	start := time.Now()
	c.expectEOF()
	assert.Less(t, time.Since(start), 5*time.Second, "closed at once, not after the verdict or the body deadline")
}

// holdVerifier keeps every goroutine of ts's verifier pool (its rescue too) busy until
// release is called (also at the end of the test): tokens that are not in its cache wait in
// its queue meanwhile, as they do when a storm of new tokens swamps it.
func holdVerifier(t testing.TB, ts *testServer) (release func()) {
	t.Helper()
	var pool *auth.Pool
	ts.onLoop(t, func() { pool = ts.tok.pool })
	require.NotNil(t, pool)
	block := make(chan struct{})
	var busy sync.WaitGroup
	for i := range verifyWorkers() {
		busy.Add(1)
		require.True(t, pool.Submit([]byte("held-"+strconv.Itoa(i)), time.Now(), func(*auth.Claims, error) {
			busy.Done()
			<-block
		}))
	}
	busy.Wait()
	// One more, first in the queue: the pool's rescue (auth.PoolConfig.StarveAfter), which
	// verifies what has waited too long for the lowered workers, takes it and is held too.
	require.True(t, pool.Submit([]byte("held-rescue"), time.Now(), func(*auth.Claims, error) { <-block }))
	var once sync.Once
	release = func() { once.Do(func() { close(block) }) }
	t.Cleanup(release)
	return release
}

// One publisher cannot block HTTP publishing for the others (issue 23): 128 connections under
// one token that each announce a 1 MiB body and then send it at 1 byte/s — or send all but
// its last byte and stall, or do so with tokens the verifier pool has not answered yet —
// leave 64 other publishers at least 90 % of the publish rate they had without the attack,
// measured in the same run over windows of equal length. Bodies count against the budget
// as their bytes arrive, one subject (or token) holds at most its share, and bodies whose
// tokens are not verified yet at most theirs together.
//
// The 64 publishers are paced (publishPace each, well under what the server does on a
// loaded 2-core machine), so that a window counts how many publishes the attack let
// through rather than how much CPU the machine had to spare at that moment. Not parallel:
// other tests of the package would share the windows.
func TestPublishBodiesBudgetUnderAttack(t *testing.T) {
	const (
		attackers  = 128
		announced  = 1 << 20
		publishers = 64
		window     = 4 * time.Second
	)
	for _, tc := range []struct {
		name  string
		stall bool // send all but the last byte at once (else 1 byte/s)
		fresh bool // each attacker has a token the pool has not verified yet (and is held busy)
		// refusal is what an attacker refused for its bytes is told ("" = none is), and limit
		// the budget's limit that bound them.
		refusal string
		limit   func(*bodyBudget) int64
	}{
		{name: "1 byte per second"},
		{name: "stalled a byte short, one token", stall: true, refusal: bodiesSubjectText,
			limit: func(b *bodyBudget) int64 { return b.share }},
		{name: "stalled a byte short, tokens not verified yet", stall: true, fresh: true, refusal: bodiesUnverifiedText,
			limit: func(b *bodyBudget) int64 { return b.unverifiedMax }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, "", nil)
			addr := ts.Addr().String()
			good := bearerH(publishToken(t, "good/*"))
			attack := bearerH(publishToken(t, "attack/*"))
			for _, tok := range []string{good, attack} { // in the verifier's cache from now on
				r := dialPub(t, addr).do(post("/streams/"+map[string]string{good: "good", attack: "attack"}[tok]+"/warm", "x", tok))
				require.Equal(t, 200, r.Status, r.Body)
			}

			pubs := startPacedPublishers(t, addr, publishers, good)
			defer pubs.stop()
			time.Sleep(time.Second) // warm-up: the connections are open and paced
			base := pubs.rateOver(t, window)

			if tc.fresh {
				defer holdVerifier(t, ts)()
			}
			atk := startBodyAttack(t, ts, attackers, announced, tc.stall, func(i int) string {
				if !tc.fresh {
					return attack
				}
				return bearerH(token(t, auth.Claims{Publish: []string{"attack/*"}, Subject: "attacker"}, time.Hour+time.Duration(i)*time.Second))
			})
			defer atk.stop()
			under := pubs.rateOver(t, window)
			failed := pubs.failures()
			ts.onLoop(t, func() { atk.held, atk.unverified = ts.pub.bodies.held, ts.pub.bodies.unverified })

			t.Logf("%.0f publishes/s without the attack, %.0f with it (%d attackers refused; the server held %d bytes of bodies at the end, %d of them unverified)",
				base, under, atk.refused.Load(), atk.held, atk.unverified)
			require.Greater(t, base, float64(publishers)/publishPace.Seconds()/2, "the baseline ran at least at half its pace")
			assert.GreaterOrEqual(t, under, 0.9*base, "publishes/s under the attack; refusals: %v", failed)
			if tc.refusal == "" {
				assert.Zero(t, atk.refused.Load(), "a trickle holds what it sent, nothing is refused")
				assert.NotZero(t, atk.held, "what arrived is counted")
				assert.Less(t, atk.held, int64(attackers*4096), "the announced lengths reserve nothing")
			} else {
				assert.NotZero(t, atk.refused.Load())
				assert.Equal(t, []string{"503 " + tc.refusal}, atk.reasons(), "what the refused attackers were told")
				var limit int64
				ts.onLoop(t, func() { limit = tc.limit(&ts.pub.bodies) })
				// Besides the attackers' bodies, those of the publishers being received at that moment.
				assert.LessOrEqual(t, atk.held, limit+publishers*4096, "the attackers hold no more than their share")
			}
		})
	}
}

// Each of startPacedPublishers' publishers publishes every publishPace, making up for a late
// one for at most publishDebt.
const (
	publishPace = 200 * time.Millisecond
	publishDebt = time.Second
)

// pacedPublishers publish one small event every publishPace each, on keep-alive connections.
// Each publish has its slot, publishPace after the one before; one that comes late (the
// machine is busy) is made up for, up to publishDebt. A publish counts for its slot, so that
// a window counts the slots inside it whose publish the server answered 200, however late:
// the publish rate the server gives them, without the edges of the window blurring it.
type pacedPublishers struct {
	window atomic.Int64 // when the current measuring window began, unix ns: no slot before it is made up for
	mu     sync.Mutex
	ok     []int64        // the slots answered 200, unix ns
	fail   map[string]int // other answers, by status and text
	behind []atomic.Int64 // each publisher's next slot, unix ns: it is done with every slot before
	done   chan struct{}
	wg     sync.WaitGroup
}

func startPacedPublishers(t *testing.T, addr string, n int, authz string) *pacedPublishers {
	t.Helper()
	p := &pacedPublishers{fail: map[string]int{}, behind: make([]atomic.Int64, n), done: make(chan struct{})}
	for i := range n {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			raw := post("/streams/good/"+strconv.Itoa(i), "a small event from a publisher that behaves", authz)
			slot := time.Now()
			var conn net.Conn
			var r *bufio.Reader
			defer func() {
				if conn != nil {
					conn.Close()
				}
			}()
			for {
				p.behind[i].Store(slot.UnixNano())
				select {
				case <-p.done:
					return
				case <-time.After(time.Until(slot)):
				}
				this := slot
				if slot = slot.Add(publishPace); time.Until(slot) < -publishDebt {
					slot = time.Now().Add(-publishDebt)
				}
				if from := time.Unix(0, p.window.Load()); slot.Before(from) {
					slot = from
				}
				if conn == nil {
					c, err := net.DialTimeout("tcp", addr, 5*time.Second)
					if err != nil {
						p.failed("dial: " + err.Error())
						continue
					}
					conn, r = c, bufio.NewReader(c)
				}
				_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
				resp, err := func() (*http.Response, error) {
					if _, err := conn.Write([]byte(raw)); err != nil {
						return nil, err
					}
					return http.ReadResponse(r, &http.Request{Method: "POST"})
				}()
				if err != nil {
					p.failed(err.Error())
					conn.Close()
					conn = nil
					continue
				}
				body, _ := io.ReadAll(resp.Body)
				if resp.StatusCode == 200 {
					p.mu.Lock()
					p.ok = append(p.ok, this.UnixNano())
					p.mu.Unlock()
				} else {
					p.failed(strconv.Itoa(resp.StatusCode) + " " + strings.TrimSpace(string(body)))
				}
				if resp.Close {
					conn.Close()
					conn = nil
				}
			}
		}()
	}
	return p
}

func (p *pacedPublishers) failed(what string) {
	p.mu.Lock()
	p.fail[what]++
	p.mu.Unlock()
}

// rateOver is the publishes per second answered 200 for the slots of the next d: once d
// has passed, it waits until every publisher is done with its slots inside.
func (p *pacedPublishers) rateOver(t *testing.T, d time.Duration) float64 {
	from := time.Now()
	p.window.Store(from.UnixNano())
	time.Sleep(d) // the measuring window itself
	to := time.Now()
	waitFor(t, 30*time.Second, "the publishers done with the window", func() bool {
		for i := range p.behind {
			if p.behind[i].Load() < to.UnixNano() {
				return false
			}
		}
		return true
	})
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, slot := range p.ok {
		if slot >= from.UnixNano() && slot < to.UnixNano() {
			n++
		}
	}
	return float64(n) / to.Sub(from).Seconds()
}

func (p *pacedPublishers) failures() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.fail)
}

func (p *pacedPublishers) stop() {
	close(p.done)
	p.wg.Wait()
}

// bodyAttack is startBodyAttack's connections.
type bodyAttack struct {
	conns   []net.Conn
	refused atomic.Int64
	mu      sync.Mutex
	told    map[string]bool
	// What the server held at the end of the attack.
	held, unverified int64
	done             chan struct{}
	wg               sync.WaitGroup
}

// startBodyAttack opens n connections that each announce a body of announced bytes to
// /streams/attack/<i> with the token authz(i), and either send all of it but the last byte
// (stall) or one byte per second. It returns once the attack is in place: every connection's
// head has been read by the server, and, when stalling, each one's bytes are either all held
// by the server or refused (read from the answer).
func startBodyAttack(t *testing.T, ts *testServer, n, announced int, stall bool, authz func(int) string) *bodyAttack {
	t.Helper()
	a := &bodyAttack{told: map[string]bool{}, done: make(chan struct{})}
	body := make([]byte, announced-1)
	for i := range body {
		body[i] = 'a'
	}
	for i := range n {
		conn, err := net.DialTimeout("tcp", ts.Addr().String(), 5*time.Second)
		require.NoError(t, err)
		a.conns = append(a.conns, conn)
		head := request("POST", "/streams/attack/"+strconv.Itoa(i), authz(i), "Content-Length: "+strconv.Itoa(announced))
		_, err = conn.Write([]byte(head))
		require.NoError(t, err)
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			if stall {
				if _, err := conn.Write(body); err != nil {
					return // refused and closed before it all left
				}
			} else {
				tick := time.NewTicker(time.Second)
				defer tick.Stop()
				a.wg.Add(1)
				go func() {
					defer a.wg.Done()
					for {
						select {
						case <-a.done:
							return
						case <-tick.C:
							if _, err := conn.Write([]byte("a")); err != nil {
								return
							}
						}
					}
				}()
			}
			_ = conn.SetReadDeadline(time.Now().Add(2 * time.Minute))
			resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: "POST"})
			if err != nil {
				return // closed by stop
			}
			b, _ := io.ReadAll(resp.Body)
			a.refused.Add(1)
			a.mu.Lock()
			a.told[strconv.Itoa(resp.StatusCode)+" "+strings.TrimSpace(string(b))] = true
			a.mu.Unlock()
		}()
	}
	waitFor(t, 60*time.Second, "the attack in place", func() bool {
		inPlace := 0
		ts.onLoop(t, func() {
			for _, sc := range ts.conns.all() {
				if sc.publisher() != nil && sc.state == statePublishBody && strings.HasPrefix(sc.publisher().stream, "attack/") &&
					(!stall || sc.publisher().held >= int64(announced-1)) {
					inPlace++
				}
			}
		})
		if !stall {
			return inPlace == n
		}
		return inPlace+int(a.refused.Load()) == n
	})
	return a
}

// reasons is what the refused attackers were told, sorted.
func (a *bodyAttack) reasons() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Sorted(maps.Keys(a.told))
}

func (a *bodyAttack) stop() {
	close(a.done)
	for _, c := range a.conns {
		c.Close()
	}
	a.wg.Wait()
}
