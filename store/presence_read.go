package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgsse/pgsse/names"
)

// NoLimit as ReadPresence's limit lists every subject.
const NoLimit = -1

// PresenceSnapshot is who is on a stream, read in one snapshot with the number of the
// stream's last change: a consumer of P notifications applies, from here on, the change
// whose Prev is Seq (and ignores those numbered Seq or less).
type PresenceSnapshot struct {
	Stream      string
	Seq         int64             // the last change (0: nobody is on the stream)
	Connections int64             // every connection, anonymous ones included
	Anonymous   int64             // connections without a subject
	Subjects    []PresenceSubject // sorted by Sub, bytewise; at most the limit
	Total       int64             // subjects in all (more than len(Subjects) when Truncated)
	Truncated   bool
}

// PresenceSubject is one subject on a stream with its connections over every process.
type PresenceSubject struct {
	Sub         string
	Connections int64
}

// ReadPresence reads stream's presence in one statement: the subjects sorted by sub
// (at most limit of them; NoLimit for all), the connection counts and the change number.
// It counts the entries of every registered process, as the P notifications do; a
// process whose lease lapsed counts until a survivor's next flush removes it and
// announces its leaves (pgsse.presence, for SQL, already leaves it out).
func ReadPresence(ctx context.Context, conn *pgconn.PgConn, stream string, limit int) (PresenceSnapshot, error) {
	snap := PresenceSnapshot{Stream: stream}
	if err := names.CheckStream(stream); err != nil {
		return snap, err
	}
	if limit < 0 {
		limit = 1<<31 - 1
	}
	res := conn.ExecParams(ctx, readPresenceSQL, [][]byte{[]byte(stream), []byte(strconv.Itoa(limit))},
		[]uint32{oidText, oidInt4}, nil, nil).Read()
	if res.Err != nil {
		return snap, fmt.Errorf("store: read presence of %s: %w", stream, res.Err)
	}
	if len(res.Rows) == 0 || len(res.Rows[0]) != 6 || res.Rows[0][0] != nil {
		return snap, errors.New("store: read presence: unexpected result")
	}
	var err error
	num := func(b []byte) int64 {
		if err != nil {
			return 0
		}
		var v int64
		v, err = strconv.ParseInt(string(b), 10, 64)
		return v
	}
	meta := res.Rows[0]
	snap.Seq, snap.Connections, snap.Anonymous, snap.Total = num(meta[1]), num(meta[2]), num(meta[3]), num(meta[4])
	snap.Subjects = make([]PresenceSubject, 0, len(res.Rows)-1)
	for _, row := range res.Rows[1:] {
		snap.Subjects = append(snap.Subjects, PresenceSubject{Sub: string(row[0]), Connections: num(row[1])})
	}
	if err != nil {
		return snap, fmt.Errorf("store: read presence: %w", err)
	}
	snap.Truncated = snap.Total > int64(len(snap.Subjects))
	return snap, nil
}

// readPresenceSQL: a first row (sub NULL) with seq, connections, anonymous and the number
// of subjects, then the subjects in order. One statement, so one snapshot.
const readPresenceSQL = `WITH t AS (
    SELECT e.sub, sum(e.connections) AS n FROM pgsse.presence_entries e WHERE e.stream = $1 GROUP BY e.sub
)
SELECT NULL::text AS sub, coalesce((SELECT s.seq FROM pgsse.presence_streams s WHERE s.stream = $1), 0),
       coalesce((SELECT sum(t.n) FROM t), 0), coalesce((SELECT t.n FROM t WHERE t.sub = ''), 0),
       (SELECT count(*) FROM t WHERE t.sub <> ''), 0::bigint AS o
UNION ALL
SELECT l.sub, l.n, NULL, NULL, NULL, l.o FROM (
    SELECT t.sub, t.n, row_number() OVER (ORDER BY t.sub COLLATE "C") AS o
    FROM t WHERE t.sub <> '' ORDER BY t.sub COLLATE "C" LIMIT $2) l
ORDER BY o`

