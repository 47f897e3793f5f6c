package framing

import "encoding/binary"

// Encoders append one complete frame to dst and return the extended slice;
// they never allocate when dst has room for the frame. They trust their
// caller for lengths, as pgproto3's Encode does: a channel must be 1–63
// bytes without NUL (STATUS: 0–63), a HELLO name at most MaxName bytes and
// the whole body at most MaxBody bytes. Frames that break these rules are
// rejected by the peer's Decode, so validate untrusted input (names.CheckChannel)
// before encoding it.
//
// Decoders (decodeX) get the body after the type byte and fill f with views
// into it, each capped at its own end (full slice expression) so that an
// append to a view can never overwrite the bytes after it.

// begin appends the length placeholder and the type byte; finish back-patches
// the length. start is where the frame begins in dst.
func begin(dst []byte, t Type) ([]byte, int) {
	start := len(dst)
	return append(dst, 0, 0, 0, 0, byte(t)), start
}

func finish(dst []byte, start int) []byte {
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-HeaderLen))
	return dst
}

// HELLO: u8 version, u32 pid, name (rest, ≤ MaxName).

// AppendHello appends a HELLO frame announcing protocol Version, the worker's
// pid and its name (≤ MaxName bytes, for logs and metrics).
func AppendHello(dst []byte, pid uint32, name []byte) []byte {
	dst, start := begin(dst, TypeHello)
	dst = append(dst, Version)
	dst = binary.BigEndian.AppendUint32(dst, pid)
	dst = append(dst, name...)
	return finish(dst, start)
}

func decodeHello(f *Frame, b []byte) error {
	if len(b) < 5 {
		return ErrTruncated
	}
	if b[0] != Version {
		return ErrBadVersion
	}
	if len(b)-5 > MaxName {
		return ErrNameTooLong
	}
	f.Version = b[0]
	f.PID = binary.BigEndian.Uint32(b[1:])
	f.Name = b[5:len(b):len(b)]
	return nil
}

// SUB: u32 req, u8 mode, channel (rest).

// AppendSub appends a SUB frame: subscribe to channel in mode ModeLossless or
// ModeWake; req is echoed in the ACK.
func AppendSub(dst []byte, req uint32, mode Mode, channel []byte) []byte {
	dst, start := begin(dst, TypeSub)
	dst = binary.BigEndian.AppendUint32(dst, req)
	dst = append(dst, byte(mode))
	dst = append(dst, channel...)
	return finish(dst, start)
}

func decodeSub(f *Frame, b []byte) error {
	if len(b) < 5 {
		return ErrTruncated
	}
	if Mode(b[4]) > ModeWake {
		return ErrBadMode
	}
	if err := checkChannel(b[5:]); err != nil {
		return err
	}
	f.Req = binary.BigEndian.Uint32(b)
	f.Mode = Mode(b[4])
	f.Channel = b[5:len(b):len(b)]
	return nil
}

// UNSUB: u32 req, channel (rest).

// AppendUnsub appends an UNSUB frame for channel; req is echoed in the ACK.
func AppendUnsub(dst []byte, req uint32, channel []byte) []byte {
	dst, start := begin(dst, TypeUnsub)
	dst = binary.BigEndian.AppendUint32(dst, req)
	dst = append(dst, channel...)
	return finish(dst, start)
}

func decodeUnsub(f *Frame, b []byte) error {
	if len(b) < 4 {
		return ErrTruncated
	}
	if err := checkChannel(b[4:]); err != nil {
		return err
	}
	f.Req = binary.BigEndian.Uint32(b)
	f.Channel = b[4:len(b):len(b)]
	return nil
}

// PING / PONG: u64 token, nothing after it.

// AppendPing appends a PING frame; the hub answers with a PONG carrying token.
func AppendPing(dst []byte, token uint64) []byte {
	dst, start := begin(dst, TypePing)
	dst = binary.BigEndian.AppendUint64(dst, token)
	return finish(dst, start)
}

// AppendPong appends a PONG frame answering the PING that carried token.
func AppendPong(dst []byte, token uint64) []byte {
	dst, start := begin(dst, TypePong)
	dst = binary.BigEndian.AppendUint64(dst, token)
	return finish(dst, start)
}

func decodeToken(f *Frame, b []byte) error {
	if len(b) < 8 {
		return ErrTruncated
	}
	if len(b) > 8 {
		return ErrTrailing
	}
	f.Token = binary.BigEndian.Uint64(b)
	return nil
}

// ACK: u32 req, u8 code, message (rest).

// AppendAck appends an ACK frame answering request req with code (AckOK …
// AckNotSubscribed) and a human-readable msg (may be empty).
func AppendAck(dst []byte, req uint32, code AckCode, msg []byte) []byte {
	dst, start := begin(dst, TypeAck)
	dst = binary.BigEndian.AppendUint32(dst, req)
	dst = append(dst, byte(code))
	dst = append(dst, msg...)
	return finish(dst, start)
}

func decodeAck(f *Frame, b []byte) error {
	if len(b) < 5 {
		return ErrTruncated
	}
	if AckCode(b[4]) > AckNotSubscribed {
		return ErrBadCode
	}
	f.Req = binary.BigEndian.Uint32(b)
	f.Ack = AckCode(b[4])
	f.Text = b[5:len(b):len(b)]
	return nil
}

// NOTIFY: u32 pid, u8 chanlen, channel, payload (rest).

// AppendNotify appends a NOTIFY frame: a notification from PostgreSQL backend
// pid on channel (1–63 bytes) with payload exactly as PostgreSQL sent it.
func AppendNotify(dst []byte, pid uint32, channel, payload []byte) []byte {
	dst, start := begin(dst, TypeNotify)
	dst = binary.BigEndian.AppendUint32(dst, pid)
	dst = append(dst, byte(len(channel)))
	dst = append(dst, channel...)
	dst = append(dst, payload...)
	return finish(dst, start)
}

func decodeNotify(f *Frame, b []byte) error {
	if len(b) < 5 {
		return ErrTruncated
	}
	end := 5 + int(b[4])
	if end > len(b) {
		return ErrTruncated
	}
	if err := checkChannel(b[5:end]); err != nil {
		return err
	}
	f.PID = binary.BigEndian.Uint32(b)
	f.Channel = b[5:end:end]
	f.Text = b[end:len(b):len(b)]
	return nil
}

// STATUS: u8 code, u8 chanlen, channel (may be empty), text (rest).

// AppendStatus appends a STATUS frame with code (StatusReady …
// StatusProtocolError), the channel it concerns (empty = all, ≤ 63 bytes)
// and a human-readable text (may be empty).
func AppendStatus(dst []byte, code StatusCode, channel, text []byte) []byte {
	dst, start := begin(dst, TypeStatus)
	dst = append(dst, byte(code), byte(len(channel)))
	dst = append(dst, channel...)
	dst = append(dst, text...)
	return finish(dst, start)
}

func decodeStatus(f *Frame, b []byte) error {
	if len(b) < 2 {
		return ErrTruncated
	}
	if c := StatusCode(b[0]); c < StatusReady || c > StatusProtocolError {
		return ErrBadCode
	}
	end := 2 + int(b[1])
	if end > len(b) {
		return ErrTruncated
	}
	if end > 2 { // empty means "all channels"
		if err := checkChannel(b[2:end]); err != nil {
			return err
		}
	}
	f.Status = StatusCode(b[0])
	f.Channel = b[2:end:end]
	f.Text = b[end:len(b):len(b)]
	return nil
}
