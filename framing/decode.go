package framing

import "encoding/binary"

// Decode decodes the first complete frame in src. n is the number of bytes it
// used (HeaderLen + body length). The Frame's Channel, Name and Text are views
// into src, valid until src is modified or reused; Decode never copies or allocates.
//
// If src holds less than a complete frame, and what it holds is not already
// invalid, Decode returns ErrIncomplete with n == 0. An invalid length is
// reported (ErrLength) as soon as the 4 header bytes are present, and an
// unknown type (ErrUnknownType) as soon as the type byte is, without
// waiting for the rest of the body. On any error n is 0 and f is zero; every
// error but ErrIncomplete is a protocol error on which the peer must be dropped.
func Decode(src []byte) (f Frame, n int, err error) {
	if len(src) < HeaderLen {
		return Frame{}, 0, ErrIncomplete
	}
	size := binary.BigEndian.Uint32(src)
	if size == 0 || size > MaxBody {
		return Frame{}, 0, ErrLength
	}
	if len(src) == HeaderLen {
		return Frame{}, 0, ErrIncomplete
	}
	t := Type(src[HeaderLen])
	if !IsWorkerType(t) && !IsHubType(t) {
		return Frame{}, 0, ErrUnknownType
	}
	n = HeaderLen + int(size)
	if len(src) < n {
		return Frame{}, 0, ErrIncomplete
	}
	body := src[HeaderLen+1 : n : n]
	f.Type = t
	switch t {
	case TypeHello:
		err = decodeHello(&f, body)
	case TypeSub:
		err = decodeSub(&f, body)
	case TypeUnsub:
		err = decodeUnsub(&f, body)
	case TypePing, TypePong:
		err = decodeToken(&f, body)
	case TypeAck:
		err = decodeAck(&f, body)
	case TypeNotify:
		err = decodeNotify(&f, body)
	case TypeStatus:
		err = decodeStatus(&f, body)
	}
	if err != nil {
		return Frame{}, 0, err
	}
	return f, n, nil
}
