package ssetest

import (
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ev is what a test expects of a block (Event without the time).
func ev(e Event) Event { e.At = time.Time{}; return e }

// feedAll decodes raw split into the given pieces.
func feedAll(d *Decoder, pieces ...string) []Event {
	var out []Event
	for _, p := range pieces {
		d.Feed([]byte(p), func(b *Block) { out = append(out, b.Event()) })
	}
	return out
}

func TestDecoderLinesAndFields(t *testing.T) {
	for _, tc := range []struct {
		name string
		raw  string
		want []Event
	}{
		{"LF", "id: 1\nevent: e\ndata: a\ndata: b\n\n",
			[]Event{{ID: "1", HasID: true, Type: "e", Data: "a\nb", HasData: true, LastEventID: "1"}}},
		{"CRLF", "id: 1\r\nevent: e\r\ndata: a\r\ndata: b\r\n\r\n",
			[]Event{{ID: "1", HasID: true, Type: "e", Data: "a\nb", HasData: true, LastEventID: "1"}}},
		{"CR", "id: 1\revent: e\rdata: a\rdata: b\r\r",
			[]Event{{ID: "1", HasID: true, Type: "e", Data: "a\nb", HasData: true, LastEventID: "1"}}},
		{"mixed ends, CR then LF is one end", "data: a\r\ndata: b\rdata: c\n\r\n",
			[]Event{{Data: "a\nb\nc", HasData: true}}},
		{"comments and retry belong to the block", "retry: 2000\n:pgsse\nid: 7\ndata: x\n\n",
			[]Event{{ID: "7", HasID: true, Data: "x", HasData: true, Retry: "2000", Comments: []string{"pgsse"}, LastEventID: "7"}}},
		{"one leading space only; no colon", "data:  two\ndata\ndata:\n\n",
			[]Event{{Data: " two\n\n", HasData: true}}},
		{"empty data line dispatches an empty event", "data:\n\n",
			[]Event{{Data: "", HasData: true}}},
		{"a block without data does not dispatch", "id: 3\nevent: x\n\nretry: 5\n\n",
			[]Event{{ID: "3", HasID: true, Type: "x", LastEventID: "3"}, {Retry: "5", LastEventID: "3"}}},
		{"an id with a NUL keeps the last event ID", "id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n",
			[]Event{{ID: "1", HasID: true, Data: "a", HasData: true, LastEventID: "1"},
				{ID: "2\x003", HasID: true, Data: "b", HasData: true, LastEventID: "1"}}},
		{"the last event ID outlives blocks; an empty id clears it", "id: 4\ndata: a\n\ndata: b\n\nid\ndata: c\n\n",
			[]Event{{ID: "4", HasID: true, Data: "a", HasData: true, LastEventID: "4"},
				{Data: "b", HasData: true, LastEventID: "4"},
				{ID: "", HasID: true, Data: "c", HasData: true, LastEventID: ""}}},
		{"blank lines between blocks are nothing", "\n\n\ndata: a\n\n\n\n",
			[]Event{{Data: "a", HasData: true}}},
		{"a leading BOM is dropped", "\xEF\xBB\xBFdata: a\n\n",
			[]Event{{Data: "a", HasData: true}}},
		{"a BOM later is part of the field name", "data: a\n\n\xEF\xBB\xBFdata: b\n\n",
			[]Event{{Data: "a", HasData: true}, {}}},
		{"an unterminated block is not an event", "data: a\n\ndata: b\n",
			[]Event{{Data: "a", HasData: true}}},
		{"unknown fields are ignored", "foo: bar\ndata: a\nDATA: b\n\n",
			[]Event{{Data: "a", HasData: true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Whole, split in two at every point, and one byte at a time.
			var d Decoder
			assert.Equal(t, tc.want, feedAll(&d, tc.raw), "whole")
			for split := 0; split <= len(tc.raw); split++ {
				var d Decoder
				require.Equal(t, tc.want, feedAll(&d, tc.raw[:split], tc.raw[split:]), "split at %d", split)
			}
			var bytewise []string
			for i := range len(tc.raw) {
				bytewise = append(bytewise, tc.raw[i:i+1])
			}
			d = Decoder{}
			assert.Equal(t, tc.want, feedAll(&d, bytewise...), "one byte at a time")
		})
	}
}

func TestDecoderFields(t *testing.T) {
	var names []string
	var d Decoder
	d.Feed([]byte("event: e\ndata: a\n:c\nid: 1\nx\n\n"), func(b *Block) {
		for _, f := range b.Fields {
			names = append(names, string(f.Name)+"="+string(f.Value))
		}
	})
	assert.Equal(t, []string{"event=e", "data=a", "id=1", "x="}, names, "every field line in order, not the comments")
}

// Eager: the preamble and heartbeats, which no blank line follows, come at once.
func TestDecoderEager(t *testing.T) {
	d := Decoder{Eager: true}
	got := feedAll(&d, "retry: 2000\n:pgsse\n")
	assert.Equal(t, []Event{{Retry: "2000"}, {Comments: []string{"pgsse"}}}, got)
	got = feedAll(&d, ":\nid: 1\n:in\ndata: a\n\n")
	assert.Equal(t, []Event{{Comments: []string{""}}, {Comments: []string{"in"}},
		{ID: "1", HasID: true, Data: "a", HasData: true, LastEventID: "1"}}, got)
	assert.Equal(t, int64(3), d.Comments)
	assert.Equal(t, []Event{{Retry: "x", LastEventID: "1"}}, feedAll(&d, "retry:x\n"))
	assert.Empty(t, feedAll(&d, "retryx: 1\n"), "a field that merely starts with retry waits for its block")
}

func TestDecoderDiscardData(t *testing.T) {
	big := strings.Repeat("v", 1<<20)
	raw := "retry: 1\n\ndata: " + big + "\ndata:x\ndata\nid: 9\n\n"
	d := Decoder{DiscardData: true, MaxLine: 1024}
	var lens []int
	var data [][]byte
	for i := 0; i < len(raw); i += 4096 {
		d.Feed([]byte(raw[i:min(i+4096, len(raw))]), func(b *Block) {
			if b.HasData {
				lens, data = append(lens, b.DataLen), append(data, b.Data)
			}
		})
	}
	assert.Equal(t, []int{len(big) + 1 + 1 + 1}, lens, "the value lengths and the LFs joining them")
	assert.Equal(t, [][]byte{nil}, data)
	assert.Zero(t, d.Bad, "data lines are not bound by MaxLine when they are discarded")
	assert.Less(t, cap(d.buf), 4096, "no buffer of the event's size")
}

func TestDecoderMaxLine(t *testing.T) {
	d := Decoder{MaxLine: 16}
	got := feedAll(&d, "data: "+strings.Repeat("x", 20), "\ndata: ok\n\n")
	assert.Equal(t, []Event{{Data: "ok", HasData: true}}, got)
	assert.Equal(t, int64(1), d.Bad)
}

func chunk(parts ...string) string {
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(strings.ToUpper(strconv.FormatInt(int64(len(p)), 16)))
		b.WriteString(";ext=1\r\n")
		b.WriteString(p)
		b.WriteString("\r\n")
	}
	return b.String()
}

func TestDecoderChunked(t *testing.T) {
	body := "retry: 2000\n:ok\n\nid: 1\ndata: 1 100xx\n\n:\nid: 2\r\nevent: e\r\ndata: 2 200\r\n\r\n"
	// The chunks split events and a CRLF, as net/http does when its buffer fills.
	raw := chunk(body[:10], body[10:31], body[31:len(body)-1], body[len(body)-1:]) + "0\r\n\r\n"
	want := []string{"1 100xx", "2 200"}
	for split := 0; split <= len(raw); split++ {
		d := Decoder{Chunked: true}
		var got []string
		on := func(b *Block) {
			if b.HasData {
				got = append(got, string(b.Data))
			}
		}
		d.Feed([]byte(raw[:split]), on)
		d.Feed([]byte(raw[split:]), on)
		require.Equal(t, want, got, "split at %d", split)
		assert.Equal(t, int64(2), d.Comments)
		assert.Zero(t, d.Bad)
		assert.True(t, d.Ended)
	}

	d := Decoder{Chunked: true}
	d.Feed([]byte("zz\r\ndata: 1 1\n\n"), func(*Block) { t.Fatal("a block after a bad chunk size") })
	assert.Equal(t, int64(1), d.Bad)
}

// bench/ decodes every event of 10,000 connections: nothing allocated per event once the
// buffers have grown.
func TestDecoderAllocatesNothingPerEvent(t *testing.T) {
	raw := []byte(":\nid: 12345\nevent: order.updated\ndata: 17 1700000000123456789 xxxxxxxxxxxxxxxxxxxxxxxx\ndata: two\n\n")
	for _, eager := range []bool{false, true} {
		d := Decoder{Eager: eager}
		n := 0
		on := func(b *Block) {
			if b.HasData {
				n += b.DataLen
			}
		}
		d.Feed(raw, on)
		allocs := testing.AllocsPerRun(1000, func() {
			d.Feed(raw[:20], on)
			d.Feed(raw[20:], on)
		})
		assert.Zero(t, allocs, "eager %v", eager)
		assert.Positive(t, n)
	}
}

// Stream consumes the reader only up to the end of the block it returns, keeps what arrived
// before a timeout, and ends with io.EOF.
func TestStream(t *testing.T) {
	server, client := net.Pipe()
	defer client.Close()
	s := NewStream(client, client)
	timedOut := make(chan struct{})
	go func() {
		// A net.Pipe write returns once the reader has read it: the reader times out in the
		// middle of a line.
		_, _ = io.WriteString(server, "retry: 2000\n:pgsse\nid: 1\nda")
		<-timedOut
		_, _ = io.WriteString(server, "ta: a\n\nraw rest\n")
		_, _ = io.WriteString(server, "data: b\n\n")
		server.Close()
	}()
	_, err := s.Next(500 * time.Millisecond)
	close(timedOut)
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "a timeout, got %v", err)
	e, err := s.Next(5 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, Event{ID: "1", HasID: true, Data: "a", HasData: true, Retry: "2000", Comments: []string{"pgsse"}, LastEventID: "1"}, ev(e))
	assert.False(t, e.At.IsZero())
	line, err := s.R.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "raw rest\n", line, "the test reads on after the block")
	e, err = s.NextEvent(5 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, "b", e.Data)
	_, err = s.Next(5 * time.Second)
	assert.ErrorIs(t, err, io.EOF)
}

