#!/usr/bin/env bash
# Instructions per transaction of one publishing shape, counted by callgrind in a
# single-user PostgreSQL backend: a figure the machine's load does not move (the CPU-time
# benchmarks drift ±20 % or more on a shared host), for comparing shapes of publish_many.
#
#   bench/pgir/ir.sh MODE SIZE STREAMS [SETUP.sql]       (from the repository root)
#
# MODE, SIZE, STREAMS and SETUP as in bench/pgir/gen.py (e.g. `pm 30 one`, or
# `runs 30 one bench/pgir/publish_runs.sql`). It makes a throwaway cluster (initdb, the
# current schema from `go run ./cmd/pgsse migrate --print`), runs `postgres --single` under
# callgrind with 20 and then 60 transactions, and prints (Ir(60) − Ir(20)) / 40: start-up,
# planning and the first executions cancel out. The input is text (EXECUTE with array
# literals), so every mode also pays the literal's parse (mode `base` measures it: ≈ 20 k
# instructions per event); compare modes, not absolute figures. Instructions leave out
# the kernel (send/recv) and cache misses. Needs valgrind. Each run checks that every
# transaction returned a non-NULL result; groups much larger than 30 events came back NULL
# in single-user mode (not understood), and the check refuses them.
set -euo pipefail
mode=${1:?usage: ir.sh MODE SIZE STREAMS [SETUP.sql]} size=${2:?} streams=${3:?} setup=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
bin=$("$here/../../scripts/pg.sh" bindir)
command -v valgrind >/dev/null || { echo "ir.sh: valgrind is needed" >&2; exit 1; }
dir=$(mktemp -d /tmp/pgsse-ir.XXXXXX)
trap '[ -n "${KEEP:-}" ] && echo "kept $dir" >&2 || rm -rf "$dir"' EXIT
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[ "$(id -u)" = 0 ] && chown postgres: "$dir" && chmod 0755 "$dir"
as_pg "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C -N >"$dir/initdb.log"
printf 'fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nlisten_addresses = %s\nunix_socket_directories = %s\n' "''" "'$dir'" >>"$dir/data/postgresql.conf"
(cd "$here/../.." && go run ./cmd/pgsse migrate --print) >"$dir/schema.sql"
as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -o "-p 5499" start >/dev/null
psql -X -q -v ON_ERROR_STOP=1 "host=$dir port=5499 user=postgres dbname=postgres" -f "$dir/schema.sql" >/dev/null
as_pg "$bin/pg_ctl" -D "$dir/data" -w stop >/dev/null
[ -n "$setup" ] && cp "$setup" "$dir/setup.sql"
ir=()
for n in 20 60; do
	python3 "$here/gen.py" "$mode" "$size" "$n" "$streams" ${setup:+"$dir/setup.sql"} >"$dir/in.sql"
	[ "$(id -u)" = 0 ] && chown postgres "$dir/in.sql"
	as_pg valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" \
		"$bin/postgres" --single -j -D "$dir/data" postgres <"$dir/in.sql" >"$dir/out.log" 2>"$dir/valgrind.log"
	if grep -q ERROR "$dir/out.log"; then grep -m3 ERROR "$dir/out.log" >&2; exit 1; fi
	# Single-user mode prints a NULL column not at all: column 2 must appear in every row.
	got=$(grep -c '^	 2: [^	]* = ' "$dir/out.log" || true)
	[ "$got" = "$n" ] || { echo "ir.sh: $got of $n transactions returned a result" >&2; exit 1; }
	ir+=("$(awk '/^totals:/ {print $2}' "$dir/cg.out")")
done
echo "$mode $size $streams${setup:+ $(basename "$setup")}: $(( (ir[1] - ir[0]) / 40 )) instructions per transaction"
