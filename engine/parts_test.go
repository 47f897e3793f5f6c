package engine

import (
	"go/ast"
	"go/build"
	"go/importer"
	"go/parser"
	gotoken "go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// The engine in parts (docs/architecture.md, The engine in parts): each part is a type that
// owns its fields, in its own files, and the files of one part reach another part only through
// that part's type — its methods, not its fields. These tests check it on the package's own
// source, so that the shape holds as the code changes:
//
//   - TestEnginePartsOwnTheirFields: a field is selected only in the files of the part that
//     owns its type (or the field: a type may lend one field to another part, as sseConn lends
//     first to the subscriptions part), except fields that are read-only outside their part;
//   - TestEngineMethodCount: no type has more than maxMethods methods;
//   - TestStateAssignedOnlyByItsHelper: sseConn.state and subscription.state are assigned by
//     their one transition helper (to) and nowhere else.

// maxMethods is the most methods one type of engine/ may have: a type with more is two parts.
const maxMethods = 40

// engineParts are the parts of engine/ and their files. Every non-test file belongs to one.
var engineParts = map[string][]string{
	// The shell: wiring, gnet's callbacks, the task queue and tick, start and stop, the
	// acceptors, the schema poller, configuration, metrics and the small shared helpers.
	"Server": {"server.go", "handler.go", "loop.go", "schema.go", "accept.go", "config.go", "metrics.go",
		"gnetlog.go", "lograte.go", "demo.go", "hubsocket.go", "swapremove.go", "doc.go", "handoff.go"},
	"connTable":     {"sseconn.go"},
	"requests":      {"request.go"},
	"tokens":        {"verify.go"},
	"admission":     {"admission.go"},
	"publishing":    {"publish.go"},
	"subscriptions": {"subscription.go", "catchup.go"},
	"fanout":        {"fanout.go", "fanout_keep.go", "rewinds.go"},
	"channelTable":  {"channels.go"},
	"listenState":   {"listen.go"},
	"outbound":      {"outbound.go", "budget.go", "writable_linux.go", "writable_other.go"},
	"hubServer":     {"hubserver.go"},
	"presenceTable": {"presence.go", "presencewriter.go"},
	"siblingSource": {"siblingsource.go"},
	"transport":     {"transport.go", "transport_sse.go"},
	"stageClock":    {"stages.go"},
}

// readAnywhere are types whose fields any part may read (never write): what every part is
// handed — the loop's environment, the configuration, the metrics — and small values passed
// between parts.
var readAnywhere = []string{"loopEnv", "Config", "metrics", "outLimits", "subRequest", "streamAsk", "FDBudget", "FDShare"}

// lentFields are fields of a type that a part other than the type's own owns (it alone reads
// and writes them), or that others may read ("read"): type.field → part, or "read".
var lentFields = map[string]string{
	// The connection (sseconn.go): its socket and its state are read everywhere, its
	// subscriptions are the subscriptions part's; its queue, publish state and request live in
	// its extension (connExt), reached through its accessors.
	"sseConn.c":      "read",
	"sseConn.state":  "read",
	"sseConn.closed": "read",
	"sseConn.nsub":   "subscriptions",
	"subRequest.ext": "connTable", // the connection's extension while it sets up
	"sseConn.first":  "subscriptions",
	// A raw channel (channels.go) has an SSE side (fanout.go) and a hub side (hubserver.go).
	"channel.name": "read",
	"channel.sse":  "fanout",
	"channel.hub":  "hubServer",
	// What a successor kept for a handed-over subscription (channels.go: resumeAt) is read by
	// the side that writes it.
	"heldNote.pid":     "read",
	"heldNote.payload": "read",
	// An event (fanout.go) is read by whoever writes it; how many queues hold it is the
	// write path's count.
	"event.id":       "read",
	"event.enc":      "read",
	"event.audience": "read",
	"event.stream":   "read",
	"event.seq":      "read", // the arrival order a connection with several streams is written in
	"event.queued":   "outbound",
	"event.received": "read", // the written stage (stages.go)
	"stream.name":    "read",
}

// partOf maps each file to its part.
func partOf(t *testing.T) map[string]string {
	t.Helper()
	m := map[string]string{}
	for part, files := range engineParts {
		for _, f := range files {
			require.NotContains(t, m, f, "%s is in two parts", f)
			m[f] = part
		}
	}
	return m
}

// TestEngineFilesBelongToParts: every non-test file of the package is in engineParts, and
// every file named there exists — the table is the doc.go file table's companion.
func TestEngineFilesBelongToParts(t *testing.T) {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	of := partOf(t)
	for _, f := range files {
		if !strings.HasSuffix(f, "_test.go") {
			_, ok := of[f]
			require.True(t, ok, "%s is in no part of engineParts (parts_test.go): put it in one", f)
		}
	}
	for f := range of {
		require.FileExists(t, f)
	}
}

// TestEngineMethodCount: no type of engine/ (its tests included) has more than maxMethods
// methods.
func TestEngineMethodCount(t *testing.T) {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := gotoken.NewFileSet()
	count := map[string]int{}
	seen := map[string]bool{} // a method declared for two platforms (writable_*.go) counts once
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv != nil && len(fd.Recv.List) == 1 {
				typ := receiverName(fd.Recv.List[0].Type)
				if key := typ + "." + fd.Name.Name; !seen[key] {
					seen[key] = true
					count[typ]++
				}
			}
		}
	}
	var names []string
	for n := range count {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return count[names[i]] > count[names[j]] })
	for _, n := range names[:min(5, len(names))] {
		t.Logf("%-14s %d methods", n, count[n])
	}
	for _, n := range names {
		if count[n] > maxMethods {
			t.Errorf("%s has %d methods, more than %d: split it into parts that own their state (docs/architecture.md)", n, count[n], maxMethods)
		}
	}
}

