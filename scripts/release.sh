#!/usr/bin/env bash
# `make release`: cross-builds static pgsse binaries (CGO_ENABLED=0, -trimpath, stamped by
# scripts/ldflags.sh) for each GOOS/GOARCH given into dist/, named
# pgsse-VERSION-GOOS-GOARCH, and writes dist/SHA256SUMS (`cd dist && sha256sum -c SHA256SUMS`).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: $0 GOOS/GOARCH..." >&2; exit 2; }
ldflags=$(scripts/ldflags.sh)
version=$(sed -n 's/.*-X main.version=\([^ ]*\).*/\1/p' <<<"$ldflags")
version=${version:-dev}
rm -rf dist
mkdir -p dist
for p in "$@"; do
	os=${p%/*} arch=${p#*/}
	out=dist/pgsse-$version-$os-$arch
	CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -ldflags "$ldflags" -o "$out" ./cmd/pgsse
	echo "release: $out" >&2
done
(cd dist && sha256sum pgsse-* >SHA256SUMS)
echo "release: dist/SHA256SUMS" >&2
