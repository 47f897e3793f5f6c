package framing

import (
	"bytes"
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/names"
)

// clone deep-copies a frame's views so it outlives the decoded buffer.
func clone(f Frame) Frame {
	f.Channel = bytes.Clone(f.Channel)
	f.Name = bytes.Clone(f.Name)
	f.Text = bytes.Clone(f.Text)
	return f
}

// frameEqual compares frames treating nil and empty views alike.
func frameEqual(t *testing.T, want, got Frame, msgAndArgs ...any) bool {
	t.Helper()
	norm := func(f Frame) Frame {
		f = clone(f)
		for _, p := range []*[]byte{&f.Channel, &f.Name, &f.Text} {
			if len(*p) == 0 {
				*p = nil
			}
		}
		return f
	}
	return assert.Equal(t, norm(want), norm(got), msgAndArgs...)
}

var (
	max63  = []byte(strings.Repeat("c", names.MaxChannel))
	max64  = []byte(strings.Repeat("n", MaxName))
	bigTxt = bytes.Repeat([]byte{0xAB}, MaxBody-1-5) // ACK with the largest legal body
)

// roundTripCases holds one or more frames of every type, including every
// boundary a field can legally take.
func roundTripCases() []struct {
	name string
	enc  []byte
	want Frame
} {
	type tc = struct {
		name string
		enc  []byte
		want Frame
	}
	return []tc{
		{"hello", AppendHello(nil, 4242, []byte("worker-1")), Frame{Type: TypeHello, Version: 1, PID: 4242, Name: []byte("worker-1")}},
		{"hello empty name", AppendHello(nil, 0, nil), Frame{Type: TypeHello, Version: 1}},
		{"hello max name", AppendHello(nil, math.MaxUint32, max64), Frame{Type: TypeHello, Version: 1, PID: math.MaxUint32, Name: max64}},
		{"sub lossless", AppendSub(nil, 7, ModeLossless, []byte("jobs")), Frame{Type: TypeSub, Req: 7, Mode: ModeLossless, Channel: []byte("jobs")}},
		{"sub wake max", AppendSub(nil, math.MaxUint32, ModeWake, max63), Frame{Type: TypeSub, Req: math.MaxUint32, Mode: ModeWake, Channel: max63}},
		{"sub odd channel", AppendSub(nil, 1, ModeWake, []byte("we \"ird\xff")), Frame{Type: TypeSub, Req: 1, Mode: ModeWake, Channel: []byte("we \"ird\xff")}},
		{"unsub", AppendUnsub(nil, 9, []byte("j")), Frame{Type: TypeUnsub, Req: 9, Channel: []byte("j")}},
		{"unsub max", AppendUnsub(nil, 0, max63), Frame{Type: TypeUnsub, Channel: max63}},
		{"ping", AppendPing(nil, 0x0102030405060708), Frame{Type: TypePing, Token: 0x0102030405060708}},
		{"ping max", AppendPing(nil, math.MaxUint64), Frame{Type: TypePing, Token: math.MaxUint64}},
		{"pong", AppendPong(nil, 99), Frame{Type: TypePong, Token: 99}},
		{"ack ok", AppendAck(nil, 7, AckOK, nil), Frame{Type: TypeAck, Req: 7, Ack: AckOK}},
		{"ack msg", AppendAck(nil, 8, AckNotSubscribed, []byte("not subscribed")), Frame{Type: TypeAck, Req: 8, Ack: AckNotSubscribed, Text: []byte("not subscribed")}},
		{"ack max body", AppendAck(nil, 1, AckLimit, bigTxt), Frame{Type: TypeAck, Req: 1, Ack: AckLimit, Text: bigTxt}},
		{"notify", AppendNotify(nil, 31337, []byte("pgsse"), []byte(`{"s":"orders/42"}`)), Frame{Type: TypeNotify, PID: 31337, Channel: []byte("pgsse"), Text: []byte(`{"s":"orders/42"}`)}},
		{"notify empty payload", AppendNotify(nil, 1, max63, nil), Frame{Type: TypeNotify, PID: 1, Channel: max63}},
		{"notify binary payload", AppendNotify(nil, 1, []byte("c"), []byte{0, 0xff, '\n'}), Frame{Type: TypeNotify, PID: 1, Channel: []byte("c"), Text: []byte{0, 0xff, '\n'}}},
		{"status ready", AppendStatus(nil, StatusReady, nil, nil), Frame{Type: TypeStatus, Status: StatusReady}},
		{"status resync chan", AppendStatus(nil, StatusResync, []byte("jobs"), []byte("ring overflow")), Frame{Type: TypeStatus, Status: StatusResync, Channel: []byte("jobs"), Text: []byte("ring overflow")}},
		{"status protocol error", AppendStatus(nil, StatusProtocolError, nil, []byte("bad")), Frame{Type: TypeStatus, Status: StatusProtocolError, Text: []byte("bad")}},
		{"status max chan", AppendStatus(nil, StatusEvicted, max63, nil), Frame{Type: TypeStatus, Status: StatusEvicted, Channel: max63}},
	}
}

