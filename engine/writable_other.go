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

func (s *Server) watchWritable(ctx context.Context) { <-ctx.Done() }
func (s *Server) watch(*sseConn)                    {}
func (s *Server) unwatch(*sseConn)                  {}
func (s *Server) watchWorker(*worker)               {}

// unsentBytes: without SIOCOUTQ the kernel's queue is not known; 0.
func unsentBytes(int) int { return 0 }
