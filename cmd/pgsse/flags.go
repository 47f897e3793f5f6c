package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgsse/pgsse/engine"
)

// errHelp asks for the usage text on stdout and exit status 0.
var errHelp = errors.New("help requested")

// configError is bad configuration: one line, exit status 2.
type configError struct{ msg string }

func (e *configError) Error() string { return e.msg }

func configErrorf(format string, args ...any) error {
	return &configError{msg: fmt.Sprintf(format, args...)}
}

// unknownFlagError is a flag the command does not have; run() words it (configuration, exit 2).
type unknownFlagError struct{ cmd, flag string }

func (e *unknownFlagError) Error() string {
	return fmt.Sprintf("%s: unknown flag --%s (pgsse %s --help lists its flags)", e.cmd, e.flag, e.cmd)
}

// cli is one subcommand's flags. It uses a standard flag.FlagSet as the registry of
// flags and their typed values, but parses the arguments itself so that flags and
// positional arguments may be interleaved, both `--name=value` and `--name value` work,
// every error names the flag or variable, and nothing but that one line is printed.
type cli struct {
	name     string // subcommand, for usage
	synopsis string // e.g. "STREAM DATA [flags]"
	fs       *flag.FlagSet
	env      func(string) (string, bool)
	onCmd    map[string]bool   // flags given on the command line
	fromEnv  map[string]string // flag → environment variable it was taken from
	groups   [][]string        // flags where a command-line value masks the others' env values
	envSplit map[string]bool   // repeatable flags whose env value is comma-separated
	dbSource string            // where database() took the connection string from, for errors
	dbNone   bool              // nothing named a database: libpq's defaults (explainConnect)
	dbConfig *pgconn.Config    // what database() parsed, for explainConnect
}

func newCLI(name, synopsis string, env func(string) (string, bool)) *cli {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return &cli{
		name: name, synopsis: synopsis, fs: fs, env: env,
		onCmd: map[string]bool{}, fromEnv: map[string]string{}, envSplit: map[string]bool{},
	}
}

// envName is the variable for a flag: --max-connections → PGSSE_MAX_CONNECTIONS.
func envName(flagName string) string {
	return "PGSSE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// source names a flag for an error message about its value: "--hub-socket", or
// "--hub-socket (from PGSSE_HUB_SOCKET)" when the environment set it — a user who never typed
// the flag (a sourced bin/run.env, a systemd EnvironmentFile) learns which variable to fix or
// unset. Every message about a flag's value names it through source or attribute.
func (c *cli) source(name string) string {
	if v, ok := c.fromEnv[name]; ok {
		return fromVariable(name, v)
	}
	return "--" + name
}

func fromVariable(flagName, variable string) string {
	return "--" + flagName + " (from " + variable + ")"
}

// attribute is source for a message written elsewhere (the engine's "--listen ADDR: …",
// "--hub-socket PATH: …"): the first mention of each flag the environment set, as a whole
// word, becomes source's form.
func (c *cli) attribute(msg string) string {
	for name, variable := range c.fromEnv {
		flag := "--" + name
		for i := 0; i+len(flag) <= len(msg); {
			j := strings.Index(msg[i:], flag)
			if j < 0 {
				break
			}
			j += i
			end := j + len(flag)
			if (j == 0 || !isFlagByte(msg[j-1])) && (end == len(msg) || !isFlagByte(msg[end])) {
				if !strings.HasPrefix(msg[end:], " (from ") {
					msg = msg[:j] + fromVariable(name, variable) + msg[end:]
				}
				break
			}
			i = end
		}
	}
	return msg
}

// isFlagByte: a byte that can continue a flag's name (so "--jwt-secret" is not found in
// "--jwt-secret-file").
func isFlagByte(b byte) bool { return b == '-' || b >= 'a' && b <= 'z' || b >= '0' && b <= '9' }

// isSet reports whether the flag was given on the command line or in the environment.
func (c *cli) isSet(name string) bool { return c.onCmd[name] || c.fromEnv[name] != "" }

// exclusive declares flags of which only one may be used; a command-line value for one
// of them masks environment values for the others (flags win).
func (c *cli) exclusive(names ...string) { c.groups = append(c.groups, names) }

// parse reads args (flags and positional arguments in any order; "--" ends flags), then
// fills every flag not given on the command line from its PGSSE_* variable.
func (c *cli) parse(args []string) ([]string, error) {
	var pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			pos = append(pos, a)
			continue
		}
		name := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		value, hasValue := "", false
		if j := strings.IndexByte(name, '='); j >= 0 {
			name, value, hasValue = name[:j], name[j+1:], true
		}
		f := c.fs.Lookup(name)
		if f == nil {
			if name == "h" || name == "help" {
				return nil, errHelp
			}
			return nil, &unknownFlagError{cmd: c.name, flag: name}
		}
		if !hasValue {
			if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && bf.IsBoolFlag() {
				value = "true"
			} else if i+1 < len(args) {
				i++
				value = args[i]
			} else {
				return nil, configErrorf("--%s: needs a value", name)
			}
		}
		if err := c.fs.Set(name, value); err != nil {
			return nil, configErrorf("--%s: %v", name, err)
		}
		c.onCmd[name] = true
	}
	if err := c.applyEnv(); err != nil {
		return nil, err
	}
	return pos, nil
}