func TestRoundTrip(t *testing.T) {
	seen := map[Type]bool{}
	for _, tc := range roundTripCases() {
		t.Run(tc.name, func(t *testing.T) {
			require.GreaterOrEqual(t, len(tc.enc), HeaderLen+1)
			assert.Equal(t, uint32(len(tc.enc)-HeaderLen), binary.BigEndian.Uint32(tc.enc), "back-patched length")
			f, n, err := Decode(tc.enc)
			require.NoError(t, err)
			assert.Equal(t, len(tc.enc), n)
			frameEqual(t, tc.want, f)
			assert.Equal(t, tc.enc, f.Append(nil), "decoded frame re-encodes to its input")
			assert.Equal(t, tc.enc, tc.want.Append(nil), "Frame.Append matches AppendX")

			// Trailing bytes after the frame are left alone.
			withNext := append(bytes.Clone(tc.enc), 0, 0)
			_, n, err = Decode(withNext)
			require.NoError(t, err)
			assert.Equal(t, len(tc.enc), n)
			seen[f.Type] = true
		})
	}
	for _, ty := range []Type{TypeHello, TypeSub, TypeUnsub, TypePing, TypeAck, TypeNotify, TypeStatus, TypePong} {
		assert.True(t, seen[ty], "no round trip for %v", ty)
	}
}

// Encoders append after existing bytes and patch only their own length.
func TestAppendAfterExisting(t *testing.T) {
	dst := []byte("prefix")
	dst = AppendPing(dst, 1)
	dst = AppendSub(dst, 2, ModeWake, []byte("ch"))
	assert.Equal(t, "prefix", string(dst[:6]))
	f, n, err := Decode(dst[6:])
	require.NoError(t, err)
	assert.Equal(t, TypePing, f.Type)
	f, _, err = Decode(dst[6+n:])
	require.NoError(t, err)
	assert.Equal(t, "ch", string(f.Channel))
}

// Decoded views alias the input: no copies.
func TestDecodeReturnsViews(t *testing.T) {
	b := AppendNotify(nil, 1, []byte("chan"), []byte("payload"))
	f, _, err := Decode(b)
	require.NoError(t, err)
	assert.Same(t, &b[HeaderLen+1+5], &f.Channel[0])
	assert.Same(t, &b[HeaderLen+1+5+4], &f.Text[0])
	assert.Equal(t, len(f.Channel), cap(f.Channel), "view capped: append cannot overwrite the payload")
}

