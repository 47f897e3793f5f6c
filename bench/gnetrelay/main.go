// Command gnetrelay is the floor of memory per connection (issue 25): the least an SSE relay on
// gnet can hold per connection — gnet's own connection and nothing else. One event loop (as
// pgsse runs), gnet's own accept, the request head read until its blank line and answered with
// the same head and preamble as pgsse, a heartbeat comment to every connection each
// --heartbeat, and each NOTIFY on channel "pgsse" written as one data: line to every connection
// (no parsing, no streams, no ids, no replay, no limits). What it holds per connection beyond
// gnet's: its slot in the list the heartbeat and the relay walk, and that slot's index in the
// connection's context.
package main

import (
	"bytes"
	"context"
	"flag"
	"log"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/panjf2000/gnet/v2"
)

var head = []byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n" +
	"Cache-Control: no-cache, no-store\r\nX-Accel-Buffering: no\r\n\r\nretry: 2000\n:ok\n\n")

type relay struct {
	gnet.BuiltinEventEngine
	loop      atomic.Value // gnet.EventLoop, from the first connection: the relay's tasks run there
	conns     []gnet.Conn  // answered connections; a connection's context is its index here
	heartbeat time.Duration
}

func (r *relay) OnTraffic(c gnet.Conn) gnet.Action {
	buf, _ := c.Peek(-1)
	if c.Context() != nil || !bytes.Contains(buf, []byte("\r\n\r\n")) {
		_, _ = c.Discard(len(buf)) // after the head: nothing to read; before: wait for the rest
		return gnet.None
	}
	_, _ = c.Discard(len(buf))
	if r.loop.Load() == nil {
		r.loop.Store(c.EventLoop())
	}
	c.SetContext(len(r.conns))
	r.conns = append(r.conns, c)
	_, _ = c.Write(head)
	return gnet.None
}

func (r *relay) OnClose(c gnet.Conn, _ error) gnet.Action {
	if i, ok := c.Context().(int); ok { // swap-remove
		last := r.conns[len(r.conns)-1]
		r.conns[i] = last
		last.SetContext(i)
		r.conns = r.conns[:len(r.conns)-1]
	}
	return gnet.None
}

func (r *relay) OnTick() (time.Duration, gnet.Action) {
	r.all([]byte(":\n"))
	return r.heartbeat, gnet.None
}

// all writes b to every answered connection (on the loop: OnTick, or a task from the LISTEN
// goroutine).
func (r *relay) all(b []byte) {
	for _, c := range r.conns {
		_, _ = c.Write(b)
	}
}

func main() {
	dsn := flag.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL DSN (LISTEN pgsse)")
	listen := flag.String("listen", "127.0.0.1:8082", "SSE listen address")
	heartbeat := flag.Duration("heartbeat", 15*time.Second, "comment line interval")
	flag.Parse()
	r := &relay{heartbeat: *heartbeat}
	ctx := context.Background()
	cfg, err := pgconn.ParseConfig(*dsn)
	if err != nil {
		log.Fatalf("gnetrelay: %v", err)
	}
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) {
		if loop, ok := r.loop.Load().(gnet.EventLoop); ok {
			ev := append(append([]byte("data: "), n.Payload...), "\n\n"...)
			_ = loop.Execute(ctx, gnet.RunnableFunc(func(context.Context) error { r.all(ev); return nil }))
		}
	}
	lc, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		log.Fatalf("gnetrelay: %v", err)
	}
	if _, err := lc.Exec(ctx, "LISTEN pgsse").ReadAll(); err != nil {
		log.Fatalf("gnetrelay: LISTEN: %v", err)
	}
	go func() {
		for {
			if err := lc.WaitForNotification(ctx); err != nil {
				log.Fatalf("gnetrelay: LISTEN session: %v", err)
			}
		}
	}()
	log.Fatal(gnet.Run(r, "tcp://"+*listen, gnet.WithMulticore(false), gnet.WithNumEventLoop(1), gnet.WithTicker(true)))
}
