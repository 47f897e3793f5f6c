package engine

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"syscall"
)

// hubSocket is the hub's Unix socket file (docs/hub-protocol.md): it never exists with a looser
// mode than --hub-socket-mode, even briefly; a path another live process serves is refused and a
// stale file is replaced.
type hubSocket struct {
	path    string
	mode    os.FileMode
	umask   int // the process umask to restore after the bind
	umasked bool
}

// prepare runs before the bind: it refuses a path another live process serves, replaces a
// stale socket file, and tightens the umask so that the bind creates the socket with no
// looser mode than mode. bound restores the umask and sets the exact mode (call it whether
// the bind worked or not); cleanup removes the file.
func (hs *hubSocket) prepare(path string, mode os.FileMode, log *slog.Logger) (cleanup func(), err error) {
	flag := "--hub-socket " + path + ": "
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, errors.New(flag + "exists and is not a socket; refusing to replace it")
		}
		c, err := net.Dial("unix", path)
		switch {
		case err == nil:
			_ = c.Close()
			return nil, errors.New(flag + "another process is serving it")
		case errors.Is(err, syscall.ECONNREFUSED):
			log.Info("hub: replacing a stale socket file", "path", path)
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, errors.New(flag + "cannot remove the stale socket: " + err.Error())
			}
		case errors.Is(err, syscall.ENOENT):
		default:
			return nil, errors.New(flag + "cannot check whether it is in use: " + err.Error())
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, errors.New(flag + err.Error())
	}
	hs.path, hs.mode = path, mode.Perm()
	hs.umask = syscall.Umask(int(0o777 &^ hs.mode))
	hs.umasked = true
	cleanup = func() {
		hs.restoreUmask()
		if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() == os.ModeSocket {
			_ = os.Remove(path)
		}
	}
	return cleanup, nil
}

func (hs *hubSocket) restoreUmask() {
	if hs.umasked {
		syscall.Umask(hs.umask)
		hs.umasked = false
	}
}

// bound runs once the socket is bound (or the bind failed): the umask goes back and the
// socket gets its exact mode.
func (hs *hubSocket) bound(log *slog.Logger) {
	if hs.path == "" {
		return
	}
	hs.restoreUmask()
	if _, err := os.Lstat(hs.path); errors.Is(err, os.ErrNotExist) {
		return // the bind failed
	}
	if err := os.Chmod(hs.path, hs.mode); err != nil {
		log.Error("hub: cannot set the socket's mode", "path", hs.path, "err", err)
	}
}
