package e2e

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 26: no example minted a token in a backend language. docs/http.md has one per language
// (Authorization, Minting tokens in your backend); each is run here exactly as the page has it
// — extracted from the Markdown, not copied — with the server's secret, and the token it printed
// subscribes to the stream it grants and receives an event published after.
func TestDocs_MintTokenSnippetsSubscribe(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	s := startServer(t, dsn, "127.0.0.1")
	python, err := exec.LookPath("python3")
	require.NoError(t, err)
	for _, lang := range []struct {
		info, file string
		run        func(path string) []string
	}{
		{"js mint-token", "mint.js", func(p string) []string { return []string{"node", p} }},
		{"python mint-token", "mint.py", func(p string) []string { return []string{python, p} }},
		{"ruby mint-token", "mint.rb", func(p string) []string { return []string{"ruby", p} }},
		// From the repository, whose go.mod has golang-jwt: the file's imports resolve there.
		{"go mint-token", "main.go", func(p string) []string { return []string{"go", "run", p} }},
	} {
		t.Run(lang.info, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), lang.file)
			require.NoError(t, os.WriteFile(path, []byte(docsBlock(t, "docs/http.md", lang.info)), 0o644))
			argv := lang.run(path)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
			cmd.Dir = repoRoot
			cmd.Env = append(userEnv(), "PGSSE_JWT_SECRET="+testSecret)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			require.NoError(t, cmd.Run(), "%v: %s", argv, stderr.String())
			token := strings.TrimSpace(stdout.String())
			require.Equal(t, 2, strings.Count(token, "."), "a JWT: %q", token)

			resp, items := openStream(t, s.URL("/streams/orders/42"), http.Header{"Authorization": {"Bearer " + token}})
			require.Equal(t, 200, resp.StatusCode)
			nextItem(t, items, 10*time.Second, "the stream's first retry:", func(it sseItem) bool { return it.Kind == "retry" })
			id := publishSQL(t, dsn, "orders/42", "for user 7 ("+lang.file+")")
			it := nextItem(t, items, 10*time.Second, "the published event", func(it sseItem) bool { return it.Kind == "event" })
			assert.Equal(t, "for user 7 ("+lang.file+")", it.Data)
			assert.Equal(t, strconv.FormatInt(id, 10), it.ID)

			// The grant is exactly the one stream.
			other, _ := openStream(t, s.URL("/streams/orders/43"), http.Header{"Authorization": {"Bearer " + token}})
			assert.Equal(t, 403, other.StatusCode)
		})
	}
}
