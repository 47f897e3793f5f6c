package testkit

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fatalTB records a Fatal and ends only the goroutine that called it.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestWaitFor(t *testing.T) {
	n := 0
	WaitFor(t, 5*time.Second, "the third call", func() bool { n++; return n == 3 })
	assert.Equal(t, 3, n)

	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		WaitFor(f, 30*time.Millisecond, "a thing that never happens", func() bool { return false })
	}()
	<-done
	assert.Equal(t, "timed out after 30ms waiting for a thing that never happens", f.msg)
}

func TestFreePortNeverTwice(t *testing.T) {
	seen := map[int]bool{}
	for range 50 {
		p := FreePort(t)
		assert.False(t, seen[p], "port %d handed out twice", p)
		assert.True(t, p >= 20000 && p < 32000, "below the ephemeral range: %d", p)
		seen[p] = true
	}
}

func TestSocketPathFits(t *testing.T) {
	p := SocketPath(t, "hub.sock")
	assert.Less(t, len(p), 108)
	assert.True(t, strings.HasSuffix(p, "/hub.sock"))
}
