//go:build !linux

package engine

import "context"

// Without epoll (macOS and the BSDs, for development): no writability set. While a queue holds
// bytes the loop ticks fast (tickFast) and tries every queue on each tick.

// pollQueues: the tick polls the queues.
const pollQueues = true

func (o *outbound) init() error   { o.epfd, o.stopFD = -1, -1; return nil }
func (o *outbound) close()        {}
func (o *outbound) stopWatching() {}

func (o *outbound) watchWritable(ctx context.Context) { <-ctx.Done() }
func (o *outbound) watch(*sseConn)                    {}
func (o *outbound) unwatch(*sseConn)                  {}
