//go:build linux

// Command idleprobe opens n idle SSE connections to a running server and holds them until
// killed (issue 25: the heap profile and memory statistics of an idle server are taken by
// hand while it holds them). It prints "connected N" once they are open.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/pgsse/pgsse/bench"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "the server's SSE address")
	n := flag.Int("n", 15000, "connections")
	path := flag.String("path", "/streams/idle", "request target; several separated by spaces are taken in turn")
	flag.Parse()
	ap, err := netip.ParseAddrPort(*addr)
	if err != nil {
		log.Fatal(err)
	}
	cfg := bench.ClientConfig{Addr: ap, MaxSeq: 16}
	if ps := strings.Fields(*path); len(ps) > 1 {
		cfg.Paths = ps
	} else {
		cfg.Path = *path
	}
	c, err := bench.NewClient(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if err := c.Connect(*n, false); err != nil {
		log.Fatal(err)
	}
	took := time.Since(start)
	fmt.Printf("connected %d in %.2f s (%.0f conn/s)\n", c.Conns(), took.Seconds(), float64(c.Conns())/took.Seconds())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
