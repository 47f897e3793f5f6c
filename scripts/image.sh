#!/usr/bin/env bash
# `make image`: builds the container image localhost/pgsse:latest (and :VERSION) from the
# Dockerfile with podman, else buildah. If neither is installed and we are root, installs
# podman (and runc, see below) with apt-get.
#
# The build context is a temp dir holding a static pgsse (CGO_ENABLED=0, -trimpath, stamped
# by scripts/ldflags.sh), passwd/group entries for user pgsse (65532) and the host's CA
# certificates. No image is pulled (FROM scratch).
#
# Running it on a host like this one (no CAP_SYS_RESOURCE, hybrid cgroups, RLIMIT_NOFILE
# 20000) needs podman's runc runtime and explicit ulimits: crun answers
# "cgroups in hybrid mode not supported", and podman's default nofile (1048576) is over the
# hard limit:
#   podman --runtime runc run --rm --network host --ulimit nofile=20000:20000 \
#     --ulimit nproc=4096:4096 -e DATABASE_URL -e PGSSE_JWT_SECRET localhost/pgsse:latest
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "image.sh: $*" >&2; }

tool=""
if command -v podman >/dev/null 2>&1; then tool=podman
elif command -v buildah >/dev/null 2>&1; then tool=buildah
else
	[ "$(id -u)" = 0 ] || { log "need podman or buildah (apt-get install podman), or root to install it"; exit 1; }
	log "installing podman and runc with apt-get"
	export DEBIAN_FRONTEND=noninteractive
	apt-cache show podman >/dev/null 2>&1 || apt-get update -qq >&2
	apt-get install -y -qq --no-install-recommends podman runc uidmap >&2
	tool=podman
fi
if [ "$tool" = podman ] && ! command -v runc >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends runc >&2 || log "runc not installed: podman run may need it here"
fi

ctx=$(mktemp -d /tmp/pgsse-image.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
ldflags=$(scripts/ldflags.sh)
CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$ctx/pgsse" ./cmd/pgsse
echo 'pgsse:x:65532:65532:pgsse:/nonexistent:/sbin/nologin' >"$ctx/passwd"
echo 'pgsse:x:65532:' >"$ctx/group"
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
	cp /etc/ssl/certs/ca-certificates.crt "$ctx/"
else
	log "no /etc/ssl/certs/ca-certificates.crt on this host: the image has no CA certificates (sslmode=verify-full needs them)"
	: >"$ctx/ca-certificates.crt"
fi
version=$("$ctx/pgsse" version | awk '{print $2}')
tags=(-t localhost/pgsse:latest)
case "$version" in *[!A-Za-z0-9_.-]* | "") ;; *) tags+=(-t "localhost/pgsse:$version") ;; esac
case "$tool" in
podman) podman build -q "${tags[@]}" -f Dockerfile "$ctx" ;;
buildah) buildah bud -q "${tags[@]}" -f Dockerfile "$ctx" ;;
esac
log "built localhost/pgsse:latest ($version) with $tool"
