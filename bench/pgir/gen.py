#!/usr/bin/env python3
"""Writes the input of a `postgres --single -j` session for bench/pgir/ir.sh.

usage: gen.py MODE SIZE N STREAMS [SETUP.sql]

N transactions, each one group of SIZE events (the data of BenchmarkPublishManyBackendCPU),
over 100 streams: STREAMS "one" puts a group in one stream, "many" spreads it (neighbours
mostly distinct). MODE says what each transaction runs, as a prepared statement:

  base     SELECT txid_current(), $1 IS NULL, clock_timestamp(): the array's input and the
           transaction, no publishing (what every mode pays)
  pm       the Publisher's statement: SELECT txid_current(), m.ids, clock_timestamp()
           FROM pgsse.publish_many($1) AS m(ids)
  publish  one pgsse.publish of the group's first event
  runs     pgsse.publish_runs (a prototype, publish_runs.sql; pass it as SETUP.sql): the
           numbering done by the caller (per stream: first position and count; per event:
           stream index and rank), three statements
SETUP.sql runs first (whole-line -- comments are dropped, newlines folded).
"""
import sys

mode, size, n, streams = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
setup = sys.argv[5] if len(sys.argv) > 5 else None
data = '{"seq":12345,"t":1764584040123456789,"pad":"xxxxxxxxxxxxxxxxxxxxxxxx"}'
prepare = {
    "base": "PREPARE p(pgsse.message[]) AS SELECT txid_current(), $1 IS NULL, clock_timestamp()",
    "pm": "PREPARE p(pgsse.message[]) AS SELECT txid_current(), m.ids, clock_timestamp() FROM pgsse.publish_many($1) AS m(ids)",
    "publish": "PREPARE p(pgsse.message[]) AS SELECT txid_current(), pgsse.publish(($1[1]).stream, ($1[1]).data), clock_timestamp()",
    "runs": "PREPARE p(pgsse.message[], int[], int[], int[], int[]) AS SELECT txid_current(), pgsse.publish_runs($1, $2, $3, $4, $5), clock_timestamp()",
}[mode]
out = []
if setup:
    lines = [l for l in open(setup).read().splitlines() if not l.lstrip().startswith("--")]
    out.append(" ".join(lines).strip().rstrip(";"))
out.append(prepare)
ints = lambda xs: "'{%s}'" % ",".join(map(str, xs))
esc = data.replace('"', '\\\\\\"')
nxt = 0
for _ in range(n):
    group = []
    for i in range(size):
        group.append("bench/%d" % (nxt % 100))
        if streams == "many" or i == size - 1:
            nxt += 7
    arr = "'{%s}'" % ",".join('"(%s,\\"%s\\",,,f)"' % (s, esc) for s in group)
    if mode != "runs":
        out.append("EXECUTE p(%s)" % arr)
        continue
    names = sorted(set(group))  # bytewise: the names are ASCII
    index = {s: k for k, s in enumerate(names)}
    firsts, counts, runs, ranks = [0] * len(names), [0] * len(names), [], []
    for i, s in enumerate(group):
        k = index[s]
        counts[k] += 1
        if counts[k] == 1:
            firsts[k] = i + 1
        runs.append(k + 1)
        ranks.append(counts[k])
    out.append("EXECUTE p(%s, %s, %s, %s, %s)" % (arr, ints(firsts), ints(counts), ints(runs), ints(ranks)))
print(";\n\n".join(out) + ";\n")