func receiverName(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr: // a generic receiver
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return "?"
		}
	}
}

// checkedEngine is the package's non-test source, parsed and type-checked once.
type checkedEngine struct {
	fset  *gotoken.FileSet
	files []*ast.File
	info  *types.Info
}

var (
	checkedOnce sync.Once
	checked     *checkedEngine
	checkedErr  error
)

// typeCheck parses and type-checks the package's own files for this platform, importing its
// dependencies from the export data `go list -export` reports (built or cached by the go
// command).
func typeCheck(t *testing.T) *checkedEngine {
	t.Helper()
	checkedOnce.Do(func() { checked, checkedErr = loadChecked() })
	require.NoError(t, checkedErr)
	return checked
}

func loadChecked() (*checkedEngine, error) {
	goCmd := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goCmd); err != nil {
		goCmd = "go"
	}
	out, err := exec.Command(goCmd, "list", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}", ".").Output()
	if err != nil {
		return nil, err
	}
	exports := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if path, file, ok := strings.Cut(line, "\t"); ok && file != "" {
			exports[path] = file
		}
	}
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		return nil, err
	}
	c := &checkedEngine{fset: gotoken.NewFileSet(), info: &types.Info{
		Selections: map[*ast.SelectorExpr]*types.Selection{},
		Defs:       map[*ast.Ident]types.Object{},
		Uses:       map[*ast.Ident]types.Object{},
	}}
	for _, name := range pkg.GoFiles {
		f, err := parser.ParseFile(c.fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		c.files = append(c.files, f)
	}
	imp := importer.ForCompiler(c.fset, "gc", func(path string) (io.ReadCloser, error) { return os.Open(exports[path]) })
	conf := types.Config{Importer: imp}
	if _, err := conf.Check(pkg.ImportPath, c.fset, c.files, c.info); err != nil {
		return nil, err
	}
	return c, nil
}

// fieldOwner finds, for a field object of this package, the struct type that declares it.
func (c *checkedEngine) fieldOwners() map[*types.Var]string {
	owners := map[*types.Var]string{}
	for _, f := range c.files {
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return true
			}
			for _, fld := range st.Fields.List {
				for _, name := range fld.Names {
					if v, ok := c.info.Defs[name].(*types.Var); ok {
						owners[v] = ts.Name.Name
					}
				}
				if len(fld.Names) == 0 { // embedded: Defs maps the type's name to the field
					e := fld.Type
					if star, ok := e.(*ast.StarExpr); ok {
						e = star.X
					}
					if sel, ok := e.(*ast.SelectorExpr); ok {
						e = sel.Sel
					}
					if id, ok := e.(*ast.Ident); ok {
						if v, ok := c.info.Defs[id].(*types.Var); ok {
							owners[v] = ts.Name.Name
						}
					}
				}
			}
			return true
		})
	}
	return owners
}

// writes are the selector expressions a statement assigns through: the field assigned (or
// whose element, or whose address, is taken).
func writes(f *ast.File) map[*ast.SelectorExpr]bool {
	w := map[*ast.SelectorExpr]bool{}
	mark := func(e ast.Expr) {
		for {
			switch x := e.(type) {
			case *ast.ParenExpr:
				e = x.X
			case *ast.IndexExpr:
				e = x.X
			case *ast.SliceExpr:
				e = x.X
			case *ast.SelectorExpr:
				w[x] = true
				return
			default:
				return
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.AssignStmt:
			for _, l := range x.Lhs {
				mark(l)
			}
		case *ast.IncDecStmt:
			mark(x.X)
		case *ast.UnaryExpr:
			if x.Op == gotoken.AND {
				mark(x.X)
			}
		case *ast.RangeStmt:
			if x.Key != nil {
				mark(x.Key)
			}
			if x.Value != nil {
				mark(x.Value)
			}
		}
		return true
	})
	return w
}

