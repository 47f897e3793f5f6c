// Command hubworker is the engine's hub test worker: a process that listens through the
// failover Listener (hub first, own session after a switch) and prints every event as one JSON
// line on stdout. Commands on stdin: "listen CH", "unlisten CH". EOF on stdin closes the
// Listener and exits.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/pgsse/pgsse/framing"
	"github.com/pgsse/pgsse/pglisten"
)

// line is one output record. Payload is base64 in JSON, so bytes survive exactly.
type line struct {
	Ev      string          `json:"ev"` // ready, listened, error, notify, down, resync, source, closed
	Ch      string          `json:"ch,omitempty"`
	PID     uint32          `json:"pid,omitempty"`
	Payload []byte          `json:"payload,omitempty"`
	Source  pglisten.Source `json:"source"` // hub or direct
	Err     string          `json:"err,omitempty"`
}

func main() {
	socket := flag.String("socket", "", "hub socket")
	dsn := flag.String("dsn", "", "database URL for the direct session")
	channels := flag.String("channels", "", "comma-separated channels to listen to at start")
	mode := flag.String("mode", "lossless", "SUB mode: lossless or wake")
	name := flag.String("name", "hubworker", "worker name")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg := pglisten.FailoverConfig{
		Hub:    pglisten.HubConfig{Socket: *socket, Name: *name, AckTimeout: 5 * time.Second},
		Direct: pglisten.Config{DSN: *dsn},
		Logger: log,
	}
	if *mode == "wake" {
		cfg.Hub.Mode = framing.ModeWake
	}
	l, err := pglisten.NewFailover(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	f := l.(*pglisten.Failover)

	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	lastSource := f.Source()
	emit := func(r line) {
		mu.Lock()
		defer mu.Unlock()
		if src := f.Source(); src != lastSource {
			lastSource = src
			reason := ""
			if err := f.Reason(); err != nil {
				reason = err.Error()
			}
			_ = enc.Encode(line{Ev: "source", Source: src, Err: reason})
		}
		r.Source = lastSource
		_ = enc.Encode(r)
		_ = out.Flush()
	}

	ctx := context.Background()
	for _, c := range strings.Split(*channels, ",") {
		if c == "" {
			continue
		}
		if err := l.Listen(ctx, c); err != nil {
			emit(line{Ev: "error", Ch: c, Err: err.Error()})
			os.Exit(1)
		}
	}
	emit(line{Ev: "ready"})

	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range l.Events() {
			switch ev.Kind {
			case pglisten.KindNotification:
				emit(line{Ev: "notify", Ch: ev.Channel, PID: ev.PID, Payload: ev.Payload})
			case pglisten.KindDown:
				emit(line{Ev: "down"})
			case pglisten.KindResync:
				emit(line{Ev: "resync", Ch: ev.Channel})
			}
		}
	}()

	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		verb, arg, _ := strings.Cut(in.Text(), " ")
		var err error
		switch verb {
		case "listen":
			err = l.Listen(ctx, arg)
		case "unlisten":
			err = l.Unlisten(ctx, arg)
		default:
			err = fmt.Errorf("unknown command %q", verb)
		}
		if err != nil {
			emit(line{Ev: "error", Ch: arg, Err: err.Error()})
		} else {
			emit(line{Ev: verb + "ed", Ch: arg})
		}
	}
	_ = l.Close()
	<-done
	emit(line{Ev: "closed"})
}
