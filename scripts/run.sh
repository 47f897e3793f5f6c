#!/usr/bin/env bash
# `make run`: runs pgsse for real on this machine.
#
# With DATABASE_URL (or PGSSE_DATABASE_URL) set, it uses that database. Otherwise it starts
# a throwaway PostgreSQL in a temp dir (removed on exit). Then it applies the schema,
# starts `pgsse serve` with a development secret, the demo page and a hub socket in the temp
# dir, writes the variables a second terminal needs to bin/run.env (`source bin/run.env`),
# and prints what to try. Ctrl-C stops everything and removes bin/run.env.
#
# It refuses with one line, before starting anything, when its ports are taken (e.g. by a
# `make run` that is still running).
#
# Optional environment: PGSSE_LISTEN (default :8080), PGSSE_ADMIN_LISTEN
# (127.0.0.1:9090), PGSSE_JWT_SECRET (default: a random development secret),
# STREAM (default demo).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "run: $*" >&2; exit 1; }

bin=bin/pgsse
envfile=bin/run.env
listen=${PGSSE_LISTEN:-:8080}
admin=${PGSSE_ADMIN_LISTEN:-127.0.0.1:9090}
stream=${STREAM:-demo}

# port_free HOST:PORT: can we bind it (as pgsse will, with SO_REUSEADDR)? An empty host
# means every address, as pgsse's :8080 does.
port_free() {
	python3 - "$1" <<'PY'
import socket, sys
host, _, port = sys.argv[1].rpartition(":")
host = host.strip("[]")
family = socket.AF_INET6 if ":" in host else socket.AF_INET
s = socket.socket(family, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind((host, int(port)))
except OSError:
    sys.exit(1)
PY
}
# One make run per checkout at a time: the lock is held until this script exits, and is
# not passed on to PostgreSQL or pgsse (9>&- below).
mkdir -p bin
exec 9>bin/run.lock
flock -n 9 || die "another make run is running in this directory (its variables: $envfile); stop it first (Ctrl-C in its terminal)"
for a in "$listen" "$admin"; do
	port_free "$a" || die "$a is in use by another program; stop it, or set PGSSE_LISTEN and PGSSE_ADMIN_LISTEN to free addresses"
done

[ -x "$bin" ] || go build -ldflags "$(scripts/ldflags.sh)" -o "$bin" ./cmd/pgsse

dir=$(mktemp -d /tmp/pgsse-run.XXXXXX)
pgdir=""
wrote_env=""
cleanup() {
	if [ -n "${serve_pid:-}" ]; then kill "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null || true; fi
	if [ -n "$pgdir" ]; then scripts/pg.sh stop "$pgdir"; fi
	if [ -n "$wrote_env" ]; then rm -f "$envfile"; fi
	rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

db=${PGSSE_DATABASE_URL:-${DATABASE_URL:-}}
if [ -z "$db" ]; then
	pgdir=$dir/pg
	db=$(scripts/pg.sh start "$pgdir" 9>&-)
	echo "run: no DATABASE_URL set: started a throwaway PostgreSQL ($db), removed on exit"
fi
export PGSSE_DATABASE_URL=$db

secret=${PGSSE_JWT_SECRET:-dev-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')}
export PGSSE_JWT_SECRET=$secret
hub=$dir/hub.sock

"$bin" migrate
token=$("$bin" token --stream "$stream" --stream "$stream/*" --channel jobs --ttl 24h)

"$bin" serve --listen "$listen" --admin-listen "$admin" --hub-socket "$hub" --demo --log-level info 9>&- &
serve_pid=$!

# Ready when our process answers /readyz. Checking that it is still alive after the answer
# makes sure the answer was its own, not another server's on the same address.
for i in $(seq 1 150); do
	kill -0 "$serve_pid" 2>/dev/null || die "pgsse serve exited; see its log above"
	if curl -fsS "http://$admin/readyz" >/dev/null 2>&1; then
		kill -0 "$serve_pid" 2>/dev/null || die "pgsse serve exited; see its log above"
		break
	fi
	[ "$i" -lt 150 ] || die "pgsse serve not ready after 15 s; see its log above"
	sleep 0.1
done

port=${listen##*:}
host=${listen%:*}
case "$host" in "" | 0.0.0.0 | "[::]") host=localhost ;; esac
url=http://$host:$port
q() { printf '%q' "$1"; }
{
	echo "# Written by make run (scripts/run.sh) for this run; removed when it stops."
	echo "export DATABASE_URL=$(q "$db")"
	echo "export PGSSE_DATABASE_URL=$(q "$db")"
	echo "export PGSSE_JWT_SECRET=$(q "$secret")"
	echo "export PGSSE_HUB_SOCKET=$(q "$hub")"
	echo "export PGSSE_URL=$(q "$url")"
	echo "export PGSSE_ADMIN_URL=$(q "http://$admin")"
	echo "export TOKEN=$(q "$token")"
} >"$envfile"
wrote_env=1

cat <<EOF

pgsse is running: SSE on $url, admin on http://$admin, hub socket $hub.

  In another terminal, in this directory, take this run's variables
  (DATABASE_URL, TOKEN, PGSSE_URL, PGSSE_HUB_SOCKET, …):
    source $envfile

  Watch the stream:
    curl -N -H "Authorization: Bearer \$TOKEN" "\$PGSSE_URL/streams/$stream"
  Publish to it (from a third terminal, after source $envfile):
    bin/pgsse publish $stream 'hello from pgsse'
    psql "\$DATABASE_URL" -c "SELECT pgsse.publish('$stream', 'hello from SQL')"
  Replay everything kept so far:
    curl -N "\$PGSSE_URL/streams/$stream?since=0&token=\$TOKEN"
  A worker on the hub socket (Python, no pgsse code), then NOTIFY it:
    python3 docs/hub_worker.py "\$PGSSE_HUB_SOCKET" jobs
    psql "\$DATABASE_URL" -c "NOTIFY jobs, 'hello, worker'"

  Demo page: $url/?stream=$stream&token=$token

Ctrl-C stops pgsse$( [ -n "$pgdir" ] && echo " and the throwaway PostgreSQL").
EOF
# If whoever started us goes away without signalling our process group (e.g. a
# supervisor that kills only `make`), stop too rather than leak the cluster.
parent=$PPID
while kill -0 "$serve_pid" 2>/dev/null; do
	if ! kill -0 "$parent" 2>/dev/null; then exit 0; fi
	sleep 1
done
wait "$serve_pid"
