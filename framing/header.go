package framing

import "encoding/binary"

// Frame headers read without decoding the body. Decode is the only judge of whether bytes
// from a peer are a valid frame; these helpers serve the hub's bookkeeping around it: walking
// frames it encoded itself (WholeFrames), and answering a request Decode refused for its
// channel name (PeekRequest).

// PeekRequest reads the request id of the SUB or UNSUB frame at the start of src and returns it
// with the frame's length (header included). It checks the length, the type and that the body
// holds the request id — nothing else, so the channel may break the name rules. ok is false
// when src does not start with a complete SUB or UNSUB frame. The hub uses it to answer a
// request whose channel Decode refused (ACK BAD_CHANNEL) and to step over it.
func PeekRequest(src []byte) (req uint32, n int, ok bool) {
	const minBody = 1 + 4 // type, u32 req
	if len(src) < HeaderLen+minBody {
		return 0, 0, false
	}
	size := binary.BigEndian.Uint32(src)
	if size < minBody || size > MaxBody {
		return 0, 0, false
	}
	n = HeaderLen + int(size)
	if t := Type(src[HeaderLen]); n > len(src) || (t != TypeSub && t != TypeUnsub) {
		return 0, 0, false
	}
	return binary.BigEndian.Uint32(src[HeaderLen+1:]), n, true
}

// WholeFrames returns how many bytes at the start of a stream of well-formed frames, given as
// the concatenation of a and b (the two views of a ring buffer), form whole frames: at most
// limit bytes, except that a first frame longer than limit counts whole. A header split
// between a and b is read across the seam. It trusts the length headers, so use it only on
// frames this process encoded.
func WholeFrames(a, b []byte, limit int) int {
	total := len(a) + len(b)
	off := 0
	for off+HeaderLen <= total {
		var hdr [HeaderLen]byte
		for i := range hdr {
			if j := off + i; j < len(a) {
				hdr[i] = a[j]
			} else {
				hdr[i] = b[j-len(a)]
			}
		}
		l := HeaderLen + int(binary.BigEndian.Uint32(hdr[:]))
		if off+l > total || (off > 0 && off+l > limit) {
			break
		}
		off += l
	}
	return off
}