// ReadPresenceSeqs returns, in one statement, the number of the last presence change of
// each stream (0: nobody is on it): the cheap check after a lost LISTEN session — a
// consumer whose view of a stream carries the same number (or is empty, when it reads 0)
// missed nothing there and can send its full present event from memory; the others
// ReadPresence again.
func ReadPresenceSeqs(ctx context.Context, conn *pgconn.PgConn, streams []string) ([]int64, error) {
	seqs := make([]int64, len(streams))
	if len(streams) == 0 {
		return seqs, nil
	}
	res := conn.ExecParams(ctx, `SELECT u.ord, s.seq FROM unnest($1::text[]) WITH ORDINALITY AS u(stream, ord)
        JOIN pgsse.presence_streams s ON s.stream = u.stream`,
		[][]byte{appendTextArray(nil, streams)}, []uint32{oidTextArray}, nil, nil).Read()
	if res.Err != nil {
		return nil, fmt.Errorf("store: read presence change numbers: %w", res.Err)
	}
	for _, row := range res.Rows {
		ord, err1 := strconv.Atoi(string(row[0]))
		seq, err2 := strconv.ParseInt(string(row[1]), 10, 64)
		if err1 != nil || err2 != nil || ord < 1 || ord > len(seqs) {
			return nil, errors.New("store: read presence change numbers: unexpected result")
		}
		seqs[ord-1] = seq
	}
	return seqs, nil
}

// PresenceProcessInfo is one registered process, for `pgsse doctor` and operators.
type PresenceProcessInfo struct {
	Key         string
	Incarnation int64
	Interval    time.Duration
	Started     time.Time // when this incarnation registered
	Renewed     time.Time // its last renewal
	Expires     time.Time // when its lease lapses unless renewed
	Live        bool      // the lease had not lapsed when read
	Age         time.Duration
	Entries     int64 // (stream, subject) rows it holds, anonymous ones included
}

// ReadPresenceProcesses lists the processes holding presence leases, by key.
func ReadPresenceProcesses(ctx context.Context, conn *pgconn.PgConn) ([]PresenceProcessInfo, error) {
	res := conn.ExecParams(ctx, `SELECT p.process, p.incarnation, p.interval_ms,
            floor(extract(epoch FROM p.started_at) * 1000000)::bigint,
            floor(extract(epoch FROM p.renewed_at) * 1000000)::bigint,
            floor(extract(epoch FROM p.expires_at) * 1000000)::bigint,
            p.expires_at >= clock_timestamp(),
            floor(extract(epoch FROM clock_timestamp() - p.started_at) * 1000000)::bigint,
            (SELECT count(*) FROM pgsse.presence_entries e WHERE e.incarnation = p.incarnation)
        FROM pgsse.presence_processes p ORDER BY p.process COLLATE "C"`, nil, nil, nil, nil).Read()
	if res.Err != nil {
		return nil, fmt.Errorf("store: read presence processes: %w", res.Err)
	}
	out := make([]PresenceProcessInfo, 0, len(res.Rows))
	for _, row := range res.Rows {
		var n [8]int64
		for i, j := range [...]int{1, 2, 3, 4, 5, 7, 8} {
			v, err := strconv.ParseInt(string(row[j]), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("store: read presence processes: %w", err)
			}
			n[i] = v
		}
		out = append(out, PresenceProcessInfo{
			Key:         string(row[0]),
			Incarnation: n[0],
			Interval:    time.Duration(n[1]) * time.Millisecond,
			Started:     time.UnixMicro(n[2]),
			Renewed:     time.UnixMicro(n[3]),
			Expires:     time.UnixMicro(n[4]),
			Live:        string(row[6]) == "t",
			Age:         time.Duration(n[5]) * time.Microsecond,
			Entries:     n[6],
		})
	}
	return out, nil
}
