#!/usr/bin/env bash
# Installs what the end-to-end suite (e2e/) needs, idempotently:
#   - Debian's chromium (+ chromium-driver), nginx-light, caddy, prometheus (for
#     prometheus and promtool: the rules and dashboard of deploy/) and ruby, only if missing;
#     installing nginx or caddy must not start their system services, so a policy-rc.d denies service starts while
#     apt runs;
#   - the npm packages pinned by e2e/js/package-lock.json (`npm ci`), only when
#     node_modules is missing or older than the lock file. Never a browser download:
#     playwright-core drives /usr/bin/chromium.
# Run by the e2e Go tests once per run (TestMain); safe to run by hand or from CI.
set -euo pipefail

log() { echo "e2e-deps.sh: $*" >&2; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
js="$root/e2e/js"

missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
command -v caddy >/dev/null 2>&1 || missing+=(caddy)
command -v curl >/dev/null 2>&1 || missing+=(curl)
{ [ -x /usr/bin/prometheus ] && [ -x /usr/bin/promtool ]; } || missing+=(prometheus)
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
command -v ruby >/dev/null 2>&1 || missing+=(ruby) # the token-minting snippet of docs/http.md

if [ ${#missing[@]} -gt 0 ]; then
	log "installing ${missing[*]}"
	if [ "$(id -u)" != 0 ]; then
		log "need root to apt-get install ${missing[*]} (or install them yourself)"
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	# Package scripts must not start services (nginx) on this machine. Keep an existing
	# policy-rc.d (someone else's) as it is.
	policy=/usr/sbin/policy-rc.d
	ours=0
	if [ ! -e "$policy" ]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
		ours=1
	fi
	cleanup() { if [ "$ours" = 1 ]; then rm -f "$policy"; fi; }
	trap cleanup EXIT
	# One `apt-get update` when the package lists are missing or do not know a package.
	if ! apt-cache show "${missing[@]}" >/dev/null 2>&1; then
		apt-get update -qq >&2
	fi
	if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; then
		# A stale list can point at versions the mirror no longer has: refresh once, retry.
		apt-get update -qq >&2
		apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
	fi
	cleanup
	trap - EXIT
fi

[ -x /usr/bin/chromium ] || { log "chromium is not at /usr/bin/chromium after installing"; exit 1; }
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || { log "nginx not found after installing"; exit 1; }
command -v caddy >/dev/null 2>&1 || { log "caddy not found after installing"; exit 1; }
{ [ -x /usr/bin/prometheus ] && [ -x /usr/bin/promtool ]; } || { log "prometheus or promtool not in /usr/bin after installing"; exit 1; }
command -v ruby >/dev/null 2>&1 || { log "ruby not found after installing"; exit 1; }

# eventsource v4 and playwright-core 1.65 need Node.js >= 20 (the machine's is 20;
# Debian 12's own nodejs is 18).
if ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)'; then
	log "Node.js $(node --version) is too old: e2e/js needs Node.js >= 20"
	exit 1
fi

# Node packages, exactly as locked.
stamp="$js/node_modules/.e2e-deps-stamp"
if [ ! -f "$stamp" ] || [ "$js/package-lock.json" -nt "$stamp" ]; then
	log "npm ci in e2e/js"
	(cd "$js" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error >&2)
	touch "$stamp"
fi
