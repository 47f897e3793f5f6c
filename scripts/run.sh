#!/usr/bin/env bash
# `make run`: runs pgsse for real on this machine.
#
# With DATABASE_URL (or PGSSE_DATABASE_URL) set, it uses that database. Otherwise it starts
# a throwaway PostgreSQL in a temp dir (removed on exit). Then it applies the schema,
# starts `pgsse serve` with a development secret, the demo page, a hub socket and presence for
# the streams under $STREAM/, writes the variables a second terminal needs to bin/run.env
# (`source bin/run.env`), and prints what to try. Ctrl-C stops everything and removes bin/run.env.
#
# What a second terminal took from bin/run.env stays valid across runs where it can: the
# development secret is made once and kept in bin/dev-jwt-secret (mode 0600), so tokens minted
# before a restart still verify; the throwaway PostgreSQL takes the port of the last run if it
# is free; the hub socket is bin/hub.sock. What did change since the last run (bin/run.last)
# the banner names, with "source bin/run.env again"; and bin/run.env carries
# PGSSE_RUN_ENV and PGSSE_RUN_STAMP, with which a pgsse command that fails in a shell that
# sourced an older bin/run.env says to source it again.
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
lastfile=bin/run.last        # what the last run handed out, for the next one to compare
secretfile=bin/dev-jwt-secret # the development secret, made once
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
notify_pid=""
cleanup() {
	if [ -n "${serve_pid:-}" ]; then
		kill "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null || true
		# a followed successor is not our child: wait for it by polling (at most 30 s)
		for _ in $(seq 300); do kill -0 "$serve_pid" 2>/dev/null || break; sleep 0.1; done
	fi
	if [ -n "$notify_pid" ]; then kill "$notify_pid" 2>/dev/null && wait "$notify_pid" 2>/dev/null || true; fi
	if [ -n "$pgdir" ]; then scripts/pg.sh stop "$pgdir"; fi
	if [ -n "$wrote_env" ]; then rm -f "$envfile"; fi
	rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

last_db="" last_secret="" last_hub="" last_url="" last_admin="" last_pgport=""
if [ -f "$lastfile" ]; then
	# shellcheck disable=SC1090 # written by this script, below
	source "$lastfile"
fi

db=${PGSSE_DATABASE_URL:-${DATABASE_URL:-}}
pgport=""
if [ -z "$db" ]; then
	pgdir=$dir/pg
	db=$(PGSH_PORT=$last_pgport scripts/pg.sh start "$pgdir" 9>&-)
	pgport=$(cat "$pgdir/port")
	echo "run: no DATABASE_URL set: started a throwaway PostgreSQL ($db), removed on exit"
fi
export PGSSE_DATABASE_URL=$db

if [ -n "${PGSSE_JWT_SECRET:-}" ]; then
	secret=$PGSSE_JWT_SECRET
else
	if [ ! -s "$secretfile" ]; then
		(umask 077 && printf 'dev-%s\n' "$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')" >"$secretfile.new" &&
			mv "$secretfile.new" "$secretfile")
	fi
	chmod 0600 "$secretfile"
	secret=$(cat "$secretfile")
fi
export PGSSE_JWT_SECRET=$secret
# A stable path while it fits a Unix socket address (107 bytes), else one in the temp dir.
hub=$PWD/bin/hub.sock
[ ${#hub} -le 100 ] || hub=$dir/hub.sock

"$bin" migrate
token=$("$bin" token --stream "$stream" --stream "$stream/*" --channel jobs --ttl 24h)

# A NOTIFY_SOCKET of our own, as systemd gives a Type=notify service (sd_notify(3)): on a
# SIGUSR2 handoff the predecessor says its successor's pid there (MAINPID=) before it exits,
# and we follow that pid. A unix datagram socket, read by python3 (which this script needs
# already, above): bash, coreutils and curl cannot read one, and socat is not something a fresh
# machine has. The reader writes each MAINPID it is told to $mainpids, one a line, and
# exits with us (it checks that its parent is alive every second).
notify_sock=$dir/notify.sock
mainpids=$dir/mainpids
: >"$mainpids"
python3 - "$notify_sock" "$mainpids" 9>&- <<'PY' &
import os, signal, socket, sys
signal.signal(signal.SIGINT, signal.SIG_IGN) # Ctrl-C is for the script, which stops us
path, out = sys.argv[1], sys.argv[2]
parent = os.getppid()
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
s.settimeout(1.0)
with open(out, "a", buffering=1) as f:
    while os.getppid() == parent:
        try:
            msg = s.recv(4096).decode("utf-8", "replace")
        except socket.timeout:
            continue
        for line in msg.split("\n"):
            if line.startswith("MAINPID=") and line[8:].isdigit():
                f.write(line[8:] + "\n")
PY
notify_pid=$!
for i in $(seq 1 50); do
	[ -S "$notify_sock" ] && break
	kill -0 "$notify_pid" 2>/dev/null || die "could not make a NOTIFY_SOCKET for pgsse (python3 in $notify_sock)"
	[ "$i" -lt 50 ] || die "no NOTIFY_SOCKET for pgsse after 5 s ($notify_sock)"
	sleep 0.1
done

# Presence is kept for the streams under $stream/ (docs/http.md, Presence), so that it can be
# tried without restarting; the tour's own stream is not one of them.
presence="$stream/*"
NOTIFY_SOCKET=$notify_sock "$bin" serve --listen "$listen" --admin-listen "$admin" --hub-socket "$hub" --demo --presence-streams "$presence" --log-level info 9>&- &
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
secret_sum=$(printf '%s' "$secret" | sha256sum | cut -c1-16) # run.last holds no secret
stamp=$(printf '%s\n' "$db" "$secret_sum" "$hub" "$url" "http://$admin" | sha256sum | cut -c1-16)
{
	echo "# Written by make run (scripts/run.sh) for this run; removed when it stops."
	echo "export PGSSE_RUN_ENV=$(q "$PWD/$envfile")"
	echo "export PGSSE_RUN_STAMP=$stamp"
	echo "export DATABASE_URL=$(q "$db")"
	echo "export PGSSE_DATABASE_URL=$(q "$db")"
	echo "export PGSSE_JWT_SECRET=$(q "$secret")"
	echo "export PGSSE_HUB_SOCKET=$(q "$hub")"
	# for pgsse doctor (the README's tour): the descriptor and connection budgets count
	# presence's session, as this serve's do
	echo "export PGSSE_PRESENCE_STREAMS=$(q "$presence")"
	echo "export PGSSE_URL=$(q "$url")"
	echo "export PGSSE_ADMIN_URL=$(q "http://$admin")"
	echo "export TOKEN=$(q "$token")"
} >"$envfile"
wrote_env=1

# What changed since the last run, for the banner; then this run becomes the last one.
changed=()
if [ -f "$lastfile" ]; then
	if [ "$last_db" != "$db" ]; then
		why=""
		[ -n "$last_pgport" ] && [ -n "$pgport" ] && [ "$last_pgport" != "$pgport" ] && why=" (port $last_pgport was taken)"
		changed+=("DATABASE_URL$why")
	fi
	[ "$last_secret" = "$secret_sum" ] || changed+=("PGSSE_JWT_SECRET and TOKEN")
	[ "$last_hub" = "$hub" ] || changed+=("PGSSE_HUB_SOCKET")
	[ "$last_url" = "$url" ] || changed+=("PGSSE_URL")
	[ "$last_admin" = "http://$admin" ] || changed+=("PGSSE_ADMIN_URL")
	if [ ${#changed[@]} -gt 0 ]; then
		joined=$(printf '%s, ' "${changed[@]}")
		since_last="  Changed since the last make run: ${joined%, }.
  In a terminal that sourced $envfile before: source $envfile again.
"
	else
		since_last="  A terminal that sourced $envfile during the last make run keeps working: same
  secret (its TOKEN still verifies), DATABASE_URL, hub socket and URLs.
"
	fi
fi
{
	echo "# Written by make run (scripts/run.sh): what the last run handed out."
	echo "last_db=$(q "$db")"
	echo "last_secret=$secret_sum"
	echo "last_hub=$(q "$hub")"
	echo "last_url=$(q "$url")"
	echo "last_admin=$(q "http://$admin")"
	echo "last_pgport=$pgport"
} >"$lastfile"

cat <<EOF

pgsse is running: SSE on $url, admin on http://$admin, hub socket $hub.

  In another terminal, in this directory, take this run's variables
  (DATABASE_URL, TOKEN, PGSSE_URL, PGSSE_HUB_SOCKET, …):
    source $envfile
${since_last:-}
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

  Who is on $stream/room (presence is kept for $stream/*; docs/http.md#presence):
    curl -N "\$PGSSE_URL/streams/$stream/room?presence=1&token=\$(bin/pgsse token --stream '$stream/*' --subject user:7)"

  Demo page: $url/?stream=$stream&token=$token

Ctrl-C stops pgsse$( [ -n "$pgdir" ] && echo " and the throwaway PostgreSQL").
EOF
# If whoever started us goes away without signalling our process group (e.g. a
# supervisor that kills only `make`), stop too rather than leak the cluster.
parent=$PPID
# A SIGUSR2 handoff (docs/operations.md, Upgrading without disconnects) ends pgsse serve with
# status 0 once its successor serves on the same sockets: follow the successor — the pid the
# predecessor announced on our NOTIFY_SOCKET (MAINPID=) before it exited — instead of ending
# the run and stopping its PostgreSQL under it.
successor_of() {
	local pid
	for _ in $(seq 20); do # the announcement precedes the exit; give its reader a moment
		pid=$(tail -n 1 "$mainpids" 2>/dev/null || true)
		if [ -n "$pid" ] && [ "$pid" != "$1" ] && kill -0 "$pid" 2>/dev/null; then
			echo "$pid"
			return
		fi
		sleep 0.1
	done
}
followed=""
while :; do
	while kill -0 "$serve_pid" 2>/dev/null; do
		if ! kill -0 "$parent" 2>/dev/null; then exit 0; fi
		sleep 1
	done
	if [ -z "$followed" ]; then
		status=0
		wait "$serve_pid" || status=$?
	else
		status=0 # not our child: its status is unknown
	fi
	next=""
	if [ "$status" = 0 ]; then next=$(successor_of "$serve_pid"); fi
	if [ -z "$next" ]; then exit "$status"; fi
	echo "run: pgsse (pid $serve_pid) handed over to its successor (pid $next); following it"
	serve_pid=$next followed=1
done
