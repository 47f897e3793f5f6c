package framing

import (
	"errors"
	"strconv"

	"github.com/pgsse/pgsse/names"
)

// Wire constants.
const (
	HeaderLen = 4     // the u32 body length
	MaxBody   = 65536 // largest announced body length N, type byte included
	Version   = 1     // HELLO protocol version
	MaxName   = 64    // longest HELLO worker name
)

// Type is a frame's first body byte.
type Type uint8

// Frame types. 0x0_ travel worker→hub, 0x8_ hub→worker.
const (
	TypeHello  Type = 0x01
	TypeSub    Type = 0x02
	TypeUnsub  Type = 0x03
	TypePing   Type = 0x04
	TypeAck    Type = 0x81
	TypeNotify Type = 0x82
	TypeStatus Type = 0x83
	TypePong   Type = 0x84
)

// String returns the protocol name of t ("SUB"), or "Type(0x..)" if unknown.
func (t Type) String() string {
	switch t {
	case TypeHello:
		return "HELLO"
	case TypeSub:
		return "SUB"
	case TypeUnsub:
		return "UNSUB"
	case TypePing:
		return "PING"
	case TypeAck:
		return "ACK"
	case TypeNotify:
		return "NOTIFY"
	case TypeStatus:
		return "STATUS"
	case TypePong:
		return "PONG"
	}
	return unknown("Type", uint8(t))
}

// IsWorkerType reports whether t is a frame a worker sends (HELLO, SUB, UNSUB, PING).
func IsWorkerType(t Type) bool { return t >= TypeHello && t <= TypePing }

// IsHubType reports whether t is a frame the hub sends (ACK, NOTIFY, STATUS, PONG).
func IsHubType(t Type) bool { return t >= TypeAck && t <= TypePong }

// Mode is how the hub delivers a channel's notifications to one worker: the SUB frame's mode
// byte (docs/hub-protocol.md). It is the one name for this idea: the hub (engine) and the worker
// client (pglisten.HubConfig.Mode) both use it.
type Mode uint8

// SUB modes.
const (
	// ModeLossless: every notification is delivered; a worker that cannot keep up is evicted.
	ModeLossless Mode = 0
	// ModeWake: when the worker falls behind, a channel's notifications collapse into one
	// STATUS RESYNC for that channel, queued once the worker has caught up. Never evicted for lag.
	ModeWake Mode = 1
)

// String returns the mode's name ("LOSSLESS", "WAKE"), or "Mode(0x..)" if unknown.
func (m Mode) String() string { return name(modeNames[:], "Mode", uint8(m)) }

var modeNames = [...]string{ModeLossless: "LOSSLESS", ModeWake: "WAKE"}

// AckCode is an ACK frame's code (Frame.Ack): how the hub answered a SUB or UNSUB.
type AckCode uint8

// ACK codes.
const (
	AckOK            AckCode = 0
	AckBadChannel    AckCode = 1
	AckListenFailed  AckCode = 2
	AckLimit         AckCode = 3
	AckNotSubscribed AckCode = 4
)

// String returns the code's protocol name ("BAD_CHANNEL"), or "AckCode(0x..)" if unknown.
func (c AckCode) String() string { return name(ackNames[:], "AckCode", uint8(c)) }

var ackNames = [...]string{
	AckOK:            "OK",
	AckBadChannel:    "BAD_CHANNEL",
	AckListenFailed:  "LISTEN_FAILED",
	AckLimit:         "LIMIT",
	AckNotSubscribed: "NOT_SUBSCRIBED",
}

// StatusCode is a STATUS frame's code (Frame.Status): what the hub tells a worker.
type StatusCode uint8

// STATUS codes.
const (
	StatusReady         StatusCode = 1
	StatusListenerDown  StatusCode = 2
	StatusResync        StatusCode = 3
	StatusShutdown      StatusCode = 4
	StatusEvicted       StatusCode = 5
	StatusProtocolError StatusCode = 6
)

