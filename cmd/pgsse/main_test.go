package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgsse/pgsse/internal/testkit"
	"github.com/pgsse/pgsse/internal/testkit/servetest"
)

// binary is the pgsse command, built once for the package's tests (internal/testkit/servetest).
func binary(t testing.TB) string {
	t.Helper()
	return servetest.Binary(t, false)
}

// waitFor polls cond (internal/testkit: one polling helper, one argument order).
var waitFor = testkit.WaitFor

func TestMain(m *testing.M) {
	code := m.Run()
	servetest.RemoveBinaries()
	if code == 0 {
		// gnet's process-wide ants pool (started when engine is linked in) is not ours to stop.
		if err := goleak.Find(
			goleak.IgnoreAnyFunction("github.com/panjf2000/ants/v2.(*poolCommon).purgeStaleWorkers"),
			goleak.IgnoreAnyFunction("github.com/panjf2000/ants/v2.(*poolCommon).ticktock"),
			goleak.IgnoreAnyFunction("github.com/panjf2000/ants/v2.(*goWorker).run.func1"),
		); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// result is one run of the binary.
type result struct {
	stdout, stderr string
	code           int
}

// cleanEnv is the test process's environment without anything that configures pgsse
// or libpq, so each test states exactly what the command sees.
var cleanEnv = servetest.CleanEnv

// pgsse runs the binary with extra environment entries ("K=V") and arguments.
func pgsse(t *testing.T, env []string, args ...string) result {
	t.Helper()
	return pgsseIn(t, env, "", args...)
}

// pgsseIn is pgsse with stdin as the command's standard input.
func pgsseIn(t *testing.T, env []string, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), args...)
	cmd.Env = append(cleanEnv(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		require.True(t, ok, "run pgsse %v: %v", args, err)
		code = ee.ExitCode()
	}
	return result{stdout.String(), stderr.String(), code}
}

// requireOK asserts a zero exit with nothing on stderr.
func requireOK(t *testing.T, r result) {
	t.Helper()
	require.Equal(t, 0, r.code, "exit status; stderr: %s", r.stderr)
	assert.Empty(t, r.stderr)
}

// errorLine asserts a non-zero exit (want) with exactly one line on stderr and nothing on
// stdout, and returns the line without its "pgsse: " prefix.
func errorLine(t *testing.T, r result, want int) string {
	t.Helper()
	assert.Equal(t, want, r.code, "exit status; stderr: %q", r.stderr)
	assert.Empty(t, r.stdout)
	require.True(t, strings.HasSuffix(r.stderr, "\n"), "stderr %q", r.stderr)
	line := strings.TrimSuffix(r.stderr, "\n")
	require.NotContains(t, line, "\n", "more than one line on stderr")
	require.True(t, strings.HasPrefix(line, "pgsse: "), "stderr %q", line)
	return strings.TrimPrefix(line, "pgsse: ")
}

// shortTempDir is a temporary directory whose path is short enough for Unix sockets (107
// bytes), which t.TempDir()'s may not be; removed when the test ends.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pgsse")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
