//go:build linux

package auth

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// readNice reads a thread's nice value from /proc/self/task/TID/stat (field 19; the fields
// are counted after the command name, which is in parentheses and may hold spaces).
func readNice(tid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/stat", tid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 19-2 {
		return 0, fmt.Errorf("short stat %q", s)
	}
	return strconv.Atoi(fields[19-3])
}

func threadNice(t *testing.T, tid int) int {
	t.Helper()
	n, err := readNice(tid)
	require.NoError(t, err)
	return n
}

func threadAlive(tid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", tid))
	return err == nil
}

// With Nice, every verification runs on a thread of the pool's own at the lowered priority —
// never on the caller's thread, and no other goroutine ever runs on those threads: they end
// with the pool. The pool brings a P (GOMAXPROCS) per worker and gives them back on Close;
// Procs does not count them. Without Nice the workers run at the process's priority.
func TestPoolNiceWorkers(t *testing.T) {
	runtime.LockOSThread() // this goroutine's thread is the caller's, for comparison
	defer runtime.UnlockOSThread()
	self := unix.Gettid()
	base := threadNice(t, self)
	for _, tc := range []struct {
		name string
		nice int
		want int // the workers' nice value
	}{
		{"nice 19", 19, 19},
		{"nice 5", 5, min(base+5, 19)},
		{"not lowered", 0, base},
	} {
		t.Run(tc.name, func(t *testing.T) {
			procs := runtime.GOMAXPROCS(0)
			priorityErr := make(chan error, 1)
			p := NewPool(hsVerifier(t), PoolConfig{Workers: 2, Nice: tc.nice, CacheEntries: -1, FailureEntries: -1, StarveAfter: time.Hour, // no rescue: every job on a lowered thread
				OnPriorityError: func(err error) { priorityErr <- err }})
			closed := false
			defer func() {
				if !closed {
					p.Close()
				}
			}()
			lowered := tc.nice > 0
			if lowered {
				assert.Equal(t, procs+2, runtime.GOMAXPROCS(0), "a P per lowered worker")
			} else {
				assert.Equal(t, procs, runtime.GOMAXPROCS(0))
			}
			assert.Equal(t, procs, Procs(), "Procs leaves the workers' Ps out")

			type seen struct {
				tid, nice int
				err       error
			}
			ch := make(chan seen, 64)
			for i := range 64 {
				tok := hsToken(t, jwt.MapClaims{"sub": "user-" + strconv.Itoa(i), "exp": t0.Add(time.Hour).Unix()})
				require.True(t, p.Submit(tok, t0, func(_ *Claims, err error) {
					assert.NoError(t, err)
					// done runs on the worker that verified the token, on its thread.
					tid := unix.Gettid()
					n, err := readNice(tid)
					ch <- seen{tid, n, err}
				}))
			}
			tids := map[int]bool{}
			for range 64 {
				s := <-ch
				require.NoError(t, s.err)
				assert.NotEqual(t, self, s.tid, "verified on the caller's thread")
				assert.Equal(t, tc.want, s.nice, "thread %d's nice value", s.tid)
				tids[s.tid] = true
			}
			select {
			case err := <-priorityErr:
				t.Errorf("lowering the priority: %v", err)
			default:
			}
			assert.Equal(t, base, threadNice(t, self), "the caller's thread keeps its priority")
			if !lowered {
				return
			}
			assert.LessOrEqual(t, len(tids), 2, "one thread per worker: %v", tids)
			p.Close()
			closed = true
			assert.Equal(t, procs, runtime.GOMAXPROCS(0), "the Ps are given back")
			// A locked goroutine that returns ends its thread; nothing signals that, so look.
			require.Eventually(t, func() bool {
				for tid := range tids {
					if threadAlive(tid) {
						return false
					}
				}
				return true
			}, 10*time.Second, 5*time.Millisecond, "the lowered threads end with the pool")
		})
	}
}

