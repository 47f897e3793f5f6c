#!/usr/bin/env bash
# Prints the -ldflags that stamp the version into pgsse (used by `make build`, `make release`
# and the Dockerfile): the version from `git describe --always --dirty`, the full commit
# (+dirty when the work tree has changes) and the commit's date. Outside a git checkout it
# prints nothing, and `pgsse version` falls back to what the Go toolchain stamped.
# Static: -s -w are not used, so stack traces keep their symbols.
set -euo pipefail
cd "$(dirname "$0")/.."
git rev-parse --git-dir >/dev/null 2>&1 || exit 0
version=$(git describe --always --dirty --tags 2>/dev/null)
commit=$(git rev-parse HEAD)
if ! git diff --quiet HEAD -- 2>/dev/null; then commit="$commit+dirty"; fi
when=$(git log -1 --format=%cI HEAD | sed 's/+00:00$/Z/')
echo "-X main.version=$version -X main.commit=$commit -X main.buildTime=$when"
