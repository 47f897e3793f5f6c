package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/pgsse/pgsse/internal/testkit/servetest"
	"go.uber.org/goleak"
)

// Set once by TestMain, read-only afterwards.
var (
	repoRoot string // the module root (the parent of e2e/)
	jsDir    string // e2e/js, with node_modules installed
)

func TestMain(m *testing.M) {
	if err := setup(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
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
	jsDir = filepath.Join(wd, "js")

	// The clients: an install step, never a skip.
	start := time.Now()
	deps := exec.Command(filepath.Join(repoRoot, "scripts", "e2e-deps.sh"))
	deps.Dir = repoRoot
	deps.Env = append(os.Environ(), "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1")
	if out, err := deps.CombinedOutput(); err != nil {
		return fmt.Errorf("installing the e2e clients (chromium, nginx, npm packages) with scripts/e2e-deps.sh failed: %v\n%s", err, out)
	}
	if d := time.Since(start); d > 5*time.Second {
		fmt.Fprintf(os.Stderr, "e2e: installed the clients in %s\n", d.Round(time.Second))
	}

	return nil
}
