package framing_test

import (
	"encoding/hex"
	"fmt"

	"github.com/pgsse/pgsse/framing"
)

// Each example prints the exact bytes of one frame: the u32 body length,
// the type byte, then the body fields (README, "Hub protocol").

func ExampleAppendHello() {
	b := framing.AppendHello(nil, 4242, []byte("w1"))
	fmt.Println(hex.EncodeToString(b))
	// 00000008 01 01 00001092 7731
	// Output: 000000080101000010927731
}

func ExampleAppendSub() {
	b := framing.AppendSub(nil, 7, framing.ModeLossless, []byte("jobs"))
	fmt.Println(hex.EncodeToString(b))
	// 0000000a 02 00000007 00 6a6f6273
	// Output: 0000000a0200000007006a6f6273
}

func ExampleAppendUnsub() {
	b := framing.AppendUnsub(nil, 8, []byte("jobs"))
	fmt.Println(hex.EncodeToString(b))
	// 00000009 03 00000008 6a6f6273
	// Output: 0000000903000000086a6f6273
}

func ExampleAppendPing() {
	b := framing.AppendPing(nil, 1)
	fmt.Println(hex.EncodeToString(b))
	// 00000009 04 0000000000000001
	// Output: 00000009040000000000000001
}

func ExampleAppendAck() {
	b := framing.AppendAck(nil, 7, framing.AckOK, nil)
	fmt.Println(hex.EncodeToString(b))
	// 00000006 81 00000007 00
	// Output: 00000006810000000700
}

func ExampleAppendNotify() {
	b := framing.AppendNotify(nil, 31337, []byte("jobs"), []byte("42"))
	fmt.Println(hex.EncodeToString(b))
	// 0000000c 82 00007a69 04 6a6f6273 3432
	// Output: 0000000c8200007a69046a6f62733432
}

func ExampleAppendStatus() {
	b := framing.AppendStatus(nil, framing.StatusResync, nil, nil)
	fmt.Println(hex.EncodeToString(b))
	// 00000003 83 03 00   (RESYNC, empty channel = all)
	// Output: 00000003830300
}

func ExampleAppendPong() {
	b := framing.AppendPong(nil, 1)
	fmt.Println(hex.EncodeToString(b))
	// 00000009 84 0000000000000001
	// Output: 00000009840000000000000001
}

func ExampleDecode() {
	src := framing.AppendNotify(nil, 31337, []byte("jobs"), []byte("42"))
	f, n, err := framing.Decode(src)
	fmt.Println(f.Type, f.PID, string(f.Channel), string(f.Text), n, err)
	// Output: NOTIFY 31337 jobs 42 16 <nil>
}

func ExampleDecoder() {
	stream := framing.AppendSub(nil, 1, framing.ModeWake, []byte("jobs"))
	stream = framing.AppendPing(stream, 9)
	var d framing.Decoder
	for _, piece := range [][]byte{stream[:5], stream[5:20], stream[20:]} { // arbitrary reads
		d.Feed(piece)
		for {
			f, err := d.Next()
			if err == framing.ErrIncomplete {
				break
			}
			if err != nil {
				fmt.Println("protocol error:", err)
				return
			}
			switch f.Type {
			case framing.TypeSub:
				fmt.Println(f.Type, f.Req, f.Mode, string(f.Channel))
			case framing.TypePing:
				fmt.Println(f.Type, f.Token)
			}
		}
	}
	// Output:
	// SUB 1 WAKE jobs
	// PING 9
}
