package engine

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/pgsse/pgsse/sse"
)

// The SSE transport's bytes (docs/http.md, The event stream): what each kind of write looks
// like, and that an encoding's body (what a connection with an id line of its own writes after
// it) is the encoding without its id line.
func TestSSETransport(t *testing.T) {
	tr := newSSETransport()
	durable := tr.event(nil, 17, []byte("status"), []byte("a\nb"))
	assert.Equal(t, "id: 17\nevent: status\ndata: a\ndata: b\n\n", string(durable))
	assert.Equal(t, "event: status\ndata: a\ndata: b\n\n", string(tr.eventBody(durable)))
	ephemeral := tr.event(nil, 0, nil, []byte("x"))
	assert.Equal(t, "data: x\n\n", string(ephemeral))
	assert.Equal(t, string(ephemeral), string(tr.eventBody(ephemeral)), "no id line: the body is all of it")
	assert.Equal(t, string(durable), string(tr.replayEncoder()(nil, 17, []byte("status"), []byte("a\nb"))), "table reads encode as live events do")
	assert.Equal(t, string(durable), string(tr.replayEncoder()(make([]byte, 0, 4), 17, []byte("status"), []byte("a\nb"))))

	assert.Equal(t, ":\n", string(tr.heartbeat()))
	assert.Equal(t, `event: pgsse:gap`+"\n"+`data: {"stream":"s","after":3,"resume":9}`+"\n\n", string(tr.gap([]byte("s"), 3, 9)))
	assert.Equal(t, "retry: 2500\n\n", string(tr.retry(2500)))

	head := string(tr.streamHead(sse.CORS{}, 2000))
	assert.True(t, strings.HasPrefix(head, "HTTP/1.1 200 OK\r\n"), head)
	assert.Contains(t, head, "Content-Type: text/event-stream; charset=utf-8\r\n")
	assert.True(t, strings.HasSuffix(head, "\r\n\r\nretry: 2000\n:pgsse\n\n"), head)

	shed := string(tr.shed(sse.CORS{}, 4000, "over capacity"))
	assert.True(t, strings.HasPrefix(shed, "HTTP/1.1 200 OK\r\n"), shed)
	assert.True(t, strings.HasSuffix(shed, "\r\n\r\nretry: 4000\n:over capacity\n\n"), shed)
}
