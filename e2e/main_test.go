package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Set once by TestMain, read-only afterwards.
var (
	repoRoot  string // the module root (the parent of e2e/)
	pgsseBin  string // cmd/pgsse built for this run
	jsDir     string // e2e/js, with node_modules installed
	buildRoot string // temporary directory holding pgsseBin
)

func TestMain(m *testing.M) {
	if err := setup(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		if buildRoot != "" {
			os.RemoveAll(buildRoot)
		}
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		os.RemoveAll(buildRoot)
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

	buildRoot, err = os.MkdirTemp("", "pgsse-e2e-")
	if err != nil {
		return err
	}
	pgsseBin = filepath.Join(buildRoot, "pgsse")
	args := []string{"build", "-o", pgsseBin}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, "./cmd/pgsse")...)
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/pgsse: %v\n%s", err, out)
	}
	return nil
}