// A worker that starts on the process's main thread leaves it at its priority and alive (the
// runtime could never end it) and works on a thread of its own instead. Another thread plays
// the main one here: the test goroutines never run on it.
func TestPoolNiceWorkerLeavesTheMainThread(t *testing.T) {
	type thread struct{ tid, nice int }
	played := make(chan thread, 1)
	var once sync.Once
	onMainThread = func() bool {
		main := false
		once.Do(func() {
			main = true
			n, _ := readNice(unix.Gettid())
			played <- thread{unix.Gettid(), n}
		})
		return main
	}
	defer func() { onMainThread = isMainThread }()
	p := NewPool(hsVerifier(t), PoolConfig{Workers: 1, Nice: 19, CacheEntries: -1, FailureEntries: -1})
	defer p.Close()
	playedBy := <-played
	main := playedBy.tid
	ch := make(chan int, 1)
	require.True(t, p.Submit(hsToken(t, jwt.MapClaims{"exp": t0.Add(time.Hour).Unix()}), t0, func(_ *Claims, err error) {
		assert.NoError(t, err)
		ch <- unix.Gettid()
	}))
	worker := <-ch
	assert.NotEqual(t, main, worker, "the worker moved off the main thread")
	n, err := readNice(worker)
	require.NoError(t, err)
	assert.Equal(t, 19, n, "the worker's thread")
	// Compared with what the thread playing the main one had when it was asked, not with the
	// process's real main thread: the worker's replacement may start there, since the test
	// holds the thread that plays it, not the real one.
	n, err = readNice(main)
	require.NoError(t, err, "the main thread is still there")
	assert.Equal(t, playedBy.nice, n, "the main thread keeps its priority")
}

// A pool whose lowered workers take no job for StarveAfter (here: its one worker is stuck in a
// done function, as a thread the kernel keeps off the CPU would be) verifies the jobs waiting
// behind at the process's priority, on another thread, and counts them in Stats.Rescued; once
// the queue is empty the rescue stops.
func TestPoolNiceStarvedJobsAreRescued(t *testing.T) {
	const starve = 50 * time.Millisecond
	// The process's priority, as an ordinary thread has it: this goroutine's (the main thread
	// may have been lowered by the test above, whose replacement worker can start there).
	runtime.LockOSThread()
	base, err := readNice(unix.Gettid())
	runtime.UnlockOSThread()
	require.NoError(t, err)
	p := NewPool(hsVerifier(t), PoolConfig{Workers: 1, Nice: 19, StarveAfter: starve, CacheEntries: -1, FailureEntries: -1})
	defer p.Close()
	tok := func(i int) []byte {
		return hsToken(t, jwt.MapClaims{"sub": "user-" + strconv.Itoa(i), "exp": t0.Add(time.Hour).Unix()})
	}
	stuck, release := make(chan int, 1), make(chan struct{})
	require.True(t, p.Submit(tok(0), t0, func(_ *Claims, err error) {
		assert.NoError(t, err)
		stuck <- unix.Gettid()
		<-release
	}))
	worker := <-stuck
	defer close(release)
	type seen struct{ tid, nice int }
	ch := make(chan seen, 2)
	done := func(_ *Claims, err error) {
		assert.NoError(t, err)
		n, err := readNice(unix.Gettid())
		assert.NoError(t, err)
		ch <- seen{unix.Gettid(), n}
	}
	require.True(t, p.Submit(tok(1), t0, done)) // waits: the worker is stuck
	// The rule is about time: no worker has taken a job for StarveAfter when the next comes.
	time.Sleep(2 * starve)
	require.True(t, p.Submit(tok(2), t0, done))
	for range 2 {
		select {
		case s := <-ch:
			assert.NotEqual(t, worker, s.tid, "verified by the rescue, not the stuck worker")
			assert.Equal(t, base, s.nice, "at the process's priority")
		case <-time.After(10 * time.Second):
			t.Fatal("the jobs behind a stuck worker were not rescued")
		}
	}
	assert.EqualValues(t, 2, p.Stats().Rescued.Load())
	assert.Zero(t, p.Queued())
}
