package engine

import (
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recordConn is a gnet.Conn that records what is written and whether it was closed (only
// what the state machine calls is implemented).
type recordConn struct {
	gnet.Conn
	ctx     any
	written strings.Builder
	closed  bool
}

func (c *recordConn) Write(b []byte) (int, error) { c.written.Write(b); return len(b), nil }
func (c *recordConn) Close() error                { c.closed = true; return nil }
func (c *recordConn) SetContext(v any)            { c.ctx = v }
func (c *recordConn) Context() any                { return c.ctx }

// openAt opens one SSE connection at nowMS on a Server that is not running.
func openAt(t *testing.T, nowMS int64) (*Server, *recordConn, *sseConn) {
	t.Helper()
	s, err := New(Config{Heartbeat: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	s.nowMS = nowMS
	c := &recordConn{}
	return s, c, s.openConn(c)
}

// admitNow takes an opened connection through the admission FIFO at once, with a token
// that expires at expiresMS (0 = never).
func admitNow(s *Server, sc *sseConn, expiresMS int64) {
	s.enqueue(sc, &subRequest{name: "s"}, nil, expiresMS)
	if s.admitQ.pop() != sc {
		panic("admission FIFO lost the connection")
	}
	s.admit(sc)
}

// Each state's time rule, on the loop clock (nowMS): the head deadline, the pending
// timeout, the heartbeat and the token's exp.
func TestSweepConnsTimeRules(t *testing.T) {
	const t0 = 1_000_000

	t.Run("head", func(t *testing.T) {
		s, c, sc := openAt(t, t0)
		s.nowMS = t0 + headTimeoutMS - 1
		s.sweepConns()
		assert.Equal(t, stateHead, sc.state)
		s.nowMS = t0 + headTimeoutMS
		s.sweepConns()
		assert.Equal(t, stateClosing, sc.state)
		assert.True(t, c.closed)
		assert.Empty(t, c.written.String(), "a connection that sent no head gets no answer")
	})

	t.Run("pending", func(t *testing.T) {
		s, c, sc := openAt(t, t0)
		s.nowMS = t0 + 5_000 // the head took a while: the pending time counts from admission
		s.listenUp = true
		admitNow(s, sc, 0)
		s.nowMS += pendingTimeoutMS
		s.sweepConns()
		assert.Equal(t, statePending, sc.state)
		s.nowMS++
		s.sweepConns()
		assert.Equal(t, stateClosing, sc.state)
		assert.True(t, c.closed)
		assert.True(t, strings.HasPrefix(c.written.String(), "HTTP/1.1 200 "), "shed with 200: %q", c.written.String())
		assert.Contains(t, c.written.String(), "\nretry: ")
		assert.Contains(t, c.written.String(), "\n:over capacity\n")
	})

	t.Run("verifying", func(t *testing.T) {
		s, c, sc := openAt(t, t0)
		s.verify(sc, &subRequest{name: "s"})
		s.nowMS = t0 + verifyTimeoutMS
		s.sweepConns()
		assert.Equal(t, stateVerifying, sc.state)
		s.nowMS++
		s.sweepConns()
		assert.Equal(t, stateClosing, sc.state)
		assert.Contains(t, c.written.String(), "\n:over capacity\n")
	})

	t.Run("pending while the database is unavailable", func(t *testing.T) {
		s, c, sc := openAt(t, t0)
		s.listenUp = true
		admitNow(s, sc, 0)
		s.listenUp, s.listenDownSinceMS = false, t0 // the LISTEN session went down
		s.nowMS = t0 + dbUnavailableAfterMS - 1
		s.sweepConns()
		assert.Equal(t, statePending, sc.state, "a short outage costs nobody their connection")
		s.nowMS++
		s.sweepConns()
		assert.Equal(t, stateClosing, sc.state)
		assert.Contains(t, c.written.String(), "\n:database unavailable\n")
	})

	t.Run("heartbeat and token expiry", func(t *testing.T) {
		s, c, sc := openAt(t, t0)
		admitNow(s, sc, t0+5_000)
		s.respond(sc, stateLive)
		assert.Equal(t, int64(t0+5_000), sc.expiresMS)
		head := c.written.Len()
		s.nowMS = t0 + s.cfg.Heartbeat.Milliseconds() - 1
		s.sweepConns()
		assert.Equal(t, head, c.written.Len(), "no heartbeat before --heartbeat")
		s.nowMS++
		s.sweepConns()
		assert.Equal(t, ":\n", c.written.String()[head:], "a comment line after --heartbeat without writes")
		s.nowMS = t0 + 5_000 - 1
		s.sweepConns()
		assert.Equal(t, stateLive, sc.state)
		s.nowMS++
		s.sweepConns()
		assert.Equal(t, stateClosing, sc.state, "closed once the token's exp passes")
		assert.True(t, c.closed)
		tail := strings.TrimLeft(c.written.String()[head:], ":\n") // heartbeats meanwhile
		assert.True(t, strings.HasPrefix(tail, "retry: ") && strings.HasSuffix(tail, "\n\n"), "a retry field last: %q", tail)
	})
}

// The state machine's rule: only sseconn.go assigns sseConn.state (through its transition
// helpers), so a new state or lifetime rule is a change to that one file.
func TestStateAssignedOnlyInSSEConn(t *testing.T) {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := gotoken.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") || name == "sseconn.go" {
			continue
		}
		src, err := os.ReadFile(name)
		require.NoError(t, err)
		f, err := parser.ParseFile(fset, name, src, 0)
		require.NoError(t, err)
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.AssignStmt:
				for _, lhs := range n.Lhs {
					if sel, ok := lhs.(*ast.SelectorExpr); ok && sel.Sel.Name == "state" {
						t.Errorf("%s: assigns .state outside sseconn.go; use a transition helper", fset.Position(n.Pos()))
					}
				}
			case *ast.CompositeLit:
				if id, ok := n.Type.(*ast.Ident); ok && id.Name == "sseConn" {
					for _, el := range n.Elts {
						if kv, ok := el.(*ast.KeyValueExpr); ok {
							if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "state" {
								t.Errorf("%s: sets state in an sseConn literal outside sseconn.go", fset.Position(n.Pos()))
							}
						}
					}
				}
			}
			return true
		})
	}
}
