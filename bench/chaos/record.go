package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// What the checker reads: every client's log, every publish's outcome, the table, and the
// moments the run changed something the checker must know about (the windows with
// synchronous_commit off that ended in a crash). Times are durations since the run started
// (monotonic), so logs of different goroutines compare.

// Outcome is what a publisher learned about a publish.
type Outcome uint8

const (
	// Committed: COMMIT (or the HTTP 200) was answered: the events are in the table.
	Committed Outcome = iota + 1
	// NotCommitted: rolled back, refused before the transaction (a 503 saying nothing was
	// published), or an error before COMMIT was sent: nothing may be in the table.
	NotCommitted
	// Unknown: a 503 saying the COMMIT's outcome could not be learned (SPEC §3a allows it),
	// or COMMIT sent and its answer lost: all or nothing.
	Unknown
	// NoAnswer: the HTTP connection ended before an answer (the server process was killed):
	// all or nothing, as Unknown.
	NoAnswer
)

func (o Outcome) String() string {
	switch o {
	case Committed:
		return "committed"
	case NotCommitted:
		return "not committed"
	case Unknown:
		return "outcome unknown (said so)"
	case NoAnswer:
		return "no answer"
	}
	return "?"
}

// PubEvent is one event of a publish.
type PubEvent struct {
	Stream    string
	Key       Key
	ID        int64 // the id the publisher was told (0 when not told: ephemeral, or no answer)
	Ephemeral bool
}

// PubRecord is one publish (a transaction, a POST): its events and what the publisher learned.
type PubRecord struct {
	Via     string // "sql", "http", "batch", "notify", "broadcast", "drain"
	Events  []PubEvent
	Notes   []PubNote // raw channel notifications in the same transaction
	Outcome Outcome
	Sent    time.Duration // COMMIT sent (the request for HTTP)
	Acked   time.Duration // its answer read (0 without one)
	Detail  string        // the error or status line, for the report
}

// PubNote is one pg_notify of a publish.
type PubNote struct {
	Channel string
	Key     Key
}

// ItemKind says what a subscriber log item is.
type ItemKind uint8

const (
	ItemEvent ItemKind = iota + 1
	ItemGap
	ItemBad // something that is neither: Detail says what
)

// SubItem is one thing a durable subscriber read, in the order it read them.
type SubItem struct {
	Kind    ItemKind
	Conn    int32 // the subscriber's connection number (1, 2, …)
	Stream  int16 // index into SubLog.Streams
	ID      int64 // the event's id (for a multi-stream id, the entry of its own stream); a gap's after
	Resume  int64 // a gap's resume
	Key     Key
	Cursors []int64 // a multi-stream event's composite id, every entry
	Detail  string
	At      time.Duration
}

// EphItem is one event without an id (ephemeral, or a channel notification) a subscriber read.
type EphItem struct {
	Conn   int32
	Key    Key
	Target string
	HasID  bool // it came with an id line (never allowed)
	Bad    string
}

// SubLog is one durable subscriber's whole life: every connection, in order.
type SubLog struct {
	Name    string
	Streams []string
	Tags    []string
	// Start is each stream's cursor on the first connection: -1 = absent (live only).
	Start []int64
	// HeadAt is when each connection's 200 head was read (index Conn-1).
	HeadAt    []time.Duration
	Items     []SubItem
	Ephemeral []EphItem
	Statuses  map[int]int // non-200 answers by status
	Resets    int         // connections it reset on purpose
	// Retired: churn ended it before the run's end; only what precedes its last event is owed.
	Retired bool
}

// EphLog is an ephemeral-stream or /channels/ subscriber's log.
type EphLog struct {
	Name     string
	Target   string // the stream or channel
	Channel  bool
	Items    []EphItem
	Conns    int
	Statuses map[int]int
}

// WorkerLog is one hub worker: each instance (a hub client, or a failover Listener) in turn.
type WorkerLog struct {
	Name      string
	Mode      string // "lossless" or "wake"
	Failover  bool
	Channels  []string
	Instances []*WorkerInstance
}

