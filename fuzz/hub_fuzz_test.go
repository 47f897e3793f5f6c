package fuzz

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pgsse/pgsse/engine"
	"github.com/pgsse/pgsse/framing"
)

// FuzzHubServer drives the hub's server side (engine, docs/hub-protocol.md) with arbitrary byte
// streams, delivered in two pieces: the server never panics, only ever answers with well-formed
// hub-to-worker frames, closes the connection (at the latest when the peer stops sending), and
// keeps serving another worker throughout.
//
// The server runs against an unreachable PostgreSQL so that the target needs no database: the
// hub's handshake, PING, SUB registration, UNSUB, limits and protocol errors all work without
// a LISTEN session (SUBs then simply wait for it).
func FuzzHubServer(f *testing.F) {
	hello := framing.AppendHello(nil, 1, []byte("fuzz"))
	seeds := [][]byte{
		hello,
		append(append([]byte(nil), hello...), framing.AppendPing(nil, 7)...),
		append(append([]byte(nil), hello...), framing.AppendSub(nil, 1, framing.ModeWake, []byte("jobs"))...),
		append(append(append([]byte(nil), hello...), framing.AppendSub(nil, 1, 0, []byte("a"))...), framing.AppendUnsub(nil, 2, []byte("a"))...),
		append(append([]byte(nil), hello...), framing.AppendUnsub(nil, 3, []byte("never"))...),
		append(append([]byte(nil), hello...), framing.AppendSub(nil, 4, 0, []byte("pgsse"))...),
		append(append([]byte(nil), hello...), 0, 0, 0, 6, 0x02, 0, 0, 0, 5, 0), // SUB, empty channel
		append(append([]byte(nil), hello...), framing.AppendNotify(nil, 1, []byte("x"), []byte("y"))...),
		append(append([]byte(nil), hello...), hello...),
		framing.AppendSub(nil, 1, 0, []byte("x")),
		{0, 1, 0, 1, 1},
		{0, 0, 0, 0},
		{0, 0, 0, 1, 0x7f},
		{0, 0, 0, 3, 0x01, 1, 0},
		[]byte("GET / HTTP/1.1\r\n\r\n"),
	}
	for i, s := range seeds {
		f.Add(s, uint16(i*3))
	}

	sock := startFuzzHub(f)
	healthy := newFuzzWorker(f, sock)
	token := uint64(0)

	f.Fuzz(func(t *testing.T, data []byte, split uint16) {
		c := sendInTwo(t, "unix", sock, data, split, 10*time.Second)
		defer c.Close()

		// Everything the hub sent must be well-formed hub frames, then EOF.
		var dec framing.Decoder
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			dec.Feed(buf[:n])
			for {
				fr, derr := dec.Next()
				if derr == framing.ErrIncomplete {
					break
				}
				if derr != nil {
					t.Fatalf("hub sent a malformed frame: %v", derr)
				}
				if !framing.IsHubType(fr.Type) {
					t.Fatalf("hub sent a worker frame %v", fr.Type)
				}
			}
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !isReset(err) {
					t.Fatalf("hub did not close the connection: %v", err)
				}
				break
			}
		}
		if dec.Buffered() != 0 {
			t.Fatalf("hub's output ends inside a frame (%d bytes)", dec.Buffered())
		}

		token++
		healthy.ping(t, token)
	})
}

// sendInTwo dials addr, writes data in two pieces (cut at split modulo its length) and
// closes the write side; the connection's deadline is timeout from now.
func sendInTwo(t *testing.T, network, addr string, data []byte, split uint16, timeout time.Duration) net.Conn {
	c, err := net.DialTimeout(network, addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	cut := 0
	if len(data) > 0 {
		cut = int(split) % (len(data) + 1)
	}
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write(data[:cut]); err == nil {
		_, _ = c.Write(data[cut:])
	}
	_ = c.(interface{ CloseWrite() error }).CloseWrite()
	return c
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Err != nil && (op.Err.Error() == "read: connection reset by peer")
}

// startFuzzHub runs one engine with a hub socket for the whole fuzz process.
func startFuzzHub(f *testing.F) string {
	dir, err := os.MkdirTemp("", "hubfuzz")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "hub.sock")
	runFuzzEngine(f, engine.Config{HubSocket: sock})
	return sock
}

// runFuzzEngine runs one engine for the whole fuzz process, on 127.0.0.1:0 against an
// unreachable PostgreSQL (so a target needs no database), quiet; cfg adds the rest.
func runFuzzEngine(f *testing.F, cfg engine.Config) *engine.Server {
	cfg.DatabaseURL = "postgres://pgsse@127.0.0.1:1/none?sslmode=disable&connect_timeout=1"
	cfg.Listen = "127.0.0.1:0"
	cfg.Retention = 0
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := engine.New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	select {
	case <-srv.Started():
	case err := <-done:
		f.Fatalf("the engine did not start: %v", err)
	}
	f.Cleanup(func() {
		cancel()
		<-done
	})
	return srv
}

// fuzzWorker is a well-behaved worker that must keep being served.
type fuzzWorker struct {
	c   net.Conn
	dec framing.Decoder
	buf []byte
}

func newFuzzWorker(f *testing.F, sock string) *fuzzWorker {
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { c.Close() })
	w := &fuzzWorker{c: c, buf: make([]byte, 4096)}
	if _, err := c.Write(framing.AppendHello(nil, 2, []byte("healthy"))); err != nil {
		f.Fatal(err)
	}
	if fr, err := w.next(); err != nil || fr.Type != framing.TypeStatus || fr.Status != framing.StatusReady {
		f.Fatalf("no READY: %v %v", fr.Type, err)
	}
	return w
}

func (w *fuzzWorker) next() (framing.Frame, error) {
	_ = w.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		fr, err := w.dec.Next()
		if err != framing.ErrIncomplete {
			return fr, err
		}
		n, err := w.c.Read(w.buf)
		if err != nil {
			return framing.Frame{}, err
		}
		w.dec.Feed(w.buf[:n])
	}
}

func (w *fuzzWorker) ping(t *testing.T, token uint64) {
	if _, err := w.c.Write(framing.AppendPing(nil, token)); err != nil {
		t.Fatalf("healthy worker: write PING: %v", err)
	}
	fr, err := w.next()
	if err != nil || fr.Type != framing.TypePong || fr.Token != token {
		t.Fatalf("healthy worker not served after the input: %v %v %d", fr.Type, err, fr.Token)
	}
}
