//go:build linux

package bench

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// Scenario 15 at small scale (1,000 connections to --procs 2 from holder processes, then 400
// to one process): every connection held is open on the server at the end of the hold, and
// every event reached every one of them in order — the figures the full run reports.
func TestScaleHoldsAndDelivers(t *testing.T) {
	pg := servers(t)[0]
	env := &Env{Cluster: UseCluster(pgtest.URL(t)), Dir: t.TempDir(), Logf: t.Logf}
	p := Small()
	p.HolderConns = 600 // two holders for the 1,000: their answers are combined
	holder := func(addr netip.AddrPort, n, sources int) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %d", holdEnv, addr, n, sources))
		return cmd
	}
	rs, err := Scale(context.Background(), env, pg, p, p.Scale, holder)
	require.NoError(t, err)
	require.Len(t, rs, 2)
	for i, want := range []int{p.Scale.Conns, p.Scale.OneConns} {
		r := rs[i]
		assert.Equal(t, float64(want), r.Get("connections held"), r.Target)
		assert.Equal(t, float64(want), r.Get("connections open on the server at the end of the hold (pgsse_sse_connections)"), r.Target)
		assert.Zero(t, r.Get("connections the server closed"), r.Target)
		assert.Zero(t, r.Get("deliveries missing"), r.Target)
		assert.Zero(t, r.Get("sequence numbers skipped (gaps)"), r.Target)
		assert.Positive(t, r.Get("time to last subscriber p50"), r.Target)
		assert.Positive(t, r.Get("pgsse RSS per connection (every process)"), r.Target)
	}
	assert.Equal(t, 2.0, rs[0].Get("load processes holding them"))
	assert.Equal(t, float64(p.Scale.Procs), rs[0].Get("pgsse processes"))
}

// Scenario 14 at small scale: the floor (bench/gnetrelay) answers like an SSE server and holds
// every connection, as pgsse does with one stream and with 8; each is reported against it.
func TestFloorAgainstGnetRelay(t *testing.T) {
	pg := servers(t)[0]
	relay, err := BuildRelay(context.Background(), "..", t.TempDir())
	require.NoError(t, err)
	env := &Env{Cluster: UseCluster(pgtest.URL(t)), Dir: t.TempDir(), Logf: t.Logf}
	p := Small()
	p.IdleWindow = 0
	rs, err := Floor(context.Background(), env, pg, Target{Name: GnetRelay, Bin: relay}, p)
	require.NoError(t, err)
	require.Len(t, rs, 3)
	for _, r := range rs {
		assert.Equal(t, float64(p.Conns), r.Get("connections"), r.Target)
	}
	_, ok := rs[2].Lookup("÷ the floor's")
	assert.True(t, ok, "pgsse's figure against the floor's")
}
