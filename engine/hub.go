package engine

import (
	"github.com/panjf2000/gnet/v2"
)

// The hub (SPEC §5) shares the loop with the SSE listener. These hooks are where the
// hub's worker sessions plug into the loop; until the hub lands they do nothing.

type worker struct{}

type hubState struct{}

func (h *hubState) count() int { return 0 }

type hubChannel struct{}

func (s *Server) prepareHubSocket() (string, func(), error) {
	return "unix://" + s.cfg.HubSocket, func() {}, nil
}
func (s *Server) afterHubBind()                           {}
func (s *Server) isHubConn(gnet.Conn) bool                { return false }
func (s *Server) hubOpen(gnet.Conn) ([]byte, gnet.Action) { return nil, gnet.Close }
func (s *Server) hubClose(*worker)                        {}
func (s *Server) hubTraffic(*worker)                      {}
func (s *Server) hubChannelLive(*channel)                 {}
func (s *Server) hubChannelFailed(*channel, error)        {}
func (s *Server) hubNotify(*channel, uint32, []byte)      {}
func (s *Server) hubFlush()                               {}
func (s *Server) hubTick()                                {}
func (s *Server) hubShutdown()                            {}
func (s *Server) hubListenerDown()                        {}
func (s *Server) hubResync()                              {}
