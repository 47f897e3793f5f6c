package servetest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// ModuleRoot is the directory holding go.mod.
func ModuleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// Build compiles ./cmd/pgsse of the module at root into out, with the race detector when
// race is set.
func Build(ctx context.Context, root, out string, race bool) error {
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "./cmd/pgsse")...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s ./cmd/pgsse: %v\n%s", strings.Join(args, " "), err, b)
	}
	return nil
}

var builds struct {
	mu   sync.Mutex
	dir  string
	bins map[bool]*binary
}

type binary struct {
	once sync.Once
	path string
	err  error
}

// Binary is the pgsse command built for this test binary — once, however many tests ask —
// with the race detector when race is set (RaceEnabled follows the test binary's own
// -race). The test binary's TestMain must call RemoveBinaries when the tests are done.
func Binary(t testing.TB, race bool) string {
	t.Helper()
	builds.mu.Lock()
	if builds.bins == nil {
		builds.bins = map[bool]*binary{}
	}
	b := builds.bins[race]
	if b == nil {
		b = &binary{}
		builds.bins[race] = b
	}
	builds.mu.Unlock()
	b.once.Do(func() {
		builds.mu.Lock()
		if builds.dir == "" {
			builds.dir, b.err = os.MkdirTemp("", "pgsse-testkit-bin-")
		}
		dir := builds.dir
		builds.mu.Unlock()
		if b.err != nil {
			return
		}
		name := "pgsse"
		if race {
			name = "pgsse-race"
		}
		b.path = filepath.Join(dir, name)
		b.err = Build(context.Background(), ModuleRoot(), b.path, race)
	})
	if b.err != nil {
		t.Fatalf("servetest: %v", b.err)
	}
	return b.path
}

// RemoveBinaries removes what Binary built (from TestMain, after m.Run).
func RemoveBinaries() {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.dir != "" {
		os.RemoveAll(builds.dir)
		builds.dir = ""
		builds.bins = nil
	}
}

// CleanEnv is this process's environment without anything that configures pgsse or libpq,
// so that a test states exactly what the server sees (and no libpq default reaches a real
// server by accident).
func CleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PGSSE_") || strings.HasPrefix(k, "PG") || k == "DATABASE_URL" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "PGHOST=/nonexistent", "PGCONNECT_TIMEOUT=5")
}
