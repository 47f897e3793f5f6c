package engine

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// docs/http.md, Publishing over HTTP: PostgreSQL stopped mid-run → 503 with Retry-After and
// nothing published for those requests (a batch all or nothing), publishing resumes when it
// returns, and a subscriber sees every event that was published, once, in order.
func TestPublishPostgresStopped(t *testing.T) {
	t.Parallel()
	cluster := pgtest.StartCluster(t, pgtest.ClusterOptions{})
	dsn := migrated(t, cluster.NewDatabase(t))
	ts := startServer(t, dsn, nil)
	addr := ts.Addr().String()
	sub := startFaultClient(t, addr, "/streams/down/a?since=0", bearerH(allStreams(t)))
	authz := bearerH(publishToken(t, "down/*"))

	// Every request's lines carry unique data, so the table says what each one stored.
	type outcome struct {
		lines   []string // data of each line
		streams []string
		status  int
		ids     []int64
		unknown bool // 503 "may or may not have been published"
	}
	var mu sync.Mutex
	var outcomes []outcome
	var ok200, got503 atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var conn net.Conn
			var r *bufio.Reader
			defer func() {
				if conn != nil {
					conn.Close()
				}
			}()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				if conn == nil {
					c, err := net.DialTimeout("tcp", addr, 5*time.Second)
					if err != nil {
						t.Errorf("publisher %d: dial: %v", p, err)
						return
					}
					conn, r = c, bufio.NewReader(c)
				}
				o := outcome{}
				var raw string
				if n%2 == 0 {
					o.lines, o.streams = []string{fmt.Sprintf("p%d-%d", p, n)}, []string{"down/a"}
					raw = post("/streams/down/a", o.lines[0], authz)
				} else {
					var b strings.Builder
					for k, st := range []string{"down/a", "down/b", "down/a"} {
						d := fmt.Sprintf("p%d-%d-%d", p, n, k)
						o.lines, o.streams = append(o.lines, d), append(o.streams, st)
						b.WriteString(`{"stream":"` + st + `","data":"` + d + `"}` + "\n")
					}
					raw = post("/publish", b.String(), authz, "Content-Type: application/x-ndjson")
				}
				_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
				_, err := conn.Write([]byte(raw))
				var resp *http.Response
				if err == nil {
					resp, err = http.ReadResponse(r, &http.Request{Method: "POST"})
				}
				if err != nil {
					t.Errorf("publisher %d: %v", p, err)
					return
				}
				var body strings.Builder
				_, _ = bufioCopy(&body, resp)
				o.status = resp.StatusCode
				switch o.status {
				case 200:
					ok200.Add(1)
					var v struct {
						ID  int64
						IDs []int64
					}
					if err := json.Unmarshal([]byte(body.String()), &v); err != nil {
						t.Errorf("publisher %d: %v in %q", p, err, body.String())
						return
					}
					if o.ids = v.IDs; len(o.lines) == 1 {
						o.ids = []int64{v.ID}
					}
				case 503:
					got503.Add(1)
					if resp.Header.Get("Retry-After") == "" {
						t.Errorf("503 without Retry-After: %s", body.String())
					}
					o.unknown = strings.Contains(body.String(), "may or may not")
					time.Sleep(20 * time.Millisecond)
				default:
					t.Errorf("publisher %d: status %d: %s", p, o.status, body.String())
					return
				}
				mu.Lock()
				outcomes = append(outcomes, o)
				mu.Unlock()
				if resp.Close {
					conn.Close()
					conn = nil
				}
			}
		}()
	}
	waitFor(t, 15*time.Second, "publishing", func() bool { return ok200.Load() > 20 })
	cluster.Stop()
	waitFor(t, 30*time.Second, "503s while PostgreSQL is down", func() bool { return got503.Load() > 5 })
	before := ok200.Load()
	cluster.Start()
	waitFor(t, 60*time.Second, "publishing again", func() bool { return ok200.Load() > before+20 })
	close(stop)
	wg.Wait()

	// The table against the answers.
	rows := pgtest.Exec(t, dsn, "SELECT data, stream, id FROM pgsse.events")
	stored := map[string]string{} // data → "stream id"
	for _, row := range rows[0].Rows {
		stored[string(row[0])] = string(row[1]) + " " + string(row[2])
	}
	published, refused := 0, 0
	for _, o := range outcomes {
		present := 0
		for _, d := range o.lines {
			if _, ok := stored[d]; ok {
				present++
			}
		}
		switch {
		case o.status == 200:
			published++
			for i, d := range o.lines {
				assert.Equal(t, o.streams[i]+" "+strconv.FormatInt(o.ids[i], 10), stored[d], "answered 200: stored with its id")
			}
		case o.unknown:
			assert.Contains(t, []int{0, len(o.lines)}, present, "outcome unknown, but all or nothing: %v", o.lines)
		default:
			refused++
			assert.Zero(t, present, "answered 503: nothing of %v may be stored", o.lines)
		}
	}
	t.Logf("%d requests published, %d refused with 503 while PostgreSQL was down", published, refused)
	head := streamHead(t, dsn, "down/a")
	sub.finish(t, "subscriber", 1, head, 30*time.Second)
}