// String returns the code's protocol name ("RESYNC"), or "StatusCode(0x..)" if unknown.
func (c StatusCode) String() string { return name(statusNames[:], "StatusCode", uint8(c)) }

var statusNames = [...]string{
	StatusReady:         "READY",
	StatusListenerDown:  "LISTENER_DOWN",
	StatusResync:        "RESYNC",
	StatusShutdown:      "SHUTDOWN",
	StatusEvicted:       "EVICTED",
	StatusProtocolError: "PROTOCOL_ERROR",
}

// name is names[v], or "kind(0x..)" when v has no name.
func name(names []string, kind string, v uint8) string {
	if int(v) < len(names) && names[v] != "" {
		return names[v]
	}
	return unknown(kind, v)
}

func unknown(kind string, v uint8) string {
	return kind + "(0x" + strconv.FormatUint(uint64(v)|0x100, 16)[1:] + ")"
}

// Decode errors. Every error except ErrIncomplete means the byte stream is
// not the hub protocol and the connection must be closed (docs/hub-protocol.md). Channel
// rule violations are reported with the errors of package names
// (names.ErrChannelEmpty, names.ErrChannelLength, names.ErrChannelNUL).
var (
	ErrIncomplete  = errors.New("framing: incomplete frame, need more bytes")
	ErrLength      = errors.New("framing: frame length must be 1-65536 bytes")
	ErrUnknownType = errors.New("framing: unknown frame type")
	ErrTruncated   = errors.New("framing: frame body ends inside a field")
	ErrBadVersion  = errors.New("framing: HELLO version must be 1")
	ErrNameTooLong = errors.New("framing: HELLO name must be at most 64 bytes")
	ErrBadMode     = errors.New("framing: SUB mode must be 0 (lossless) or 1 (wake)")
	ErrBadCode     = errors.New("framing: ACK code must be 0-4 and STATUS code 1-6")
	ErrTrailing    = errors.New("framing: PING/PONG body must be exactly a u64 token")
)

// Frame is one decoded frame. Which fields are meaningful depends on Type;
// the others are zero. Channel, Name and Text are views into the decoded
// input (see Decode and Decoder.Next for their lifetime); copy them to keep them.
type Frame struct {
	Type    Type
	Version uint8      // HELLO
	PID     uint32     // HELLO, NOTIFY
	Req     uint32     // SUB, UNSUB, ACK
	Mode    Mode       // SUB
	Ack     AckCode    // ACK
	Status  StatusCode // STATUS
	Token   uint64     // PING, PONG
	Channel []byte     // SUB, UNSUB, NOTIFY, STATUS   (view)
	Name    []byte     // HELLO                        (view)
	Text    []byte     // ACK message, STATUS text, NOTIFY payload (view)
}

// Append re-encodes f and appends it to dst. A frame returned by Decode
// re-encodes to exactly the bytes it was decoded from. A Frame with an
// unknown Type appends nothing. Like the AppendX functions it trusts its
// fields' lengths.
func (f *Frame) Append(dst []byte) []byte {
	switch f.Type {
	case TypeHello:
		return AppendHello(dst, f.PID, f.Name)
	case TypeSub:
		return AppendSub(dst, f.Req, f.Mode, f.Channel)
	case TypeUnsub:
		return AppendUnsub(dst, f.Req, f.Channel)
	case TypePing:
		return AppendPing(dst, f.Token)
	case TypeAck:
		return AppendAck(dst, f.Req, f.Ack, f.Text)
	case TypeNotify:
		return AppendNotify(dst, f.PID, f.Channel, f.Text)
	case TypeStatus:
		return AppendStatus(dst, f.Status, f.Channel, f.Text)
	case TypePong:
		return AppendPong(dst, f.Token)
	}
	return dst
}

// checkChannel applies the names rule to SUB/UNSUB/NOTIFY channels.
func checkChannel(ch []byte) error { return names.CheckChannel(ch) }
