package bench

// The event data of the load scenarios; the stream itself is decoded with
// internal/testkit/ssetest's Decoder (client.go).

// AppendData appends the benchmark's event data: "<seq> <sendUnixNano>" padded with 'x' to
// size bytes (never shorter than the two numbers).
func AppendData(dst []byte, seq, sendNs int64, size int) []byte {
	start := len(dst)
	dst = appendInt(dst, seq)
	dst = append(dst, ' ')
	dst = appendInt(dst, sendNs)
	for len(dst)-start < size {
		dst = append(dst, 'x')
	}
	return dst
}

// ParseData reads what AppendData wrote; ok is false for anything else.
func ParseData(v []byte) (seq, sendNs int64, ok bool) {
	i := 0
	seq, i, ok = parseDigits(v, i)
	if !ok || i >= len(v) || v[i] != ' ' {
		return 0, 0, false
	}
	sendNs, _, ok = parseDigits(v, i+1)
	return seq, sendNs, ok
}

func parseDigits(v []byte, i int) (int64, int, bool) {
	start := i
	var n int64
	for i < len(v) && v[i] >= '0' && v[i] <= '9' && i-start < 19 {
		n = n*10 + int64(v[i]-'0')
		i++
	}
	return n, i, i > start
}

func appendInt(dst []byte, n int64) []byte {
	var b [20]byte
	i := len(b)
	if n == 0 {
		return append(dst, '0')
	}
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return append(dst, b[i:]...)
}
