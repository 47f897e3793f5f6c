package sse

import "strconv"

// PresenceEvent is the event name of presence events (docs/http.md, Presence).
var PresenceEvent = []byte("pgsse:presence")

// AppendPresenceFull appends the data of a full presence event:
// {"stream":"room/1","present":["user:7",…],"anonymous":3}.
func AppendPresenceFull(dst []byte, stream string, present []string, anonymous int64) []byte {
	dst = append(dst, `{"stream":`...)
	dst = appendJSONString(dst, []byte(stream))
	dst = append(dst, `,"present":`...)
	dst = appendJSONStrings(dst, present)
	dst = append(dst, `,"anonymous":`...)
	dst = strconv.AppendInt(dst, anonymous, 10)
	return append(dst, '}')
}

// AppendPresenceChange appends the data of a presence change event:
// {"stream":"room/1","join":["user:9"],"leave":["user:7"],"anonymous":2}.
func AppendPresenceChange(dst []byte, stream string, joins, leaves []string, anonymous int64) []byte {
	dst = append(dst, `{"stream":`...)
	dst = appendJSONString(dst, []byte(stream))
	dst = append(dst, `,"join":`...)
	dst = appendJSONStrings(dst, joins)
	dst = append(dst, `,"leave":`...)
	dst = appendJSONStrings(dst, leaves)
	dst = append(dst, `,"anonymous":`...)
	dst = strconv.AppendInt(dst, anonymous, 10)
	return append(dst, '}')
}

// PresenceSubject is one subject of a GET /presence answer.
type PresenceSubject struct {
	Sub         string
	Connections int64
}

// AppendPresenceList appends the JSON answer to GET /presence/{stream}:
// {"stream":"room/1","connections":12,"anonymous":3,"subjects":[{"sub":"user:7","connections":2},…],"truncated":false}.
func AppendPresenceList(dst []byte, stream string, connections, anonymous int64, subjects []PresenceSubject, truncated bool) []byte {
	dst = append(dst, `{"stream":`...)
	dst = appendJSONString(dst, []byte(stream))
	dst = append(dst, `,"connections":`...)
	dst = strconv.AppendInt(dst, connections, 10)
	dst = append(dst, `,"anonymous":`...)
	dst = strconv.AppendInt(dst, anonymous, 10)
	dst = append(dst, `,"subjects":[`...)
	for i, s := range subjects {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"sub":`...)
		dst = appendJSONString(dst, []byte(s.Sub))
		dst = append(dst, `,"connections":`...)
		dst = strconv.AppendInt(dst, s.Connections, 10)
		dst = append(dst, '}')
	}
	dst = append(dst, `],"truncated":`...)
	dst = strconv.AppendBool(dst, truncated)
	return append(dst, '}')
}

func appendJSONStrings(dst []byte, list []string) []byte {
	dst = append(dst, '[')
	for i, s := range list {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendJSONString(dst, []byte(s))
	}
	return append(dst, ']')
}
