package engine

import (
	"context"
	"errors"
	"net"
)

// Server is one pgsse serve process: the gnet loop with its SSE listener and hub socket,
// the LISTEN session, the replay pool and the retention job.
type Server struct {
	cfg Config
}

// New checks cfg and prepares a Server; nothing is started until Run.
func New(cfg Config) (*Server, error) {
	return &Server{cfg: cfg}, nil
}

// Run serves until ctx is cancelled, then shuts down gracefully (SPEC §3 "Shutdown") and
// returns nil; it returns an error if the server cannot start or fails.
func (s *Server) Run(ctx context.Context) error {
	return errors.New("engine: not built yet")
}

// Started is closed once the listeners are bound and the loop runs.
func (s *Server) Started() <-chan struct{} { return nil }

// Addr is the bound SSE address (useful with ":0"); valid after Started.
func (s *Server) Addr() net.Addr { return nil }

// Healthy reports whether the event loop has run recently (/healthz).
func (s *Server) Healthy() bool { return false }

// Ready reports whether the LISTEN session is up and the schema is at the expected
// version (/readyz).
func (s *Server) Ready() bool { return false }
