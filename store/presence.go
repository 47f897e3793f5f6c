package store

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgsse/pgsse/names"
)

// Presence limits and defaults (SPEC §3d).
const (
	// MaxSubject is the longest presence subject (a token's sub claim), in bytes.
	MaxSubject = 200
	// MaxPresenceKey is the longest process key (PresenceKey), in bytes.
	MaxPresenceKey = 200
	// PresenceLeaseIntervals is a lease's length in intervals when PresenceConfig.Lease is
	// 0: one renewal may be missed; a process that dies has its entries out of
	// pgsse.presence within 2 intervals and announced as leaves by the next flush of any
	// survivor, within 3.
	PresenceLeaseIntervals = 2
	// PresenceAppName is the application_name a presence writer's connection should use.
	PresenceAppName = "pgsse-presence"
)

const oidInt4Array = 1007

var (
	// ErrPresenceSuperseded: another process registered with this writer's key — the
	// process was restarted elsewhere, handed over (SIGUSR2), or two live processes share
	// a key. The writer stops: every later Flush returns it without a statement.
	ErrPresenceSuperseded = errors.New("store: presence: another pgsse process registered with this process's key; this one no longer writes presence")
	// ErrPresenceRetired: Flush after Retire.
	ErrPresenceRetired = errors.New("store: presence: the writer was retired")
)

// PresenceKey returns a process key for PresenceConfig.Key: the host, the --listen
// address and the process's index among its --procs siblings (0 for the first). It must
// stay the same when the process restarts (so the new one clears what the old one held)
// and differ between processes alive at the same time.
func PresenceKey(host, listen string, index int) string {
	return host + " " + listen + " #" + strconv.Itoa(index)
}

// PresenceConfig configures a Presence writer.
type PresenceConfig struct {
	Key      string        // PresenceKey(…): 1–200 bytes without control characters
	Interval time.Duration // how often Flush is called (--presence-interval), at least 1 ms
	Lease    time.Duration // how long one renewal keeps the entries; 0 = PresenceLeaseIntervals × Interval; at least Interval
}

// PresenceCount is how many connections this process has on stream under sub now. Sub ""
// counts anonymous connections (no sub claim). Connections 0: none any more.
type PresenceCount struct {
	Stream      string
	Sub         string
	Connections int
}

// PresenceProcess is another process a Flush removed.
type PresenceProcess struct {
	Key         string
	Incarnation int64
	Entries     int64 // (stream, subject) rows it held
}

// PresenceChange is one stream's change of who is present, as its NOTIFY carried it.
type PresenceChange struct {
	Stream    string
	Seq       int64 // the change's number; the stream's numbers only grow
	Prev      int64 // the number of the change before (0: nobody was on the stream)
	Joins     []string
	Leaves    []string
	Anonymous int64 // anonymous connections on the stream after the change
}

// PresenceFlush says what one Flush (or Retire) did.
type PresenceFlush struct {
	Statements int  // statements sent: 0, 1 or 2 (2 only when the lease was lost)
	Registered bool // the process (re)registered: its first write, or after LeaseLost
	// LeaseLost: the process's lease had lapsed or its row was gone — PostgreSQL restarted
	// and emptied the unlogged tables, a failover, or this process did not renew in time
	// and a survivor removed it. Its entries were announced as leaves and written again
	// under a new incarnation.
	LeaseLost bool
	Reaped    []PresenceProcess // other processes whose lease had lapsed, removed here
	Replaced  []PresenceProcess // earlier incarnations of this process's key, removed by its registration
	Changes   []PresenceChange  // per stream: exactly what this write's NOTIFYs announced
}

type presenceEntry struct{ stream, sub string }

