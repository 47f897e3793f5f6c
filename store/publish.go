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

// Sentinel errors for bad arguments of pgsse.prune. Their messages equal the SQL
// function's messages (SQLSTATE 22023). The name and audience rules, with the same
// messages as SQL, are names.CheckStream, names.CheckEvent and names.CheckAudience.
var (
	ErrNegativeKeep = errors.New("keep_last must be a non-negative integer")
	ErrNegativeAge  = errors.New("older_than must be a non-negative interval")
)

// OIDs of the parameter types we send in text format.
const (
	oidText      = 25
	oidTextArray = 1009
	oidInt4      = 23
	oidInt8      = 20
	oidBool      = 16
	oidInterval  = 1186
)

func checkArgs(stream, event string, audience []string) error {
	if err := names.CheckStream(stream); err != nil {
		return err
	}
	if event != "" {
		if err := names.CheckEvent(event); err != nil {
			return err
		}
	}
	return names.CheckAudience(audience)
}

// streamArgs encodes the four arguments of pgsse.publish/pgsse.broadcast as text
// parameters: event "" and an empty audience become NULL.
func streamArgs(stream, data, event string, audience []string) [][]byte {
	args := [][]byte{[]byte(stream), []byte(data), nil, nil}
	if event != "" {
		args[2] = []byte(event)
	}
	if len(audience) > 0 {
		args[3] = appendTextArray(nil, audience)
	}
	return args
}

var streamArgOIDs = []uint32{oidText, oidText, oidText, oidTextArray}

// appendTextArray appends the text-format literal of a one-dimensional text[] with
// every element quoted, e.g. {"a","b \"c\""}.
func appendTextArray(dst []byte, elems []string) []byte {
	dst = append(dst, '{')
	for i, e := range elems {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, '"')
		for j := 0; j < len(e); j++ {
			if e[j] == '"' || e[j] == '\\' {
				dst = append(dst, '\\')
			}
			dst = append(dst, e[j])
		}
		dst = append(dst, '"')
	}
	return append(dst, '}')
}

// Publish calls pgsse.publish on conn and returns the new event's id. Inside a
// transaction opened on conn, the event becomes visible and is delivered at commit.
// event "" means NULL (the SSE default "message"); an empty audience means everyone.
// Arguments are checked in Go first (names.CheckStream, names.CheckEvent,
// names.CheckAudience); PostgreSQL errors are returned as *pgconn.PgError.
func Publish(ctx context.Context, conn *pgconn.PgConn, stream, data, event string, audience []string) (int64, error) {
	if err := checkArgs(stream, event, audience); err != nil {
		return 0, err
	}
	res := conn.ExecParams(ctx, "SELECT pgsse.publish($1, $2, $3, $4)",
		streamArgs(stream, data, event, audience), streamArgOIDs, nil, nil).Read()
	if res.Err != nil {
		return 0, res.Err
	}
	if len(res.Rows) != 1 || len(res.Rows[0]) != 1 {
		return 0, errors.New("store: pgsse.publish returned no id")
	}
	id, err := strconv.ParseInt(string(res.Rows[0][0]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("store: pgsse.publish returned %q: %w", res.Rows[0][0], err)
	}
	return id, nil
}

// Broadcast calls pgsse.broadcast on conn: an ephemeral event, delivered at commit to
// whoever is connected, never stored. Same arguments as Publish.
func Broadcast(ctx context.Context, conn *pgconn.PgConn, stream, data, event string, audience []string) error {
	if err := checkArgs(stream, event, audience); err != nil {
		return err
	}
	res := conn.ExecParams(ctx, "SELECT pgsse.broadcast($1, $2, $3, $4)",
		streamArgs(stream, data, event, audience), streamArgOIDs, nil, nil).Read()
	return res.Err
}

// Prune calls pgsse.prune: it deletes durable events older than olderThan, always
// keeping each stream's newest keepLast ids, and returns the number of rows deleted.
func Prune(ctx context.Context, conn *pgconn.PgConn, olderThan time.Duration, keepLast int) (int64, error) {
	if olderThan < 0 {
		return 0, ErrNegativeAge
	}
	if keepLast < 0 {
		return 0, ErrNegativeKeep
	}
	keepLast = min(keepLast, 1<<31-1) // pgsse.prune takes an integer; more is "keep all" anyway
	args := [][]byte{
		[]byte(strconv.FormatInt(olderThan.Microseconds(), 10) + " microseconds"),
		[]byte(strconv.Itoa(keepLast)),
	}
	res := conn.ExecParams(ctx, "SELECT pgsse.prune($1, $2)", args,
		[]uint32{oidInterval, oidInt4}, nil, nil).Read()
	if res.Err != nil {
		return 0, res.Err
	}
	if len(res.Rows) != 1 || len(res.Rows[0]) != 1 {
		return 0, errors.New("store: pgsse.prune returned no count")
	}
	return strconv.ParseInt(string(res.Rows[0][0]), 10, 64)
}
