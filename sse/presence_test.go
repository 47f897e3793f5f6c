package sse

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParsePresenceRouteAndParameter(t *testing.T) {
	for _, tc := range []struct {
		target   string
		route    Route
		name     string
		presence bool
		err      string
	}{
		{"/presence/room%2F1", RoutePresence, "room/1", false, ""},
		{"/presence/room/1?token=x", RoutePresence, "room/1", false, ""},
		{"/streams/room/1?presence=1", RouteStream, "room/1", true, ""},
		{"/streams/room/1?presence=true&since=3", RouteStream, "room/1", true, ""},
		{"/streams/room/1?presence=0", RouteStream, "room/1", false, ""},
		{"/streams?stream=a&presence=1&stream=b", RouteStreams, "", true, ""},
		{"/streams/room/1?presence=yes", RouteStream, "", false, "presence: must be 1, true, 0 or false"},
		{"/streams/room/1?presence=1&presence=1", RouteStream, "", false, "duplicate presence query parameter"},
		{"/presence", RouteOther, "", false, ""},
	} {
		t.Run(tc.target, func(t *testing.T) {
			var p Parser
			req, err := p.Parse([]byte("GET "+tc.target+" HTTP/1.1\r\nHost: x\r\n\r\n"), DefaultMaxHead)
			if tc.err != "" {
				require.Error(t, err)
				assert.Equal(t, tc.err, err.Error())
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.route, req.Route)
			assert.Equal(t, tc.presence, req.Presence)
			if tc.name != "" {
				assert.Equal(t, tc.name, string(req.Name))
			}
		})
	}
}

func TestAppendPresenceJSON(t *testing.T) {
	var full, change, list map[string]any
	require.NoError(t, json.Unmarshal(AppendPresenceFull(nil, "room/1", []string{"a\"b", "c"}, 3), &full))
	assert.Equal(t, map[string]any{"stream": "room/1", "present": []any{"a\"b", "c"}, "anonymous": 3.0}, full)
	require.NoError(t, json.Unmarshal(AppendPresenceChange(nil, "room/1", nil, []string{"x"}, 0), &change))
	assert.Equal(t, map[string]any{"stream": "room/1", "join": []any{}, "leave": []any{"x"}, "anonymous": 0.0}, change)
	b := AppendPresenceList(nil, "room/1", 12, 3, []PresenceSubject{{"user:7", 2}}, true)
	assert.Equal(t, `{"stream":"room/1","connections":12,"anonymous":3,"subjects":[{"sub":"user:7","connections":2}],"truncated":true}`, string(b))
	require.NoError(t, json.Unmarshal(b, &list))
}