// Presence writes one pgsse process's presence entries (SPEC §3d): the engine counts
// connections per (stream, subject) on its loop and hands the counts that changed to
// Flush once per interval, on a goroutine of its own; Flush writes them in one statement
// however many there are, renews the process's lease and removes the processes whose
// lease lapsed. Every process — this one too — learns who joined and left from the P
// notifications on channel "pgsse" (ParsePayload); Flush's result says the same.
//
// Call Flush once per interval even when nothing changed: it renews the lease, and it is
// what removes the processes that died. Give it a connection of its own
// (PresenceAppName) and a context with a deadline of a few intervals; a cancelled
// context closes the connection (pgconn), and the changes go with the next Flush on a
// new one. Presence keeps the counts it was given, so that a lost lease, a PostgreSQL
// restart or a retried write can write the whole state again; counts are absolute, so
// writing one twice changes nothing. It is not safe for concurrent use.
type Presence struct {
	key         string
	interval    time.Duration
	lease       time.Duration
	incarnation int64
	registered  bool // the registration of incarnation committed
	stopped     error
	held        map[presenceEntry]int32    // every count > 0 this process has
	dirty       map[presenceEntry]struct{} // changed since the last write that committed
	streams     []byte                     // parameter buffers, reused
	subs        []byte
	counts      []byte
}

// NewPresence returns a writer for the process cfg.Key. Nothing is written until the first
// Flush, which registers the process (and removes what an earlier process with this key
// left).
func NewPresence(cfg PresenceConfig) (*Presence, error) {
	if err := checkPresenceKey(cfg.Key); err != nil {
		return nil, err
	}
	const maxLease = (1<<31 - 1) * time.Millisecond // pgsse.presence_flush takes milliseconds as an integer
	if cfg.Interval < time.Millisecond || cfg.Interval > maxLease/PresenceLeaseIntervals {
		return nil, fmt.Errorf("store: presence: interval %v is not between 1ms and %v", cfg.Interval, maxLease/PresenceLeaseIntervals)
	}
	if cfg.Lease == 0 {
		cfg.Lease = PresenceLeaseIntervals * cfg.Interval
	}
	if cfg.Lease < cfg.Interval || cfg.Lease > maxLease {
		return nil, fmt.Errorf("store: presence: lease %v is not between the interval %v and %v", cfg.Lease, cfg.Interval, maxLease)
	}
	return &Presence{
		key:         cfg.Key,
		interval:    cfg.Interval,
		lease:       cfg.Lease,
		incarnation: newIncarnation(),
		held:        make(map[presenceEntry]int32),
		dirty:       make(map[presenceEntry]struct{}),
	}, nil
}

func checkPresenceKey(key string) error {
	if len(key) == 0 || len(key) > MaxPresenceKey {
		return fmt.Errorf("store: presence: process key must be 1-%d bytes, not %d", MaxPresenceKey, len(key))
	}
	if names.CheckTag(key) != nil {
		return fmt.Errorf("store: presence: process key %q must be UTF-8 without control characters", key)
	}
	return nil
}

// CheckSubject reports whether sub may be a presence subject: 1–200 bytes of valid UTF-8
// without control characters (SPEC §3d: a token whose sub breaks this is refused with 401
// on a presence stream). "" is no subject: the connection counts as anonymous.
func CheckSubject(sub string) error {
	if err := names.CheckTag(sub); err != nil {
		switch {
		case errors.Is(err, names.ErrTagLength):
			return fmt.Errorf("sub must be 1-%d bytes", MaxSubject)
		case errors.Is(err, names.ErrTagUTF8):
			return errors.New("sub must be valid UTF-8")
		default:
			return errors.New("sub must not contain control characters")
		}
	}
	return nil
}

// newIncarnation returns a random number in 1 … 2^63-1 naming one registration.
func newIncarnation() int64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:])
		if v := int64(binary.BigEndian.Uint64(b[:]) >> 1); v > 0 {
			return v
		}
	}
}

// Key returns the process key.
func (p *Presence) Key() string { return p.key }

// Incarnation returns the number of the current registration (it changes when the lease
// was lost and the process registered again).
func (p *Presence) Incarnation() int64 { return p.incarnation }

// Held returns how many (stream, subject) counts the writer keeps, anonymous ones included.
func (p *Presence) Held() int { return len(p.held) }

