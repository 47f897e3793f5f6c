#!/usr/bin/env bash
# Shows that `go install github.com/pgsse/pgsse/cmd/pgsse@latest` works for a user: serves
# the committed tree (git archive HEAD) as a module version from a file:// GOPROXY, with the
# dependencies from this machine's module cache (no network), installs @latest into a temp
# GOBIN with a fresh module cache and the local toolchain, and runs `pgsse version`.
# `make go-install-check`; `make release` runs it too. Takes a minute or two: everything is
# compiled afresh, as on a user's machine.
set -euo pipefail
cd "$(dirname "$0")/.."
mod=$(go list -m)
[ "$mod" = github.com/pgsse/pgsse ] || { echo "go-install-check: module path is $mod" >&2; exit 1; }
if go mod edit -json | grep -q '"Replace": \[';  then
	echo "go-install-check: go.mod has replace directives: go install …@latest ignores them and fails" >&2
	exit 1
fi
deps=$(go env GOMODCACHE)/cache/download
work=$(mktemp -d /tmp/pgsse-goinstall.XXXXXX)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
version=v0.0.0-local
dir=$work/proxy/$mod/@v
mkdir -p "$dir" "$work/bin" "$work/modcache"
git archive --format=zip --prefix="$mod@$version/" -o "$dir/$version.zip" HEAD
git show HEAD:go.mod >"$dir/$version.mod"
printf '{"Version":"%s","Time":"%s"}\n' "$version" "$(git log -1 --format=%cI HEAD)" >"$dir/$version.info"
echo "$version" >"$dir/list"
# GOSUMDB=off: the local version is in no checksum database; the dependencies are still
# checked against the module's own go.sum.
GOTOOLCHAIN=local GOFLAGS=-modcacherw GOMODCACHE="$work/modcache" GOSUMDB=off CGO_ENABLED=0 \
	GOPROXY="file://$work/proxy,file://$deps" GOBIN="$work/bin" \
	go install "$mod/cmd/pgsse@latest"
"$work/bin/pgsse" version
echo "go-install-check: go install $mod/cmd/pgsse@latest works (served as $version from git archive HEAD)"