// raw builds a frame with a correct length header around body (type byte first).
func raw(body ...byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func TestDecodeErrors(t *testing.T) {
	u32 := func(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
	hdr := func(n uint32, rest ...byte) []byte { return append(u32(n), rest...) }
	long64 := bytes.Repeat([]byte("c"), 64)
	cases := []struct {
		name string
		in   []byte
		err  error
	}{
		// Incomplete: a valid prefix of a frame.
		{"empty", nil, ErrIncomplete},
		{"1 byte", []byte{0}, ErrIncomplete},
		{"3 bytes", []byte{0, 0, 0}, ErrIncomplete},
		{"header only", hdr(9), ErrIncomplete},
		{"header+type", hdr(9, byte(TypePing)), ErrIncomplete},
		{"one byte short", AppendPing(nil, 1)[:12], ErrIncomplete},
		{"max body, short", hdr(MaxBody, byte(TypeAck), 0, 0, 0, 0, 0), ErrIncomplete},

		// Length: detected from the header alone.
		{"length 0", hdr(0), ErrLength},
		{"length 0 with bytes", hdr(0, 1, 2, 3), ErrLength},
		{"length MaxBody+1", hdr(MaxBody + 1), ErrLength},
		{"length max u32", hdr(math.MaxUint32), ErrLength},
		{"length 2^31", hdr(1 << 31), ErrLength},

		// Unknown type: detected from the type byte without the body.
		{"type 0x00", raw(0x00), ErrUnknownType},
		{"type 0x05", raw(0x05, 0, 0, 0, 0, 0, 0, 0, 0), ErrUnknownType},
		{"type 0x80", raw(0x80), ErrUnknownType},
		{"type 0x85", raw(0x85), ErrUnknownType},
		{"type 0xff", raw(0xff), ErrUnknownType},
		{"type 0x41 partial body", hdr(100, 0x41), ErrUnknownType},

		// Truncated fixed fields.
		{"hello no fields", raw(byte(TypeHello)), ErrTruncated},
		{"hello no pid", raw(byte(TypeHello), 1, 0, 0, 0), ErrTruncated},
		{"sub no mode", raw(byte(TypeSub), 0, 0, 0, 1), ErrTruncated},
		{"sub nothing", raw(byte(TypeSub)), ErrTruncated},
		{"unsub short req", raw(byte(TypeUnsub), 0, 0, 1), ErrTruncated},
		{"ping empty", raw(byte(TypePing)), ErrTruncated},
		{"ping 7", raw(byte(TypePing), 1, 2, 3, 4, 5, 6, 7), ErrTruncated},
		{"pong 7", raw(byte(TypePong), 1, 2, 3, 4, 5, 6, 7), ErrTruncated},
		{"ack no code", raw(byte(TypeAck), 0, 0, 0, 1), ErrTruncated},
		{"notify no chanlen", raw(byte(TypeNotify), 0, 0, 0, 1), ErrTruncated},
		{"notify chanlen past end", raw(byte(TypeNotify), 0, 0, 0, 1, 5, 'a', 'b'), ErrTruncated},
		{"notify chanlen 255 past end", raw(append([]byte{byte(TypeNotify), 0, 0, 0, 1, 255}, long64...)...), ErrTruncated},
		{"status empty", raw(byte(TypeStatus)), ErrTruncated},
		{"status no chanlen", raw(byte(TypeStatus), byte(StatusReady)), ErrTruncated},
		{"status chanlen past end", raw(byte(TypeStatus), byte(StatusResync), 3, 'a'), ErrTruncated},

		// Field values.
		{"hello version 0", raw(byte(TypeHello), 0, 0, 0, 0, 1), ErrBadVersion},
		{"hello version 2", raw(byte(TypeHello), 2, 0, 0, 0, 1, 'w'), ErrBadVersion},
		{"hello name 65", raw(append([]byte{byte(TypeHello), 1, 0, 0, 0, 1, 'x'}, long64...)...), ErrNameTooLong},
		{"sub mode 2", raw(byte(TypeSub), 0, 0, 0, 1, 2, 'c'), ErrBadMode},
		{"sub mode 255", raw(byte(TypeSub), 0, 0, 0, 1, 255, 'c'), ErrBadMode},
		{"ack code 5", raw(byte(TypeAck), 0, 0, 0, 1, 5), ErrBadCode},
		{"ack code 255", raw(byte(TypeAck), 0, 0, 0, 1, 255, 'm'), ErrBadCode},
		{"status code 0", raw(byte(TypeStatus), 0, 0), ErrBadCode},
		{"status code 7", raw(byte(TypeStatus), 7, 0), ErrBadCode},
		{"ping trailing", raw(byte(TypePing), 1, 2, 3, 4, 5, 6, 7, 8, 9), ErrTrailing},
		{"pong trailing", raw(byte(TypePong), 1, 2, 3, 4, 5, 6, 7, 8, 0), ErrTrailing},

		// Channels: names.CheckChannel's errors.
		{"sub empty channel", raw(byte(TypeSub), 0, 0, 0, 1, 0), names.ErrChannelEmpty},
		{"sub channel 64", raw(append([]byte{byte(TypeSub), 0, 0, 0, 1, 0}, long64...)...), names.ErrChannelLength},
		{"sub channel NUL", raw(byte(TypeSub), 0, 0, 0, 1, 0, 'a', 0, 'b'), names.ErrChannelNUL},
		{"unsub empty channel", raw(byte(TypeUnsub), 0, 0, 0, 1), names.ErrChannelEmpty},
		{"unsub channel 64", raw(append([]byte{byte(TypeUnsub), 0, 0, 0, 1}, long64...)...), names.ErrChannelLength},
		{"unsub channel NUL", raw(byte(TypeUnsub), 0, 0, 0, 1, 0), names.ErrChannelNUL},
		{"notify empty channel", raw(byte(TypeNotify), 0, 0, 0, 1, 0, 'p'), names.ErrChannelEmpty},
		{"notify channel 64", raw(append([]byte{byte(TypeNotify), 0, 0, 0, 1, 64}, long64...)...), names.ErrChannelLength},
		{"notify channel NUL", raw(byte(TypeNotify), 0, 0, 0, 1, 2, 'a', 0, 'p'), names.ErrChannelNUL},
		{"status channel 64", raw(append([]byte{byte(TypeStatus), byte(StatusResync), 64}, long64...)...), names.ErrChannelLength},
		{"status channel NUL", raw(byte(TypeStatus), byte(StatusResync), 1, 0), names.ErrChannelNUL},

		// Precedence: the first violation in wire order wins.
		{"length before type", hdr(MaxBody+1, 0xff), ErrLength},
		{"truncated before mode", raw(byte(TypeSub), 0, 0, 0), ErrTruncated},
		{"mode before channel", raw(byte(TypeSub), 0, 0, 0, 1, 9), ErrBadMode},
		{"code before chanlen", raw(byte(TypeStatus), 0, 200), ErrBadCode},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, n, err := Decode(tc.in)
			assert.ErrorIs(t, err, tc.err)
			assert.Zero(t, n)
			assert.Zero(t, f.Type)
		})
	}
}