// Flush records changes (the counts that changed since the last call; a later one for the
// same stream and subject wins) and writes them on conn, with the lease renewal and the
// removal of lapsed processes, in one statement — two when the lease was found lost and
// the whole state is written again. A change that breaks the name rules is an error and
// nothing of the call is recorded. When the write fails the changes stay recorded and go
// with the next Flush; the result then says how many statements were sent.
func (p *Presence) Flush(ctx context.Context, conn *pgconn.PgConn, changes []PresenceCount) (PresenceFlush, error) {
	if p.stopped != nil {
		return PresenceFlush{}, p.stopped
	}
	for i := range changes {
		c := &changes[i]
		if err := names.CheckStream(c.Stream); err != nil {
			return PresenceFlush{}, fmt.Errorf("store: presence: changes[%d]: %w", i, err)
		}
		if c.Sub != "" {
			if err := CheckSubject(c.Sub); err != nil {
				return PresenceFlush{}, fmt.Errorf("store: presence: changes[%d]: %w", i, err)
			}
		}
		if c.Connections < 0 || c.Connections > 1<<31-1 {
			return PresenceFlush{}, fmt.Errorf("store: presence: changes[%d]: connections %d out of range", i, c.Connections)
		}
	}
	for _, c := range changes {
		e := presenceEntry{c.Stream, c.Sub}
		if c.Connections == 0 {
			delete(p.held, e)
		} else {
			p.held[e] = int32(c.Connections)
		}
		p.dirty[e] = struct{}{}
	}
	var res PresenceFlush
	mode := "flush"
	if !p.registered {
		mode = "register"
	}
	for {
		status, err := p.write(ctx, conn, mode, &res)
		if err != nil {
			return res, err
		}
		switch status {
		case "ok":
			if mode == "register" {
				p.registered, res.Registered = true, true
			}
			clear(p.dirty)
			return res, nil
		case "lost":
			if mode == "register" || res.LeaseLost {
				// A registration cannot be lost in its own statement.
				return res, fmt.Errorf("store: presence: %s answered %q", mode, status)
			}
			res.LeaseLost = true
			p.registered, p.incarnation, mode = false, newIncarnation(), "register"
		case "superseded":
			p.stopped = ErrPresenceSuperseded
			return res, p.stopped
		default:
			return res, fmt.Errorf("store: presence: pgsse.presence_flush answered status %q", status)
		}
	}
}

// Retire removes everything this process holds, announcing leaves, and its lease, in one
// statement: for a process that stops for good (not for a handoff: the successor
// registers with the same key and takes the entries over without a leave). The writer
// writes nothing afterwards.
func (p *Presence) Retire(ctx context.Context, conn *pgconn.PgConn) (PresenceFlush, error) {
	if p.stopped != nil {
		return PresenceFlush{}, p.stopped
	}
	var res PresenceFlush
	status, err := p.write(ctx, conn, "retire", &res)
	if err != nil {
		return res, err
	}
	if status != "retired" {
		return res, fmt.Errorf("store: presence: retire answered status %q", status)
	}
	p.stopped = ErrPresenceRetired
	clear(p.held)
	clear(p.dirty)
	return res, nil
}

