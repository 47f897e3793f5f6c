#!/usr/bin/env bash
# Throwaway PostgreSQL clusters for tests and `make run`.
#
#   scripts/pg.sh start DIR [--ssl]   create and start a cluster in DIR (must not exist
#                                     or be empty); prints its superuser DSN on stdout;
#                                     PGSH_PORT=N: on port N if it is free (make run keeps
#                                     its port across runs that way), else on a free one
#   scripts/pg.sh stop DIR            stop it and remove DIR
#   scripts/pg.sh with CMD [ARGS...]  run CMD with PGSSE_TEST_DATABASE_URL pointing at a
#                                     cluster: the one already named by that variable, or
#                                     a new one that is always torn down afterwards
#
# The cluster listens on 127.0.0.1 on a free port and on a Unix socket in DIR. Durability
# is off (fsync, synchronous_commit): it is for tests only. initdb refuses to run as root,
# so as root the server runs as the `postgres` OS user. PostgreSQL 15 binaries are found
# via pg_config or /usr/lib/postgresql/*/bin; if there are none, apt-get installs them.
set -euo pipefail

log() { echo "pg.sh: $*" >&2; }

find_bindir() {
	local d
	for d in "$(pg_config --bindir 2>/dev/null || true)" /usr/lib/postgresql/15/bin /usr/lib/postgresql/*/bin; do
		if [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
			echo "$d"
			return 0
		fi
	done
	return 1
}

bindir() {
	local d
	if d=$(find_bindir); then echo "$d"; return 0; fi
	log "no PostgreSQL server binaries found; installing the postgresql package"
	if [ "$(id -u)" != 0 ]; then log "need root to apt-get install postgresql"; exit 1; fi
	# Installing must not start Debian's own cluster: tests never rely on one.
	printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
	DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
	rm -f /usr/sbin/policy-rc.d
	find_bindir || { log "postgresql installed but initdb not found"; exit 1; }
}

# as_pg runs a command as the postgres OS user when we are root (initdb refuses root).
as_pg() {
	if [ "$(id -u)" = 0 ]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

free_port() {
	# The kernel's pick for an ephemeral port is free right now; PostgreSQL binding
	# it a moment later can still race, so start() retries on failure.
	python3 - <<'PY' 2>/dev/null || echo $((20000 + RANDOM % 20000))
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()
PY
}

# port_free PORT: nothing listens on 127.0.0.1:PORT (bound the way PostgreSQL binds it).
port_free() {
	python3 - "$1" <<'PY' 2>/dev/null
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except (OSError, ValueError):
    sys.exit(1)
PY
}

cmd_start() {
	local dir=${1:?usage: pg.sh start DIR [--ssl]} ssl=${2:-}
	local bin
	bin=$(bindir)
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	if [ "$(id -u)" = 0 ]; then
		chown postgres: "$dir"
		chmod 0755 "$dir"
		# runuser needs to reach DIR: every parent must be traversable.
		local p=$dir
		while [ "$p" != / ]; do p=$(dirname "$p"); chmod o+x "$p" 2>/dev/null || true; done
	fi
	as_pg "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C -N >"$dir/initdb.log" 2>&1 ||
		{ cat "$dir/initdb.log" >&2; exit 1; }
	cat >>"$dir/data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
max_connections = 400
shared_buffers = 128MB
fsync = off
synchronous_commit = off
full_page_writes = off
max_wal_size = 1GB
log_min_messages = warning
log_line_prefix = '%m [%p] %a '
EOF
	if [ "$ssl" = --ssl ]; then
		as_pg openssl req -new -x509 -days 2 -nodes -subj "/CN=localhost" \
			-keyout "$dir/data/server.key" -out "$dir/data/server.crt" >/dev/null 2>&1
		chmod 0600 "$dir/data/server.key"
		echo "ssl = on" >>"$dir/data/postgresql.conf"
	elif [ -n "$ssl" ]; then
		log "unknown option $ssl"; exit 2
	fi
	local port try
	for try in 1 2 3 4 5 6 7 8; do
		port=$(free_port)
		if [ "$try" = 1 ] && [ -n "${PGSH_PORT:-}" ] && port_free "$PGSH_PORT"; then
			port=$PGSH_PORT
		fi
		if as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 -o "-p $port" start >/dev/null 2>&1; then
			echo "$port" >"$dir/port"
			echo "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable" >"$dir/dsn"
			cat "$dir/dsn"
			return 0
		fi
		log "start on port $port failed (try $try); retrying"
	done
	tail -20 "$dir/server.log" >&2 || true
	exit 1
}

cmd_stop() {
	local dir=${1:?usage: pg.sh stop DIR}
	[ -d "$dir" ] || return 0
	if [ -f "$dir/data/postmaster.pid" ]; then
		as_pg "$(bindir)/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
	fi
	rm -rf "$dir"
}

cmd_with() {
	if [ -n "${PGSSE_TEST_DATABASE_URL:-}" ]; then
		exec "$@"
	fi
	# Global, not local: the EXIT trap runs after this function has returned.
	with_dir=$(mktemp -d /tmp/pgsse-pg.XXXXXX)
	trap 'cmd_stop "$with_dir"' EXIT
	trap 'exit 130' INT TERM HUP
	PGSSE_TEST_DATABASE_URL=$(cmd_start "$with_dir")
	export PGSSE_TEST_DATABASE_URL
	log "started throwaway PostgreSQL: $PGSSE_TEST_DATABASE_URL"
	"$@"
}

case "${1:-}" in
start) shift; cmd_start "$@" ;;
stop) shift; cmd_stop "$@" ;;
with) shift; cmd_with "$@" ;;
bindir) bindir ;;
*) echo "usage: $0 start DIR [--ssl] | stop DIR | with CMD [ARGS...] | bindir" >&2; exit 2 ;;
esac
