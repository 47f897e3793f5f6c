//go:build linux

package bench

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// deployClientEnv makes the test binary a client process of scenario 17: "ADDR N SOURCES".
const deployClientEnv = "PGSSE_BENCH_DEPLOY_CLIENT"

func deployClientFromEnv(spec string) int {
	var addr string
	var n, sources int
	if _, err := fmt.Sscan(spec, &addr, &n, &sources); err != nil {
		fmt.Fprintln(os.Stderr, deployClientEnv+":", err)
		return 2
	}
	ap, err := netip.ParseAddrPort(addr)
	if err == nil {
		err = DeployClientMain(ap, "/streams/"+deployStream, n, sources)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "deploy client:", err)
		return 1
	}
	return 0
}

func deployClients(addr netip.AddrPort, n, sources int) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %d", deployClientEnv, addr, n, sources))
	return cmd
}

// Scenario 17 at small scale, the subscribers in two client processes: SIGTERM + restart
// closes every connection and every subscriber reconnects with Last-Event-ID; SIGUSR2 closes
// none; every subscriber has every event once, in order, across both — the figures the full
// run reports, and the checks it makes.
func TestDeployRestartAgainstHandoff(t *testing.T) { testDeploy(t, false) }

// The same with --deploy-handoff-first: (b) from the steady window, then (a) against the
// successor, which is no child of this process.
func TestDeployHandoffFirst(t *testing.T) { testDeploy(t, true) }

func testDeploy(t *testing.T, handoffFirst bool) {
	pg := servers(t)[0]
	env := &Env{Cluster: UseCluster(pgtest.URL(t)), Dir: t.TempDir(), Logf: t.Logf}
	p := Small()
	dp := p.Deploy
	dp.Conns, dp.ClientConns = 120, 70
	dp.Window, dp.Settle = time.Second, 500*time.Millisecond
	dp.HandoffFirst = handoffFirst
	rs, err := Deploy(context.Background(), env, pg, dp, p, deployClients)
	require.NoError(t, err)
	require.Len(t, rs, 4)
	steady, restart, handoff, whole := rs[0], rs[1], rs[2], rs[3]
	for _, r := range rs {
		assert.Equal(t, float64(dp.Conns), r.Get("subscribers"), r.Target)
	}
	assert.Zero(t, steady.Get("connections closed by the server (counted at the clients)"))
	assert.Equal(t, float64(dp.Conns), restart.Get("connections closed by the server (counted at the clients)"))
	assert.Equal(t, float64(dp.Conns), restart.Get("reconnects (connections reopened)"))
	assert.Positive(t, restart.Get("events caught up by reopened connections"), "the restart's gap is caught up from Last-Event-ID")
	assert.GreaterOrEqual(t, restart.Get("delivery pause p50 (longest wait per subscriber)"), 2000.0, "the drain's retry: is 2–10 s")
	assert.Zero(t, handoff.Get("connections closed by the server (counted at the clients)"))
	assert.Zero(t, handoff.Get("reconnects (connections reopened)"))
	assert.Equal(t, float64(dp.Conns), handoff.Get("connections handed over (its log line)"))
	assert.Positive(t, handoff.Get("delivery pause p50 (longest wait per subscriber)"))
	assert.Positive(t, handoff.Get("time from the signal until the old process exited"))
	assert.Positive(t, handoff.Get("server RSS"))
	if handoffFirst {
		assert.Len(t, handoff.Notes, 1, "(b) ran first; the successor runs the installed binary")
	} else {
		assert.Empty(t, handoff.Notes, "the successor runs the installed binary")
		assert.Positive(t, restart.Get("time from the signal until a 2s window without catch-up reads or lagging subscribers"), "(b) waited for steady state")
	}
	assert.Positive(t, handoff.Get("the move's move (its log line: handoff: connections moved)"))
	assert.Equal(t, float64(dp.Conns), whole.Get("subscribers reconnected at least once"))
	assert.Zero(t, whole.Get("deliveries missing (subscribers × events − deliveries)"))
	assert.Zero(t, whole.Get("sequence numbers skipped (gaps)"))
	assert.Zero(t, whole.Get("sequence numbers repeated or out of order"))
	assert.Zero(t, whole.Get("subscribers not at the last event"))
	assert.Positive(t, whole.Get("events published"))
}
