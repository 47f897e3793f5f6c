package engine

import (
	"context"
	"fmt"
	"log/slog"
	"os"
)

// gnetLogger routes gnet's own log lines into slog.
type gnetLogger struct{ l *slog.Logger }

func (g gnetLogger) Debugf(f string, a ...any) { g.log(slog.LevelDebug, f, a) }
func (g gnetLogger) Infof(f string, a ...any)  { g.log(slog.LevelDebug, f, a) } // gnet's info is chatty
func (g gnetLogger) Warnf(f string, a ...any)  { g.log(slog.LevelWarn, f, a) }
func (g gnetLogger) Errorf(f string, a ...any) { g.log(slog.LevelError, f, a) }
func (g gnetLogger) Fatalf(f string, a ...any) {
	g.log(slog.LevelError, f, a)
	os.Exit(1)
}

func (g gnetLogger) log(level slog.Level, f string, a []any) {
	if g.l.Enabled(context.Background(), level) {
		g.l.Log(context.Background(), level, "gnet: "+fmt.Sprintf(f, a...))
	}
}
