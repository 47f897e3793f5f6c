package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version may be set at link time: -ldflags "-X main.version=v1.2.3".
var version = ""

// versionLine is "pgsse VERSION commit REV[+dirty] (TIME) GOVERSION OS/ARCH".
func versionLine() string {
	v, rev, when, dirty := version, "unknown", "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	if dirty {
		rev += "+dirty"
	}
	if when != "" {
		rev += " (" + when + ")"
	}
	return fmt.Sprintf("pgsse %s commit %s %s %s/%s", v, rev, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func cmdVersion(args []string, env func(string) (string, bool), stdout io.Writer) error {
	c := newCLI("version", "", env)
	pos, err := c.parse(args)
	if err != nil {
		return c.helpTo(stdout, err)
	}
	if err := c.noArgs(pos); err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, versionLine())
	return err
}