// WorkerInstance is one Listener's life.
type WorkerInstance struct {
	AckAt  map[string]time.Duration // per channel: when Listen returned
	EndAt  time.Duration            // when it ended (closed by the run, or failed)
	Failed string                   // why it ended, if not closed by the run
	Items  []WorkerItem
}

// WorkerItem is a notification (Key set) or a marker a worker read.
type WorkerItem struct {
	Channel string // the notification's channel; a resync's ("" = all)
	Key     Key
	Marker  string // "" for a notification; "down", "resync", "end"
	Bad     string
	At      time.Duration
}

// CrashWindow is a time during which commits may be lost: synchronous_commit was off from
// From until PostgreSQL was stopped with -m immediate at To.
type CrashWindow struct{ From, To time.Duration }

// Record is everything a run hands the checker.
type Record struct {
	Pubs        []*PubRecord
	Subs        []*SubLog
	Ephs        []*EphLog
	Workers     []*WorkerLog
	Table       []Row // pgsse.events at the end, and every row pruned during the run
	Crashes     []CrashWindow
	RunEnd      time.Duration
	WorkerClose time.Duration // when the run closed the workers that were still running
}

// Row is one row of pgsse.events (Pruned: deleted by pgsse.prune during the run, kept by
// the run's audit trigger), read by ReadRow: the data is checked as it is read and only its
// key kept.
type Row struct {
	Stream string
	ID     int64
	Key    Key
	Bad    string // the row is not what its key generates: what differs
	Pruned bool
}

// ReadRow checks one row of pgsse.events against what its key generates (data, event name,
// audience) and returns it without the data. event is "" for NULL.
func ReadRow(stream string, id int64, event, data string, audience []string, pruned bool) Row {
	r := Row{Stream: stream, ID: id, Pruned: pruned}
	p, ok := ParseData(data)
	r.Key = p.Key
	switch {
	case !ok:
		r.Bad = "data is not what any publisher sent: " + clip(data)
	case p.Kind != kindDurable:
		r.Bad = "an event of kind " + p.Kind + " is stored"
	case p.Target != stream:
		r.Bad = "event for stream " + p.Target + " stored on " + stream
	default:
		sh := ShapeOf(p.Key)
		if sh.Event != event {
			r.Bad = "event name " + event + ", published as " + sh.Event
		} else if !sameTags(sh.Audience, audience) {
			r.Bad = "audience differs from what was published"
		}
	}
	return r
}

func sameTags(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// Dump writes the logs of the named subscribers to dir/<name>.log, one line per item, for a
// failure to be read against (what each connection received, in order).
func (r *Record) Dump(dir string, names map[string]bool) error {
	for _, s := range r.Subs {
		if !names[s.Name] {
			continue
		}
		var b strings.Builder
		fmt.Fprintf(&b, "# %s streams %v tags %v start %v retired %v\n", s.Name, s.Streams, s.Tags, s.Start, s.Retired)
		for i, h := range s.HeadAt {
			fmt.Fprintf(&b, "# connection %d head at %s\n", i+1, h)
		}
		for _, it := range s.Items {
			switch it.Kind {
			case ItemEvent:
				fmt.Fprintf(&b, "%s conn %d %s id %d key %v%s\n", it.At, it.Conn, s.Streams[it.Stream], it.ID, it.Key, cursors(it.Cursors))
			case ItemGap:
				fmt.Fprintf(&b, "%s conn %d %s gap after %d resume %d\n", it.At, it.Conn, s.Streams[it.Stream], it.ID, it.Resume)
			default:
				fmt.Fprintf(&b, "%s conn %d bad: %s\n", it.At, it.Conn, it.Detail)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, s.Name+".log"), []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func cursors(c []int64) string {
	if len(c) == 0 {
		return ""
	}
	return fmt.Sprintf(" cursors %v", c)
}