func (c *cli) masked(name string) bool {
	for _, g := range c.groups {
		in, other := false, false
		for _, n := range g {
			if n == name {
				in = true
			} else if c.onCmd[n] {
				other = true
			}
		}
		if in && other {
			return true
		}
	}
	return false
}

func (c *cli) applyEnv() error {
	var err error
	c.fs.VisitAll(func(f *flag.Flag) {
		if err != nil || c.onCmd[f.Name] || c.masked(f.Name) {
			return
		}
		key := envName(f.Name)
		v, ok := c.env(key)
		if !ok || v == "" { // an empty variable counts as unset
			return
		}
		values := []string{v}
		if c.envSplit[f.Name] {
			values = splitList(v)
		}
		for _, v := range values {
			if e := c.fs.Set(f.Name, v); e != nil {
				err = configErrorf("%s: %v", fromVariable(f.Name, key), e)
				return
			}
		}
		c.fromEnv[f.Name] = key
	})
	return err
}

// noArgs rejects positional arguments for subcommands that take none.
func (c *cli) noArgs(pos []string) error {
	if len(pos) > 0 {
		return configErrorf("%s: unexpected argument %q", c.name, pos[0])
	}
	return nil
}

// usage writes the subcommand's synopsis and its flags with placeholders, defaults and
// variables. A flag's placeholder is the back-quoted word in its usage text (e.g.
// "stream `PATTERN` to grant"), else one derived from its type.
func (c *cli) usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: pgsse %s\n", strings.TrimSpace(c.name+" "+c.synopsis))
	if s := commandSummary(c.name); s != "" {
		fmt.Fprintf(w, "\n%s%s.\n", strings.ToUpper(s[:1]), s[1:])
	}
	if c.name == "serve" {
		fmt.Fprint(w, serveSignals)
	}
	var lines [][2]string
	c.fs.VisitAll(func(f *flag.Flag) {
		left := "  --" + f.Name
		hint, right := flag.UnquoteUsage(f)
		if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !bf.IsBoolFlag() {
			if hint == "" || hint == "value" {
				hint = valueHint(f.Value)
			}
			left += " " + hint
		}
		if f.DefValue != "" && f.DefValue != "false" && !strings.Contains(right, "(default") {
			right += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		lines = append(lines, [2]string{left, right + " [" + envName(f.Name) + "]"})
	})
	if len(lines) == 0 {
		return
	}
	fmt.Fprintf(w, "\nFlags (each also from PGSSE_<NAME>; flags win):\n")
	sort.Slice(lines, func(i, j int) bool { return lines[i][0] < lines[j][0] })
	width := 0
	for _, l := range lines {
		width = max(width, len(l[0]))
	}
	for _, l := range lines {
		fmt.Fprintf(w, "%-*s  %s\n", width, l[0], l[1])
	}
}

// serveSignals is what pgsse serve does on each signal (SPEC §6).
const serveSignals = `
Signals: SIGTERM or SIGINT drains and exits. SIGUSR2 starts the executable at the same path
as a successor and hands it every connection and listener, then exits 0: an upgrade no
client notices (docs/operations.md, Upgrading without disconnects).
`

// valueHint is the placeholder for a flag whose usage text names none.
func valueHint(v flag.Value) string {
	switch v.(type) {
	case *durationValue:
		return "DURATION"
	case *intValue:
		return "N"
	case *sizeValue:
		return "SIZE"
	case *modeValue:
		return "MODE"
	case *listValue:
		return "A,B,…"
	case *procsValue:
		return "N|auto"
	default:
		return "TEXT"
	}
}

// Flag values. Their Set errors are the text after "--name: ".

type stringValue string

func (s *stringValue) Set(v string) error { *s = stringValue(v); return nil }
func (s *stringValue) String() string     { return string(*s) }

type boolValue bool

func (b *boolValue) Set(v string) error {
	x, err := strconv.ParseBool(v)
	if err != nil {
		return fmt.Errorf("invalid boolean %q (use true or false)", v)
	}
	*b = boolValue(x)
	return nil
}
func (b *boolValue) String() string   { return strconv.FormatBool(bool(*b)) }
func (b *boolValue) IsBoolFlag() bool { return true }

type intValue int

func (n *intValue) Set(v string) error {
	x, err := strconv.Atoi(v)
	if err != nil {
		return fmt.Errorf("invalid integer %q", v)
	}
	*n = intValue(x)
	return nil
}
func (n *intValue) String() string { return strconv.Itoa(int(*n)) }

type durationValue time.Duration