func TestErrorsDistinct(t *testing.T) {
	errs := []error{ErrIncomplete, ErrLength, ErrUnknownType, ErrTruncated, ErrBadVersion, ErrNameTooLong, ErrBadMode, ErrBadCode, ErrTrailing}
	msgs := map[string]bool{}
	for _, e := range errs {
		assert.False(t, msgs[e.Error()], "duplicate %q", e)
		assert.True(t, strings.HasPrefix(e.Error(), "framing: "))
		msgs[e.Error()] = true
	}
}

func TestStrings(t *testing.T) {
	assert.Equal(t, "HELLO", TypeHello.String())
	assert.Equal(t, "SUB", TypeSub.String())
	assert.Equal(t, "UNSUB", TypeUnsub.String())
	assert.Equal(t, "PING", TypePing.String())
	assert.Equal(t, "ACK", TypeAck.String())
	assert.Equal(t, "NOTIFY", TypeNotify.String())
	assert.Equal(t, "STATUS", TypeStatus.String())
	assert.Equal(t, "PONG", TypePong.String())
	assert.Equal(t, "Type(0x05)", Type(5).String())
	assert.Equal(t, "Type(0xff)", Type(0xff).String())
	assert.Equal(t, "LOSSLESS", ModeLossless.String())
	assert.Equal(t, "WAKE", ModeWake.String())
	assert.Equal(t, "Mode(0x02)", Mode(2).String())
	for c, s := range []string{"OK", "BAD_CHANNEL", "LISTEN_FAILED", "LIMIT", "NOT_SUBSCRIBED", "AckCode(0x05)"} {
		assert.Equal(t, s, AckCode(c).String())
	}
	for c, s := range []string{"StatusCode(0x00)", "READY", "LISTENER_DOWN", "RESYNC", "SHUTDOWN", "EVICTED", "PROTOCOL_ERROR", "StatusCode(0x07)"} {
		assert.Equal(t, s, StatusCode(c).String())
	}
}

func TestDirection(t *testing.T) {
	for v := 0; v < 256; v++ {
		ty := Type(v)
		worker := ty == TypeHello || ty == TypeSub || ty == TypeUnsub || ty == TypePing
		hub := ty == TypeAck || ty == TypeNotify || ty == TypeStatus || ty == TypePong
		assert.Equal(t, worker, IsWorkerType(ty), "%v", ty)
		assert.Equal(t, hub, IsHubType(ty), "%v", ty)
	}
}

func TestAppendUnknownType(t *testing.T) {
	f := Frame{Type: 0x42}
	assert.Equal(t, []byte("x"), f.Append([]byte("x")))
}
