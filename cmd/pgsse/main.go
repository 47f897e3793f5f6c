package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// errReported is a failure already reported (logged, or printed as check lines):
// exit 1, print nothing more.
var errReported = errors.New("failed (reported)")

const topUsage = `Usage: pgsse [command] [flags]

Commands:
  serve      serve SSE, the hub and the admin endpoint (the default)
  migrate    install or upgrade the pgsse schema (--print writes the SQL instead)
  token      mint a token with the configured key and print it
  publish    publish STREAM DATA (durable; --ephemeral for pgsse.broadcast)
  doctor     check the database, limits and hub socket
  version    print the version

Every flag also comes from PGSSE_<NAME> (--max-connections → PGSSE_MAX_CONNECTIONS);
flags win. The database is --database-url, else DATABASE_URL, else PGHOST & co.
Run pgsse help COMMAND (or pgsse COMMAND --help) for the command's flags.
`

// commandList names the commands for error messages, in topUsage's order.
const commandList = "serve, migrate, token, publish, doctor, version"

func knownCommand(name string) bool {
	return slices.Contains(strings.Split(commandList, ", "), name)
}

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr))
}

// run executes one command line and returns the exit status: 0 success, 1 runtime
// failure, 2 bad configuration or usage. Errors are printed as one line on stderr.
func run(ctx context.Context, args []string, env func(string) (string, bool), stdout, stderr io.Writer) int {
	cmd, implicit := "serve", true
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		implicit = false
		cmd, args = args[0], args[1:]
	} else if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
		io.WriteString(stdout, topUsage)
		return 0
	} else if len(args) > 0 && args[0] == "--version" {
		cmd, args, implicit = "version", args[1:], false
	}
	var err error
	switch cmd {
	case "serve":
		err = cmdServe(ctx, args, env, stdout, stderr)
	case "migrate":
		err = cmdMigrate(ctx, args, env, stdout)
	case "token":
		err = cmdToken(args, env, stdout, time.Now())
	case "publish":
		err = cmdPublish(ctx, args, env, stdout)
	case "doctor":
		err = cmdDoctor(ctx, args, env, stdout)
	case "version":
		err = cmdVersion(args, env, stdout)
	case "help":
		// `pgsse help CMD` is `pgsse CMD --help`.
		if len(args) > 0 && knownCommand(args[0]) {
			return run(ctx, []string{args[0], "--help"}, env, stdout, stderr)
		}
		if len(args) > 0 && args[0] != "help" {
			err = configErrorf("help: unknown command %q (commands: %s)", args[0], commandList)
			break
		}
		io.WriteString(stdout, topUsage)
		return 0
	default:
		err = configErrorf("unknown command %q (commands: %s)", cmd, commandList)
	}
	var uf *unknownFlagError
	if implicit && errors.As(err, &uf) {
		// No command was named: say so, rather than name serve as if the user had.
		err = configErrorf("unknown flag --%s (pgsse --help lists the commands; pgsse serve --help the flags of serve, the default command)", uf.flag)
	}
	var ce *configError
	switch {
	case err == nil, errors.Is(err, errHelp):
		return 0
	case errors.Is(err, errReported):
		return 1
	case errors.As(err, &ce):
		fmt.Fprintf(stderr, "pgsse: %s%s\n", oneLine(ce.msg), staleRunEnv(env, runEnvBeside()))
		return 2
	case errors.As(err, &uf):
		fmt.Fprintf(stderr, "pgsse: %s\n", uf.Error())
		return 2
	default:
		fmt.Fprintf(stderr, "pgsse: %s%s\n", oneLine(err.Error()), staleRunEnv(env, runEnvBeside()))
		return 1
	}
}

// The variables `make run` writes into bin/run.env besides pgsse's own (scripts/run.sh): the
// file's path and a stamp of what it handed out (database, secret, hub socket, URLs).
const (
	runEnvVar   = "PGSSE_RUN_ENV"
	runStampVar = "PGSSE_RUN_STAMP"
)

// staleRunEnv is what to add to an error line in a shell whose pgsse variables came from a
// bin/run.env that is out of date — make run restarted with other values (its stamp
// changed), or stopped (the file is gone) — so that the user knows to source it again rather
// than chase a "PostgreSQL is unavailable" or a refused token. In a shell that has sourced
// nothing and set none of pgsse's database or key variables, while make run is running beside
// this binary (beside: bin/run.env next to bin/pgsse), it says to source that file — the first
// thing a new terminal of the tour forgets. "" otherwise.
func staleRunEnv(env func(string) (string, bool), beside string) string {
	path, ok := env(runEnvVar)
	if !ok || path == "" {
		return unsourcedRunEnv(env, beside)
	}
	stamp, _ := env(runStampVar)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return " — make run has stopped since this shell sourced " + path + ": start it, then source it again"
	}
	if err != nil {
		return ""
	}
	defer f.Close()
	data, _ := io.ReadAll(io.LimitReader(f, 64<<10))
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "export "+runStampVar+"="); ok && v != stamp {
			return " — make run restarted with other values since this shell sourced " + path + ": source it again"
		}
	}
	return ""
}

// unsourcedRunEnv is staleRunEnv's line for a shell that did not source the bin/run.env of a
// running make run (the file at beside, written by scripts/run.sh).
func unsourcedRunEnv(env func(string) (string, bool), beside string) string {
	for _, v := range []string{"PGSSE_DATABASE_URL", "DATABASE_URL", "PGSSE_JWT_SECRET"} {
		if x, ok := env(v); ok && x != "" {
			return "" // configured by hand: make run's variables are not what is missing
		}
	}
	if beside == "" {
		return ""
	}
	data, err := os.ReadFile(beside)
	if err != nil || !strings.Contains(string(data), "\nexport "+runEnvVar+"=") {
		return ""
	}
	return " — make run is running in this checkout, but this shell has not taken its variables: source " + beside
}

// runEnvBeside is where make run writes its variables for this binary: bin/run.env beside
// bin/pgsse; "" when the executable's path is unknown.
func runEnvBeside() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	return filepath.Join(filepath.Dir(exe), "run.env")
}

// helpTo prints the usage on w when err asks for help, and returns err.
func (c *cli) helpTo(w io.Writer, err error) error {
	if errors.Is(err, errHelp) {
		c.usage(w)
	}
	return err
}

// commandSummary is the command's line in topUsage (its one home), e.g. for publish
// "publish STREAM DATA (durable; --ephemeral for pgsse.broadcast)"; "" if it has none.
func commandSummary(name string) string {
	for _, line := range strings.Split(topUsage, "\n") {
		if rest, ok := strings.CutPrefix(line, "  "+name+" "); ok {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}
