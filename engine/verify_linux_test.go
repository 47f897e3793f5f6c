//go:build linux

package engine

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// threadNices is the nice value of every thread of this process, by thread id
// (/proc/self/task/TID/stat, field 19; fields counted after the command name, which is in
// parentheses and may hold spaces). A thread that ends while being read is left out.
func threadNices(t testing.TB) map[int]int {
	t.Helper()
	dirs, err := filepath.Glob("/proc/self/task/*")
	require.NoError(t, err)
	out := map[int]int{}
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "stat"))
		if err != nil {
			continue // ended meanwhile
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		require.GreaterOrEqual(t, len(f), 17, "stat of %s: %q", d, s)
		nice, err := strconv.Atoi(f[16])
		require.NoError(t, err)
		tid, err := strconv.Atoi(filepath.Base(d))
		require.NoError(t, err)
		out[tid] = nice
	}
	return out
}

// nicerThreads counts the threads at nice verifyNice.
func nicerThreads(t testing.TB) int {
	n := 0
	for _, nice := range threadNices(t) {
		if nice == verifyNice {
			n++
		}
	}
	return n
}

// Issue 24, the reconnect storm: a running server's token verifiers run on threads of their
// own at nice verifyNice (auth.PoolConfig.Nice), as many as verifyWorkers, and no other thread
// of the process is lowered — the loop keeps the process's priority, so during a storm the
// kernel runs it first. The threads end with the server. Not parallel: the parallel tests'
// servers (and their verifier threads) are paused while this one runs, so the count is this
// server's own.
func TestVerifierThreadsRunNicer(t *testing.T) {
	base := threadNices(t)[unix.Getpid()]
	require.Less(t, base, verifyNice, "the test process itself runs at nice %d", base)
	// A pool of an earlier test ends its threads after its goroutines return; nothing signals it.
	waitFor(t, 10*time.Second, "no verifier thread of an earlier test left", func() bool { return nicerThreads(t) == 0 })

	ts := startServer(t, "", nil)
	require.True(t, ts.tok.running(), "a token key is configured: the verifier pool runs")
	workers := verifyWorkers()
	waitFor(t, 10*time.Second, "the verifier threads lowered", func() bool { return nicerThreads(t) == workers })
	for tid, nice := range threadNices(t) {
		assert.True(t, nice == base || nice == verifyNice, "thread %d at nice %d (the process's %d, the verifiers' %d)", tid, nice, base, verifyNice)
	}

	// A token verified now (not cached) works on those threads: the subscription is answered.
	c := dial(t, ts.Addr().String(), "/streams/nice", bearerH(allStreams(t, "fresh")))
	require.Equal(t, 200, c.Status)

	ts.Stop(t)
	waitFor(t, 10*time.Second, "the verifier threads end with the server", func() bool { return nicerThreads(t) == 0 })
}
