package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// Set at link time by `make build` (scripts/ldflags.sh: git describe, the commit and its
// date), so a binary built without VCS stamping (-buildvcs=false, or from a source tarball
// with the values passed in) still names its commit. Empty values fall back to what the Go
// toolchain stamped (debug.ReadBuildInfo), then to "unknown".
var (
	version   = "" // -X main.version=v1.2.3 (git describe --always --dirty)
	commit    = "" // -X main.commit=<full hash>[+dirty]
	buildTime = "" // -X main.buildTime=<commit time, RFC 3339>
)

// versionLine is "pgsse VERSION commit REV[+dirty] (TIME) GOVERSION OS/ARCH".
func versionLine() string {
	v, rev, when, dirty := version, commit, buildTime, false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && rev == "":
				rev = s.Value
			case s.Key == "vcs.time" && when == "":
				when = s.Value
			case s.Key == "vcs.modified" && commit == "":
				dirty = s.Value == "true"
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	if rev == "" {
		rev = "unknown"
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
