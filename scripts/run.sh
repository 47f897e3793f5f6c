#!/usr/bin/env bash
# `make run`: runs pgsse for real on this machine.
#
# With DATABASE_URL (or PGSSE_DATABASE_URL) set, it uses that database. Otherwise it starts
# a throwaway PostgreSQL in a temp dir (removed on exit). Then it applies the schema,
# starts `pgsse serve` with a development secret and the demo page, and prints commands
# to try it. Ctrl-C stops everything.
#
# Optional environment: PGSSE_LISTEN (default :8080), PGSSE_ADMIN_LISTEN
# (127.0.0.1:9090), PGSSE_JWT_SECRET (default: a random development secret),
# STREAM (default demo).
set -euo pipefail
cd "$(dirname "$0")/.."

bin=bin/pgsse
[ -x "$bin" ] || go build -o "$bin" ./cmd/pgsse

pgdir=""
cleanup() {
	[ -n "${serve_pid:-}" ] && kill "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null || true
	[ -n "$pgdir" ] && scripts/pg.sh stop "$pgdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

db=${PGSSE_DATABASE_URL:-${DATABASE_URL:-}}
if [ -z "$db" ]; then
	pgdir=$(mktemp -d /tmp/pgsse-run.XXXXXX)
	db=$(scripts/pg.sh start "$pgdir")
	echo "run: no DATABASE_URL set: started a throwaway PostgreSQL ($db), removed on exit"
fi
export PGSSE_DATABASE_URL=$db

listen=${PGSSE_LISTEN:-:8080}
admin=${PGSSE_ADMIN_LISTEN:-127.0.0.1:9090}
secret=${PGSSE_JWT_SECRET:-dev-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')}
export PGSSE_JWT_SECRET=$secret
stream=${STREAM:-demo}

"$bin" migrate
token=$("$bin" token --stream "$stream" --stream 'demo/*' --channel jobs --ttl 24h)
port=${listen##*:}

"$bin" serve --listen "$listen" --admin-listen "$admin" --demo --log-level info &
serve_pid=$!

# Wait until the server answers (or died).
for _ in $(seq 1 100); do
	if ! kill -0 "$serve_pid" 2>/dev/null; then
		echo "run: pgsse serve exited; see the log above" >&2
		exit 1
	fi
	if curl -fsS "http://$admin/readyz" >/dev/null 2>&1; then break; fi
	sleep 0.1
done

cat <<EOF

pgsse is running: SSE on $listen, admin on http://$admin (metrics, healthz, readyz).

  Watch the stream (in another terminal):
    TOKEN=$token
    curl -N -H "Authorization: Bearer \$TOKEN" http://localhost:$port/streams/$stream

  Publish to it:
    PGSSE_DATABASE_URL='$db' $bin publish $stream 'hello from pgsse'
    psql '$db' -c "SELECT pgsse.publish('$stream', 'hello from SQL')"

  Replay everything kept so far:
    curl -N "http://localhost:$port/streams/$stream?since=0&token=\$TOKEN"

  Demo page: http://localhost:$port/?stream=$stream&token=$token

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
