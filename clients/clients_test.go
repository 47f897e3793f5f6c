package clients

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/internal/testkit/servetest"
	"github.com/pgsse/pgsse/store"
)

// Set once by TestMain.
var repoRoot string

func TestMain(m *testing.M) {
	if err := setup(); err != nil {
		fmt.Fprintf(os.Stderr, "clients: %v\n", err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		servetest.RemoveBinaries()
		os.Exit(code)
	}))
}

func setup() error {
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	repoRoot = filepath.Dir(wd)
	deps := exec.Command(filepath.Join(repoRoot, "scripts", "clients-deps.sh"))
	deps.Dir = repoRoot
	if out, err := deps.CombinedOutput(); err != nil {
		return fmt.Errorf("installing the clients' test dependencies with scripts/clients-deps.sh failed: %v\n%s", err, out)
	}
	return nil
}

// suite is one language's own test runner, run as a subprocess.
type suite struct {
	name string
	dir  string   // relative to the repository
	argv []string // the runner
	// passed matches the runner's closing summary when every test ran and passed (no skips:
	// the live tests skip only without PGSSE_BIN and PGSSE_TEST_DSN, which this test sets).
	passed *regexp.Regexp
	ran    *regexp.Regexp // captures the number of tests run
}

var suites = []suite{
	{
		name:   "python",
		dir:    "clients/python/tests",
		argv:   []string{"/usr/bin/python3", "-m", "unittest", "-v"}, // Debian's, with python3-psycopg
		passed: regexp.MustCompile(`(?m)^OK$`),
		ran:    regexp.MustCompile(`(?m)^Ran (\d+) tests? in`),
	},
	{
		name:   "ruby",
		dir:    "clients/ruby",
		argv:   []string{"/usr/bin/ruby", "test/run.rb", "-v"}, // Debian's, with ruby-pg
		passed: regexp.MustCompile(`(?m)^\d+ runs, \d+ assertions, 0 failures, 0 errors, 0 skips$`),
		ran:    regexp.MustCompile(`(?m)^(\d+) runs, `),
	},
	{
		name:   "node",
		dir:    "clients/node",
		argv:   []string{"node", "--test", "--test-concurrency=1", "test/"},
		passed: regexp.MustCompile(`(?ms)^# fail 0$.*^# skipped 0$`),
		ran:    regexp.MustCompile(`(?m)^# tests (\d+)$`),
	},
	{
		// The browser client's unit tests (no browser: composite ids, routing, cursors, URLs,
		// tokens, the npm package, the declarations); e2e/ runs it in Chromium.
		name:   "js",
		dir:    "clients/js",
		argv:   []string{"node", "--test", "test/"},
		passed: regexp.MustCompile(`(?ms)^# fail 0$.*^# skipped 0$`),
		ran:    regexp.MustCompile(`(?m)^# tests (\d+)$`),
	},
}

// TestClients runs the Python, Ruby and Node hub clients' own test suites against a real
// `pgsse serve` (each test starts its own, with a hub socket) and a real PostgreSQL (a fresh
// migrated database per suite): ACK after LISTEN, 10,000 notifications in order, RESYNC after
// the hub's LISTEN session is terminated, failover when pgsse is killed or stops, the frame
// decoder against docs/hub-protocol.md's hex examples, and the README examples. A suite that
// fails fails this test with its output.
func TestClients(t *testing.T) {
	for _, s := range suites {
		t.Run(s.name, func(t *testing.T) {
			// Built once, without -race: these suites judge the clients; the server's own packages
			// (and e2e/) run it under the race detector.
			pgsseBin := servetest.Binary(t, false)
			dsn := pgtest.Migrated(t, store.Migrate)

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, s.argv[0], s.argv[1:]...)
			cmd.Dir = filepath.Join(repoRoot, s.dir)
			cmd.Env = append(os.Environ(), "PGSSE_BIN="+pgsseBin, "PGSSE_TEST_DSN="+dsn)
			var output bytes.Buffer
			cmd.Stdout, cmd.Stderr = &output, &output
			start := time.Now()
			err := cmd.Run()
			text := output.String()
			require.NoError(t, err, "%s (in %s) failed after %s:\n%s", strings.Join(s.argv, " "), s.dir, time.Since(start).Round(time.Millisecond), text)
			assert.Regexp(t, s.passed, text, "%s: not every test ran and passed:\n%s", s.name, text)
			m := s.ran.FindStringSubmatch(text)
			require.NotNil(t, m, "%s: no test count in the output:\n%s", s.name, text)
			t.Logf("%s: %s tests passed in %s", s.name, m[1], time.Since(start).Round(time.Millisecond))
			if os.Getenv("PGSSE_CLIENTS_VERBOSE") != "" {
				t.Logf("%s output:\n%s", s.name, text)
			}
		})
	}
}
