package pglisten

import (
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"

	"github.com/jackc/pgx/v5/pgconn"
)

// ctlMsg is a backend message that answers a command: CommandComplete, EmptyQueryResponse,
// ErrorResponse or ReadyForQuery. The session goroutine matches them to its FIFO of commands.
type ctlMsg struct {
	typ byte
	err *pgconn.PgError // for MsgError
}

// item is what the reader hands the session goroutine: first the batch's notifications, then
// the control messages that followed them, then (last item only) the error that ended the stream.
// This keeps protocol order: a control message is never reported before a notification
// PostgreSQL sent earlier, nor after one it sent later.
type item struct {
	batch *Batch // nil when there are no notifications to deliver
	ctl   []ctlMsg
	err   error
}

// readStream reads backend messages from r and emits them as items until r fails, the stream
// breaks the protocol, or emit returns false. It reads straight into the buffer of the batch
// being built, so a notification's bytes are never copied, except for the tail of a message
// that is split across reads (moved into the next batch's buffer). onRead is called after every
// read that returned data (liveness).
//
// The final item carries the error that ended the stream; it is not sent when emit refused.
func readStream(r io.Reader, emit func(item) bool, onRead func(), log *slog.Logger) {
	b := getBatch()
	var ctl []ctlMsg
	// fail delivers what was parsed before the error, then the error.
	fail := func(err error) {
		if len(b.Notes) > 0 || len(ctl) > 0 {
			it := item{batch: b, ctl: ctl}
			if len(b.Notes) == 0 {
				b.Release()
				it.batch = nil
			}
			if !emit(it) {
				return
			}
		} else {
			b.Release()
		}
		emit(item{err: err})
	}
	for {
		// Here b has no notes, ctl is empty, and b.buf holds only the start of one message.
		if need := partialSize(b.buf); need > cap(b.buf) {
			nb := make([]byte, len(b.buf), need)
			copy(nb, b.buf)
			b.buf = nb
		}
		n, rerr := r.Read(b.buf[len(b.buf):cap(b.buf)])
		b.buf = b.buf[:len(b.buf)+n]
		if n > 0 {
			onRead()
		}
		p := 0
		for {
			msg, m, err := ParseBackend(b.buf[p:])
			if err != nil {
				fail(err)
				return
			}
			if m == 0 {
				break
			}
			switch msg.Type {
			case MsgNotification:
				if len(ctl) > 0 {
					// A notification after a control message: deliver what came before first.
					var it item
					b, it = cut(b, p, ctl)
					ctl = nil
					if !emit(it) {
						b.Release()
						return
					}
					p = 0
					continue
				}
				note, err := ParseNotification(msg.Body)
				if err != nil {
					fail(err)
					return
				}
				b.Notes = append(b.Notes, note)
			case MsgCommandDone, MsgEmptyQueryDone:
				ctl = append(ctl, ctlMsg{typ: msg.Type})
			case MsgReady:
				if _, err := ParseReady(msg.Body); err != nil {
					fail(err)
					return
				}
				ctl = append(ctl, ctlMsg{typ: MsgReady})
			case MsgError:
				pe, err := ParseErrorFields(msg.Body)
				if err != nil {
					fail(err)
					return
				}
				ctl = append(ctl, ctlMsg{typ: MsgError, err: pe})
			case MsgNotice:
				if pe, err := ParseErrorFields(msg.Body); err == nil {
					log.Info("pglisten: notice from PostgreSQL", "severity", pe.Severity, "code", pe.Code, "message", pe.Message)
				}
			default:
				// ParameterStatus and anything else a newer server may send: skipped by length.
			}
			p += m
		}
		if len(b.Notes) > 0 || len(ctl) > 0 {
			var it item
			b, it = cut(b, p, ctl)
			ctl = nil
			if !emit(it) {
				b.Release()
				return
			}
		} else if p > 0 {
			rest := copy(b.buf, b.buf[p:])
			b.buf = b.buf[:rest]
		}
		if rerr != nil {
			if rerr == io.EOF {
				rerr = io.ErrUnexpectedEOF
			}
			fail(fmt.Errorf("pglisten: read: %w", rerr))
			return
		}
	}
}

// cut ends batch b at p: the bytes after p (the start of the next message) move to a fresh
// batch, which is returned together with the item for b and ctl.
func cut(b *Batch, p int, ctl []ctlMsg) (*Batch, item) {
	nb := getBatch()
	nb.buf = append(nb.buf[:0], b.buf[p:]...)
	b.buf = b.buf[:p]
	it := item{batch: b, ctl: ctl}
	if len(b.Notes) == 0 {
		b.Release()
		it.batch = nil
	}
	return nb, it
}

// partialSize is the buffer size needed to hold the whole message that buf starts (buf holds
// less than one message, whose header ParseBackend already validated).
func partialSize(buf []byte) int {
	if len(buf) < 5 {
		return 5
	}
	return int(binary.BigEndian.Uint32(buf[1:5])) + 1
}
