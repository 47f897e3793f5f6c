package sse

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAppendEventGolden(t *testing.T) {
	cases := []struct {
		name  string
		id    int64
		event string
		data  string
		want  string
	}{
		{"plain", 7, "", "hello", "id: 7\ndata: hello\n\n"},
		{"message event omitted", 7, "message", "hello", "id: 7\ndata: hello\n\n"},
		{"named event", 42, "order.updated", `{"a":1}`, "id: 42\nevent: order.updated\ndata: {\"a\":1}\n\n"},
		{"no id when zero", 0, "", "x", "data: x\n\n"},
		{"no id when negative", -5, "tick", "x", "event: tick\ndata: x\n\n"},
		{"max id", 1<<63 - 1, "", "x", "id: 9223372036854775807\ndata: x\n\n"},
		{"empty data", 1, "", "", "id: 1\ndata: \n\n"},
		{"LF", 1, "", "a\nb", "id: 1\ndata: a\ndata: b\n\n"},
		{"CRLF", 1, "", "a\r\nb", "id: 1\ndata: a\ndata: b\n\n"},
		{"CR", 1, "", "a\rb", "id: 1\ndata: a\ndata: b\n\n"},
		{"LF CR is two breaks", 1, "", "a\n\rb", "id: 1\ndata: a\ndata: \ndata: b\n\n"},
		{"CR CR", 1, "", "a\r\rb", "id: 1\ndata: a\ndata: \ndata: b\n\n"},
		{"consecutive LF", 1, "", "a\n\n\nb", "id: 1\ndata: a\ndata: \ndata: \ndata: b\n\n"},
		{"consecutive CRLF", 1, "", "a\r\n\r\nb", "id: 1\ndata: a\ndata: \ndata: b\n\n"},
		{"leading newline", 1, "", "\nx", "id: 1\ndata: \ndata: x\n\n"},
		{"trailing newline", 1, "", "x\n", "id: 1\ndata: x\ndata: \n\n"},
		{"trailing CRLF", 1, "", "x\r\n", "id: 1\ndata: x\ndata: \n\n"},
		{"trailing CR", 1, "", "x\r", "id: 1\ndata: x\ndata: \n\n"},
		{"only newline", 1, "", "\n", "id: 1\ndata: \ndata: \n\n"},
		{"leading space kept", 1, "", " x", "id: 1\ndata:  x\n\n"},
		{"multi-byte UTF-8", 3, "", "héllo\n世界 🎉", "id: 3\ndata: héllo\ndata: 世界 🎉\n\n"},
		{"field injection stays data", 1, "", "\r\n\r\nid: 5\rretry: 1\nevent: x", "id: 1\ndata: \ndata: \ndata: id: 5\ndata: retry: 1\ndata: event: x\n\n"},
		{"CR LF in event name neutralised", 1, "a\nid: 9", "x", "id: 1\nevent: a id: 9\ndata: x\n\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := AppendEvent([]byte("prefix|"), tc.id, []byte(tc.event), []byte(tc.data))
			assert.Equal(t, "prefix|"+tc.want, string(got))
		})
	}
}

func TestAppendCommentRetryGolden(t *testing.T) {
	assert.Equal(t, ":\n", string(AppendComment(nil, nil)))
	assert.Equal(t, ":ok\n", string(AppendComment(nil, []byte("ok"))))
	assert.Equal(t, ": a b c\n", string(AppendComment(nil, []byte(" a\rb\nc"))))
	assert.Equal(t, "retry: 2000\n", string(AppendRetry(nil, 2000)))
	assert.Equal(t, "retry: 0\n", string(AppendRetry(nil, 0)))
	assert.Equal(t, "retry: 0\n", string(AppendRetry(nil, -1)))
}

func TestAppendGapGolden(t *testing.T) {
	cases := []struct {
		stream string
		want   string
	}{
		{"orders/42", `{"stream":"orders/42","after":5,"resume":17}`},
		{`a"b\c`, `{"stream":"a\"b\\c","after":5,"resume":17}`},
		{"a\nb\rc\td\x01\x1f", `{"stream":"a\nb\rc\td\u0001\u001f","after":5,"resume":17}`},
		{"é\xff\u2028\u2029", `{"stream":"é\ufffd\u2028\u2029","after":5,"resume":17}`},
		{"", `{"stream":"","after":5,"resume":17}`},
	}
	for _, tc := range cases {
		got := string(AppendGap(nil, []byte(tc.stream), 5, 17))
		assert.Equal(t, "event: pgsse:gap\ndata: "+tc.want+"\n\n", got)

		// The data line is valid JSON that decodes back to the stream name
		// (invalid UTF-8 aside).
		data := strings.TrimSuffix(strings.TrimPrefix(got, "event: pgsse:gap\ndata: "), "\n\n")
		var v struct {
			Stream string `json:"stream"`
			After  int64  `json:"after"`
			Resume int64  `json:"resume"`
		}
		require.NoError(t, json.Unmarshal([]byte(data), &v), data)
		assert.Equal(t, strings.ToValidUTF8(tc.stream, "\ufffd"), v.Stream)
		assert.Equal(t, int64(5), v.After)
		assert.Equal(t, int64(17), v.Resume)
	}
}

// typicalEvent is a ~200-byte durable event as a JSON-publishing app sends.
var typicalEvent = []byte(`{"order_id":42,"status":"shipped","carrier":"DHL","tracking":"JD014600006281993562","items":[{"sku":"A-100","qty":2},{"sku":"B-7","qty":1}],"updated_at":"2024-05-01T12:34:56.789Z","note":"left at door"}`)

func TestEncodersDoNotAllocate(t *testing.T) {
	buf := make([]byte, 0, 4096)
	multi := []byte("line one\r\nline two\rline three\n\nlast\n")
	allocs := testing.AllocsPerRun(100, func() {
		b := AppendEvent(buf[:0], 123456, []byte("order.updated"), typicalEvent)
		b = AppendEvent(b, 0, nil, multi)
		b = AppendComment(b, []byte("heartbeat"))
		b = AppendRetry(b, 2000)
		b = AppendGap(b, []byte(`orders/"42"`), 5, 17)
		_ = AppendCompositeID(b, 3, cursors)
	})
	assert.Zero(t, allocs)
}

var cursors = []int64{17, 0, 4, 9223372036854775807}

func TestAppendCompositeIDGolden(t *testing.T) {
	assert.Equal(t, "id: 3:17,0,4,9223372036854775807\n", string(AppendCompositeID(nil, 3, cursors)))
	assert.Equal(t, "id: 0:5\n", string(AppendCompositeID(nil, 0, []int64{5})))
}

func TestAppendDataLinearWithManyBreaks(t *testing.T) {
	// A CR-heavy payload with one LF at the end must still encode exactly.
	data := strings.Repeat("\r", 1000) + "\n"
	got := string(AppendEvent(nil, 0, nil, []byte(data)))
	// "\r"×999 breaks, then "\r\n" is one break: 1000 breaks, 1001 lines.
	assert.Equal(t, strings.Repeat("data: \n", 1001)+"\n", got)
}

func BenchmarkAppendEvent(b *testing.B) {
	buf := make([]byte, 0, 1024)
	event := []byte("order.updated")
	b.SetBytes(int64(len(typicalEvent)))
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendEvent(buf[:0], 123456, event, typicalEvent)
	}
}

func BenchmarkAppendEventMultiline(b *testing.B) {
	buf := make([]byte, 0, 1024)
	data := []byte("line one\nline two\r\nline three\rline four\n\nline six and some more text to be typical\n")
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendEvent(buf[:0], 9, nil, data)
	}
}
