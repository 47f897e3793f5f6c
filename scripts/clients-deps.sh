#!/usr/bin/env bash
# Installs what the hub clients' test suites (clients/) need, idempotently:
#   - Debian's ruby and ruby-pg (the Ruby client's tests open the worker's own session with the
#     pg gem), and python3-psycopg (the Python client's tests, with Debian's /usr/bin/python3),
#     only if missing; the clients themselves need nothing but their standard libraries;
#   - the npm dev dependencies pinned by clients/node/package-lock.json and
#     clients/js/package-lock.json (`npm ci`: npm pg for the Node client's tests, TypeScript for
#     both packages' declarations), only when node_modules is missing or older than the lock file.
# Run by clients/clients_test.go once per run (TestMain); safe to run by hand or from CI.
set -euo pipefail

log() { echo "clients-deps.sh: $*" >&2; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

missing=()
[ -x /usr/bin/ruby ] || missing+=(ruby)
/usr/bin/ruby -e 'require "pg"; require "minitest"' >/dev/null 2>&1 || missing+=(ruby-pg ruby-minitest)
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import psycopg' >/dev/null 2>&1 || missing+=(python3-psycopg)
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)

if [ ${#missing[@]} -gt 0 ]; then
	log "installing ${missing[*]}"
	if [ "$(id -u)" != 0 ]; then
		log "need root to apt-get install ${missing[*]} (or install them yourself)"
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	# One `apt-get update` when the package lists are missing or do not know a package.
	if ! apt-cache show "${missing[@]}" >/dev/null 2>&1; then
		apt-get update -qq >&2
	fi
	if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; then
		# A stale list can point at versions the mirror no longer has: refresh once, retry.
		apt-get update -qq >&2
		apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
	fi
fi

/usr/bin/ruby -e 'require "pg"; require "minitest"' || { log "ruby, ruby-pg or minitest missing after installing"; exit 1; }
/usr/bin/python3 -c 'import psycopg' || { log "python3-psycopg missing after installing"; exit 1; }
if ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)'; then
	log "Node.js $(node --version) is too old: clients/node and clients/js need Node.js >= 20"
	exit 1
fi

# Node packages, exactly as locked.
for pkg in node js; do
	dir="$root/clients/$pkg"
	stamp="$dir/node_modules/.clients-deps-stamp"
	if [ ! -f "$stamp" ] || [ "$dir/package-lock.json" -nt "$stamp" ]; then
		log "npm ci in clients/$pkg"
		(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2)
		touch "$stamp"
	fi
done
