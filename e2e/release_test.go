package e2e

import (
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// What `go install github.com/pgsse/pgsse/cmd/pgsse@latest` needs holds: the module path, a
// main package there, no replace directives (go install …@version refuses modules with
// them). scripts/go-install-check.sh (run by make release) does the install itself.
func TestRelease_ModuleIsInstallable(t *testing.T) {
	out, err := exec.Command("go", "mod", "edit", "-json", filepath.Join(repoRoot, "go.mod")).Output()
	require.NoError(t, err)
	var mod struct {
		Module  struct{ Path string }
		Replace []any
	}
	require.NoError(t, json.Unmarshal(out, &mod))
	assert.Equal(t, "github.com/pgsse/pgsse", mod.Module.Path)
	assert.Empty(t, mod.Replace, "go install …@latest fails for a module with replace directives")
	list := exec.Command("go", "list", "-f", "{{.Name}} {{.ImportPath}}", "./cmd/pgsse")
	list.Dir = repoRoot
	out, err = list.Output()
	require.NoError(t, err)
	assert.Equal(t, "main github.com/pgsse/pgsse/cmd/pgsse", strings.TrimSpace(string(out)))
}

// `make release`'s script cross-builds static binaries with checksums. Built here for two
// platforms (each build is a full compile): a static linux/amd64 ELF without an interpreter,
// a darwin/arm64 Mach-O, and a SHA256SUMS that matches them.
func TestRelease_StaticBinariesWithChecksums(t *testing.T) {
	dir := copyRepo(t)
	cmd := exec.Command(filepath.Join(dir, "scripts", "release.sh"), "linux/amd64", "darwin/arm64")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "release.sh: %s", out)
	sums, err := os.ReadFile(filepath.Join(dir, "dist", "SHA256SUMS"))
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(sums)), "\n")
	require.Len(t, lines, 2, string(sums))
	for _, l := range lines {
		m := regexp.MustCompile(`^([0-9a-f]{64})  (pgsse-\S+-(linux-amd64|darwin-arm64))$`).FindStringSubmatch(l)
		require.NotNil(t, m, "SHA256SUMS line %q", l)
		data, err := os.ReadFile(filepath.Join(dir, "dist", m[2]))
		require.NoError(t, err)
		sum := sha256.Sum256(data)
		assert.Equal(t, m[1], hex.EncodeToString(sum[:]), m[2])
		switch m[3] {
		case "linux-amd64":
			f, err := elf.Open(filepath.Join(dir, "dist", m[2]))
			require.NoError(t, err)
			for _, p := range f.Progs {
				assert.NotEqual(t, elf.PT_INTERP, p.Type, "a static binary has no dynamic loader")
			}
			f.Close()
		case "darwin-arm64":
			assert.Equal(t, []byte{0xcf, 0xfa, 0xed, 0xfe}, data[:4], "a 64-bit Mach-O")
		}
	}
}