func TestEnginePartsOwnTheirFields(t *testing.T) {
	c := typeCheck(t)
	of := partOf(t)
	owners := c.fieldOwners()
	// The part each struct type belongs to: the part of the file it is declared in.
	typePart := map[string]string{}
	for _, f := range c.files {
		file := filepath.Base(c.fset.Position(f.Pos()).Filename)
		for _, d := range f.Decls {
			if gd, ok := d.(*ast.GenDecl); ok && gd.Tok == gotoken.TYPE {
				for _, s := range gd.Specs {
					typePart[s.(*ast.TypeSpec).Name.Name] = of[file]
				}
			}
		}
	}
	for key, part := range lentFields {
		typ, _, _ := strings.Cut(key, ".")
		require.Contains(t, typePart, typ, "lentFields names a type that does not exist: %s", key)
		if part != "read" {
			require.Contains(t, engineParts, part, "lentFields names a part that does not exist: %s", key)
		}
	}
	used := map[string]bool{}
	for _, f := range c.files {
		file := filepath.Base(c.fset.Position(f.Pos()).Filename)
		part := of[file]
		w := writes(f)
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			s := c.info.Selections[sel]
			if s == nil || s.Kind() != types.FieldVal {
				return true
			}
			v, _ := s.Obj().(*types.Var)
			typ, ok := owners[v]
			if !ok {
				return true // a field of another package's type
			}
			key := typ + "." + v.Name()
			owner := typePart[typ]
			lent, isLent := lentFields[key]
			switch {
			case isLent && lent != "read":
				owner = lent
			case isLent || slices.Contains(readAnywhere, typ):
				if !w[sel] {
					used[key] = used[key] || part != owner
					return true
				}
			}
			if part != owner {
				verb := "reads"
				if w[sel] {
					verb = "writes"
				}
				t.Errorf("%s: %s %s, a field of part %s: reach it through %s's methods (or lend the field in parts_test.go)",
					c.fset.Position(sel.Sel.Pos()), verb, key, owner, owner)
			} else if isLent {
				used[key] = true
			}
			return true
		})
	}
	for key := range lentFields {
		if !used[key] {
			t.Errorf("lentFields lends %s, but no other part uses it: take it off the list", key)
		}
	}
}

// TestStateAssignedOnlyByItsHelper: the state machine's rule (sseconn.go, subscription.go) —
// a connection's state and a subscription's state are each assigned by one helper (to),
// never anywhere else, not even in a composite literal; so a new state or lifetime rule is a
// change to that type's transition helpers.
func TestStateAssignedOnlyByItsHelper(t *testing.T) {
	c := typeCheck(t)
	owners := c.fieldOwners()
	machines := map[string]bool{"sseConn": true, "subscription": true}
	for _, f := range c.files {
		w := writes(f)
		var fn *ast.FuncDecl
		for _, d := range f.Decls {
			fn, _ = d.(*ast.FuncDecl)
			helper := ""
			if fn != nil && fn.Name.Name == "to" && fn.Recv != nil {
				helper = receiverName(fn.Recv.List[0].Type)
			}
			ast.Inspect(d, func(n ast.Node) bool {
				switch x := n.(type) {
				case *ast.SelectorExpr:
					s := c.info.Selections[x]
					if s == nil || s.Kind() != types.FieldVal || !w[x] || s.Obj().Name() != "state" {
						return true
					}
					if typ := owners[s.Obj().(*types.Var)]; machines[typ] && typ != helper {
						t.Errorf("%s: assigns %s.state outside (*%s).to; use a transition helper", c.fset.Position(x.Pos()), typ, typ)
					}
				case *ast.KeyValueExpr:
					if k, ok := x.Key.(*ast.Ident); ok {
						if v, ok := c.info.Uses[k].(*types.Var); ok && v.Name() == "state" && machines[owners[v]] {
							t.Errorf("%s: sets state in a %s literal; use a transition helper", c.fset.Position(x.Pos()), owners[v])
						}
					}
				}
				return true
			})
		}
	}
}

// TestTransportSeam: how events become bytes is the transport's (transport.go). Outside the SSE
// transport's file no engine file calls package sse's encoders (sse.Append…) or holds an SSE
// wire literal — a field name at the start of a line, or the heartbeat.
func TestTransportSeam(t *testing.T) {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := gotoken.NewFileSet()
	wire := []string{"id:", "event:", "data:", "retry:", ":\n", "\nid:", "\nevent:", "\ndata:", "\nretry:"}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") || name == "transport_sse.go" {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.SelectorExpr:
				if id, ok := x.X.(*ast.Ident); ok && id.Name == "sse" && strings.HasPrefix(x.Sel.Name, "Append") {
					t.Errorf("%s: sse.%s outside transport_sse.go: encode through the transport (or httpAnswers)", fset.Position(x.Pos()), x.Sel.Name)
				}
			case *ast.BasicLit:
				if x.Kind != gotoken.STRING {
					return true
				}
				for _, w := range wire {
					lit := strings.Trim(x.Value, "`\"")
					lit = strings.ReplaceAll(lit, `\n`, "\n")
					if strings.HasPrefix(lit, w) || (strings.HasPrefix(w, "\n") && strings.Contains(lit, w)) {
						t.Errorf("%s: SSE wire literal %s outside transport_sse.go", fset.Position(x.Pos()), x.Value)
						break
					}
				}
			}
			return true
		})
	}
}
