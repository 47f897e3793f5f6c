package engine

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The publish path's stages (issue 20; docs/operations.md, pgsse_publish_stage_seconds): where
// one event's time goes between a publisher's request and the first subscriber's write. Each
// stage is the time from the boundary before it to its own:
//
//	head       the loop saw the request's first bytes → its head parsed (a kept-alive
//	           publisher's requests after its first: the first request's connection has no
//	           publish state yet)
//	body       head parsed → body complete
//	queued     body complete (and the token's verdict in) → queued for commit (store.Publisher.Submit)
//	sent       queued → its transaction's statement handed to the connection
//	committed  sent → PostgreSQL's answer to the COMMIT read
//	answered   commit answered → the publisher's answer written (the loop's task for it ran)
//	notified   commit answered → the event's notification received from the LISTEN session
//	           (HTTP-published single durable events of this process; 0 when the
//	           notification was read first)
//	written    notification received → the fan-out's write to its first subscriber (every live
//	           durable event with a subscriber here, however published: for SQL publishes this
//	           stage is all pgsse sees); for an event delivered early (fanout.committed), commit
//	           answered → that write, so an HTTP publish's path is head … committed, written,
//	           and notified runs beside it
//
// The costs stay per request, not per subscriber: a handful of clock readings per request
// (the publisher's per transaction), a map lookup per request and per durable notification
// while HTTP publishes are watched, one clock reading per notification batch and one per
// fan-out flush (BenchmarkPublishStages).
// Everything here is loop-owned: the publisher's readings arrive with its result
// (store.PublishTimes).
type stageClock struct {
	obs [numPublishStages]prometheus.Observer
	// awaiting has an entry per stream this process publishes single durable events to over
	// HTTP (made at its first Submit, kept): the last commit answered whose notification has
	// not been seen, and the last notification whose commit has not been answered — the two
	// race (the LISTEN session's socket and the publishing connection's), so whichever comes
	// second records the notified stage, matched by id.
	awaiting map[string]*stageMark
}

type stageMark struct {
	// The last stageMarkCommits commits answered whose notification has not been seen
	// (id 0 = a free slot): with early local delivery a publisher's next request can be
	// committed before the previous one's notification comes.
	committed [stageMarkCommits]struct {
		id int64
		at time.Time
	}
	next   int   // the slot the next commit takes
	noteID int64 // 0 = none waiting
	note   time.Time
}

// stageMarkCommits is how many commits per stream wait for their notification at once.
const stageMarkCommits = 8

type publishStage uint8

const (
	stageHead publishStage = iota
	stageBody
	stageQueued
	stageSent
	stageCommitted
	stageAnswered
	stageNotified
	stageWritten
	numPublishStages
)

// publishStageLabels are the stage label values, in path order.
var publishStageLabels = [numPublishStages]string{"head", "body", "queued", "sent", "committed", "answered", "notified", "written"}

// stageAwaitMax bounds stageClock.awaiting: when it is full, every mark is forgotten.
const stageAwaitMax = 4096

func newStageClock(vec *prometheus.HistogramVec) *stageClock {
	c := &stageClock{awaiting: make(map[string]*stageMark)}
	for i, l := range publishStageLabels {
		c.obs[i] = vec.WithLabelValues(l)
	}
	return c
}

// observe records one stage; from or to unset (zero) records nothing.
func (c *stageClock) observe(s publishStage, from, to time.Time) {
	if from.IsZero() || to.IsZero() {
		return
	}
	c.obs[s].Observe(max(0, to.Sub(from).Seconds())) // < 0: a notification read before its COMMIT's answer
}

// submitted notes that a single durable event for stream goes to the Publisher, so that its
// notification is watched for (notified) even when it overtakes the commit's answer.
func (c *stageClock) submitted(stream string) {
	if c.awaiting[stream] != nil {
		return
	}
	if len(c.awaiting) >= stageAwaitMax {
		clear(c.awaiting) // streams published to once long ago; the marks are samples anyway
	}
	c.awaiting[stream] = &stageMark{}
}

// committedHTTP takes the commit answered at committed of event id of stream, submitted
// over HTTP by this process.
func (c *stageClock) committedHTTP(stream string, id int64, committed time.Time) {
	m := c.awaiting[stream]
	if m == nil {
		return
	}
	if m.noteID == id {
		c.observe(stageNotified, committed, m.note)
		m.noteID = 0
		return
	}
	m.committed[m.next].id, m.committed[m.next].at = id, committed
	m.next = (m.next + 1) % stageMarkCommits
}

// notified takes a durable notification of stream (first id id) received at at.
func (c *stageClock) notified(stream []byte, id int64, at time.Time) {
	if len(c.awaiting) == 0 || at.IsZero() {
		return
	}
	m := c.awaiting[string(stream)] // no allocation: lookup by converted key
	if m == nil {
		return
	}
	for i := range m.committed {
		if k := &m.committed[i]; k.id == id {
			c.observe(stageNotified, k.at, at)
			k.id = 0
			return
		}
	}
	m.noteID, m.note = id, at
}

// written records the written stage of the events of one fan-out flush at now.
func (c *stageClock) written(items []*event, now time.Time) {
	ns := now.UnixNano()
	for _, ev := range items {
		if ev.received != 0 {
			c.obs[stageWritten].Observe(max(0, float64(ns-ev.received)/1e9))
		}
	}
}