func TestParse(t *testing.T) {
	got := Parse([]byte("id: 1\ndata: a\n\nevent: x\ndata: b\n\ndata: c\n"))
	require.Len(t, got, 2)
	assert.Equal(t, "message", got[0].Name())
	assert.Equal(t, "x", got[1].Name())
	assert.Equal(t, "1", got[1].LastEventID)
}

// InBlock is what lets a client reset a connection in the middle of an event (bench/chaos).
func TestDecoderInBlock(t *testing.T) {
	for _, dd := range []bool{false, true} {
		d := Decoder{DiscardData: dd, MaxLine: 16}
		assert.False(t, d.InBlock(), "nothing fed")
		steps := []struct {
			feed string
			in   bool
		}{
			{"id: 1\n", true},                        // a complete field line
			{"data: a", true},                        // part of a line
			{"bc\n", true},                           //
			{"\n", false},                            // dispatched
			{":heartbeat\n", true},                   // a comment is a line of the block too
			{"\n", false},                            //
			{"da", true},                             // part of a line, not yet known to be data
			{"ta: " + strings.Repeat("x", 20), true}, // over MaxLine: dropped, still in the block
			{"\n\n", false},                          //
			{"\r", false},                            // a CR alone ends an (empty) line: nothing begun
		}
		for i, st := range steps {
			d.Feed([]byte(st.feed), nil)
			assert.Equal(t, st.in, d.InBlock(), "DiscardData %v, step %d (%q)", dd, i, st.feed)
		}
	}
}