func (d *durationValue) Set(v string) error {
	x, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("invalid duration %q (e.g. 15s, 2m, 1h30m)", v)
	}
	*d = durationValue(x)
	return nil
}
func (d *durationValue) String() string {
	s := time.Duration(*d).String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// sizeValue is a byte count: 1048576, 64KiB, 1MiB, 1GiB (suffix case-insensitive).
type sizeValue int64

func (s *sizeValue) Set(v string) error {
	x, err := parseSize(v)
	if err != nil {
		return err
	}
	*s = sizeValue(x)
	return nil
}
func (s *sizeValue) String() string { return formatSize(int64(*s)) }

func parseSize(v string) (int64, error) {
	bad := fmt.Errorf("invalid size %q (bytes, or with a KiB, MiB or GiB suffix, e.g. 1MiB)", v)
	i := 0
	for i < len(v) && v[i] >= '0' && v[i] <= '9' {
		i++
	}
	if i == 0 || i > 12 {
		return 0, bad
	}
	n, err := strconv.ParseInt(v[:i], 10, 64)
	if err != nil {
		return 0, bad
	}
	var mult int64
	switch strings.ToLower(v[i:]) {
	case "", "b":
		mult = 1
	case "kib":
		mult = 1 << 10
	case "mib":
		mult = 1 << 20
	case "gib":
		mult = 1 << 30
	default:
		return 0, bad
	}
	return n * mult, nil
}

// formatSize writes a byte count as docs/operations.md's flag table writes the defaults: whole
// GiB or MiB with the suffix (1MiB), anything else in bytes (8192).
func formatSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + "GiB"
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + "MiB"
	}
	return strconv.FormatInt(n, 10)
}

// modeValue is a Unix permission mode in octal: 0600, 660, 0o660.
type modeValue os.FileMode

func (m *modeValue) Set(v string) error {
	s := strings.TrimPrefix(strings.TrimPrefix(v, "0o"), "0O")
	x, err := strconv.ParseUint(s, 8, 32)
	if err != nil || s == "" {
		return fmt.Errorf("invalid mode %q (octal, e.g. 0600)", v)
	}
	if x > 0o777 {
		return fmt.Errorf("mode %q out of range (0000-0777)", v)
	}
	*m = modeValue(x)
	return nil
}
func (m *modeValue) String() string { return fmt.Sprintf("%04o", uint32(*m)) }

// procsValue is --procs: a process count from 1 to engine.MaxProcs, or "auto" (one per CPU,
// engine.ProcsAuto).
type procsValue int

func (p *procsValue) Set(v string) error {
	if strings.EqualFold(v, "auto") {
		*p = procsValue(engine.ProcsAuto())
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > engine.MaxProcs {
		return fmt.Errorf("invalid process count %q (1 to %d, or auto for one per CPU)", v, engine.MaxProcs)
	}
	*p = procsValue(n)
	return nil
}
func (p *procsValue) String() string { return strconv.Itoa(int(*p)) }

// listValue is comma-separated (e.g. --cors-origins a,b); repeating the flag appends.
type listValue []string

func (l *listValue) Set(v string) error {
	for _, e := range splitList(v) {
		if e == "" {
			return fmt.Errorf("empty entry in %q", v)
		}
		*l = append(*l, e)
	}
	return nil
}
func (l *listValue) String() string { return strings.Join(*l, ",") }

// multiValue takes one value per occurrence (--stream a --stream b); in the environment
// the values are comma-separated.
type multiValue []string

func (m *multiValue) Set(v string) error {
	if v == "" {
		return errors.New("empty value")
	}
	*m = append(*m, v)
	return nil
}
func (m *multiValue) String() string { return strings.Join(*m, ",") }

func splitList(v string) []string {
	parts := strings.Split(v, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

// Registration helpers.

func (c *cli) String(name, def, usage string) *string {
	p := new(string)
	*p = def
	c.fs.Var((*stringValue)(p), name, usage)
	return p
}

func (c *cli) Bool(name, usage string) *bool {
	p := new(bool)
	c.fs.Var((*boolValue)(p), name, usage)
	return p
}

func (c *cli) Int(name string, def int, usage string) *int {
	p := new(int)
	*p = def
	c.fs.Var((*intValue)(p), name, usage)
	return p
}

func (c *cli) Duration(name string, def time.Duration, usage string) *time.Duration {
	p := new(time.Duration)
	*p = def
	c.fs.Var((*durationValue)(p), name, usage)
	return p
}

func (c *cli) Size(name string, def int64, usage string) *int64 {
	p := new(int64)
	*p = def
	c.fs.Var((*sizeValue)(p), name, usage)
	return p
}

func (c *cli) Mode(name string, def os.FileMode, usage string) *os.FileMode {
	p := new(os.FileMode)
	*p = def
	c.fs.Var((*modeValue)(p), name, usage)
	return p
}

// Procs registers --procs (default engine.DefaultProcs).
func (c *cli) Procs(usage string) *int {
	p := new(int)
	*p = engine.DefaultProcs
	c.fs.Var((*procsValue)(p), "procs", usage)
	return p
}

func (c *cli) List(name, usage string) *[]string {
	p := new([]string)
	c.fs.Var((*listValue)(p), name, usage)
	return p
}

func (c *cli) Multi(name, usage string) *[]string {
	p := new([]string)
	c.fs.Var((*multiValue)(p), name, usage)
	c.envSplit[name] = true
	return p
}