// write runs one pgsse.presence_flush in mode and adds what it answered to res.
func (p *Presence) write(ctx context.Context, conn *pgconn.PgConn, mode string, res *PresenceFlush) (string, error) {
	p.streams, p.subs, p.counts = append(p.streams[:0], '{'), append(p.subs[:0], '{'), append(p.counts[:0], '{')
	n := 0
	add := func(e presenceEntry, c int32) {
		if n > 0 {
			p.streams, p.subs, p.counts = append(p.streams, ','), append(p.subs, ','), append(p.counts, ',')
		}
		p.streams = appendArrayElem(p.streams, e.stream)
		p.subs = appendArrayElem(p.subs, e.sub)
		p.counts = strconv.AppendInt(p.counts, int64(c), 10)
		n++
	}
	switch mode {
	case "register":
		for e, c := range p.held {
			add(e, c)
		}
	case "flush":
		for e := range p.dirty {
			add(e, p.held[e])
		}
	}
	p.streams, p.subs, p.counts = append(p.streams, '}'), append(p.subs, '}'), append(p.counts, '}')
	args := [][]byte{
		[]byte(p.key),
		[]byte(strconv.FormatInt(p.incarnation, 10)),
		[]byte(strconv.FormatInt(int64(p.interval/time.Millisecond), 10)),
		[]byte(strconv.FormatInt(int64(p.lease/time.Millisecond), 10)),
		[]byte(mode),
		p.streams, p.subs, p.counts,
	}
	res.Statements++
	rr := conn.ExecParams(ctx, presenceFlushSQL, args,
		[]uint32{oidText, oidInt8, oidInt4, oidInt4, oidText, oidTextArray, oidTextArray, oidInt4Array}, nil, nil).Read()
	if rr.Err != nil {
		return "", fmt.Errorf("store: presence: %s: %w", mode, rr.Err)
	}
	return parseFlushRows(rr.Rows, res)
}

const presenceFlushSQL = "SELECT kind, stream, sub, seq, prev, n FROM pgsse.presence_flush($1, $2, $3, $4, $5, $6, $7, $8)"

// appendArrayElem appends s as a quoted element of a text[] literal.
func appendArrayElem(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for j := 0; j < len(s); j++ {
		if s[j] == '"' || s[j] == '\\' {
			dst = append(dst, '\\')
		}
		dst = append(dst, s[j])
	}
	return append(dst, '"')
}

// parseFlushRows reads pgsse.presence_flush's rows into res and returns the status.
func parseFlushRows(rows [][][]byte, res *PresenceFlush) (string, error) {
	status := ""
	first := len(res.Changes)
	index := map[string]int{}
	var err error
	num := func(b []byte) int64 {
		if b == nil || err != nil {
			return 0
		}
		var v int64
		v, err = strconv.ParseInt(string(b), 10, 64)
		return v
	}
	// Streams first, then their joins and leaves, whatever the order of the rows.
	for pass := 0; pass < 2; pass++ {
		for _, row := range rows {
			if len(row) != 6 {
				return "", errors.New("store: presence: pgsse.presence_flush answered an unexpected row")
			}
			kind := string(row[0])
			if (kind == "join" || kind == "leave") != (pass == 1) {
				continue
			}
			switch kind {
			case "status":
				status = string(row[2])
			case "reaped", "replaced":
				pp := PresenceProcess{Key: string(row[2]), Incarnation: num(row[3]), Entries: num(row[5])}
				if kind == "reaped" {
					res.Reaped = append(res.Reaped, pp)
				} else {
					res.Replaced = append(res.Replaced, pp)
				}
			case "stream":
				index[string(row[1])] = len(res.Changes)
				res.Changes = append(res.Changes, PresenceChange{Stream: string(row[1]), Seq: num(row[3]), Prev: num(row[4]), Anonymous: num(row[5])})
			case "join", "leave":
				i, ok := index[string(row[1])]
				if !ok || i < first {
					return "", fmt.Errorf("store: presence: pgsse.presence_flush answered a %s without its stream", kind)
				}
				if kind == "join" {
					res.Changes[i].Joins = append(res.Changes[i].Joins, string(row[2]))
				} else {
					res.Changes[i].Leaves = append(res.Changes[i].Leaves, string(row[2]))
				}
			default:
				return "", fmt.Errorf("store: presence: pgsse.presence_flush answered a row of kind %q", kind)
			}
			if err != nil {
				return "", fmt.Errorf("store: presence: pgsse.presence_flush answered a bad number: %w", err)
			}
		}
	}
	if status == "" {
		return "", errors.New("store: presence: pgsse.presence_flush answered no status")
	}
	for i := first; i < len(res.Changes); i++ {
		slices.Sort(res.Changes[i].Joins) // bytewise, as in the notifications
		slices.Sort(res.Changes[i].Leaves)
	}
	return status, nil
}
