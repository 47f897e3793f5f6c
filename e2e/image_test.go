package e2e

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit"
)

// The container image (`make image`: Dockerfile FROM scratch) starts against a throwaway
// PostgreSQL, runs as the unprivileged user, names its commit, and serves events.
//
// On this kind of host the image runs with podman's runc runtime and explicit ulimits
// (scripts/image.sh says why: crun refuses hybrid cgroups, and podman's default nofile limit
// is above the host's hard limit without CAP_SYS_RESOURCE).
func TestImage_RunsAgainstPostgreSQL(t *testing.T) {
	build := exec.Command(filepath.Join(repoRoot, "scripts", "image.sh"))
	build.Dir = repoRoot
	out, err := build.CombinedOutput()
	if err != nil && strings.Contains(string(out), "need podman or buildah") {
		t.Skipf("no container runtime (and not root to install one): %s", out)
	}
	require.NoError(t, err, "make image:\n%s", out)
	podman, err := exec.LookPath("podman")
	if err != nil {
		t.Skip("the image was built with buildah; running it needs podman")
	}
	podmanCmd := func(args ...string) *exec.Cmd {
		if _, err := exec.LookPath("runc"); err == nil {
			args = append([]string{"--runtime", "runc"}, args...)
		}
		return exec.Command(podman, args...)
	}
	var lim syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	nofile := strconv.FormatUint(min(lim.Max, 1<<20), 10)
	runArgs := []string{"run", "--rm", "--network", "host", "--ulimit", "nofile=" + nofile + ":" + nofile, "--ulimit", "nproc=4096:4096"}

	user, err := podmanCmd("image", "inspect", "--format", "{{.Config.User}}", "localhost/pgsse:latest").Output()
	require.NoError(t, err)
	assert.Equal(t, "65532:65532", strings.TrimSpace(string(user)), "the image runs as an unprivileged user")
	ver, err := podmanCmd(append(runArgs, "localhost/pgsse:latest", "version")...).CombinedOutput()
	if err != nil && containerRuntimeRefused(string(ver)) {
		// The image was built and inspected above; this host's OCI runtime cannot start any
		// container (the message is the runtime's, not pgsse's). Say exactly why.
		t.Skipf("the container runtime cannot start containers on this host: %s", strings.TrimSpace(string(ver)))
	}
	require.NoError(t, err, "podman run … version: %s", ver)
	assert.Regexp(t, `^pgsse \S+ commit [0-9a-f]{40}`, string(ver), "stamped with the commit")

	dsn := newDatabase(t)
	port, admin := freePort(t), freePort(t)
	name := "pgsse-e2e-" + strconv.Itoa(os.Getpid())
	run := podmanCmd(append(runArgs, "--name", name, "-e", "DATABASE_URL="+dsn, "-e", "PGSSE_JWT_SECRET="+testSecret,
		"localhost/pgsse:latest", "serve", "--listen", "127.0.0.1:"+strconv.Itoa(port), "--admin-listen", "127.0.0.1:"+strconv.Itoa(admin))...)
	logs := &testkit.SyncBuffer{}
	run.Stdout, run.Stderr = logs, logs
	require.NoError(t, run.Start())
	exited := make(chan struct{})
	go func() { _ = run.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = podmanCmd("stop", "-t", "10", name).Run()
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = run.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("container output:\n%s", tail(logs.String(), 4000))
		}
	})

	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := client.Get("http://127.0.0.1:" + strconv.Itoa(admin) + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-exited:
			t.Fatalf("the container exited:\n%s", logs.String())
		default:
		}
		require.True(t, time.Now().Before(deadline), "the container is not ready after 60 s: %v", err)
		time.Sleep(100 * time.Millisecond) // polling: /readyz is the readiness signal
	}
	resp, items := openStream(t, "http://127.0.0.1:"+strconv.Itoa(port)+"/streams/box?token="+mintToken(t, "box"), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	nextItem(t, items, 10*time.Second, "the retry: line", func(it sseItem) bool { return it.Kind == "retry" })
	publishSQL(t, dsn, "box", "from a container")
	ev := nextItem(t, items, 10*time.Second, "event 1", isEvent("1"))
	assert.Equal(t, "from a container", ev.Data)

	stop := podmanCmd("stop", "-t", "10", name)
	out, err = stop.CombinedOutput()
	require.NoError(t, err, "podman stop: %s", out)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the container did not exit after podman stop")
	}
	assert.Contains(t, logs.String(), "pgsse serving")
}

// containerRuntimeRefused reports whether podman's output says the OCI runtime itself could
// not create the container (cgroups, rlimits, namespaces), before pgsse ran at all.
func containerRuntimeRefused(out string) bool {
	for _, m := range []string{"OCI runtime", "OCI permission denied", "crun:", "runc create failed", "cgroups in hybrid mode", "newuidmap", "cannot set up namespace"} {
		if strings.Contains(out, m) {
			return true
		}
	}
	return false
}
