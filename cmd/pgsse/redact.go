package main

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
)

// Secrets never leave pgsse through what it logs or serves (issue 11): the HS256 secret
// (--jwt-secret, --jwt-secret-file, PGSSE_JWT_SECRET) and the database password (in
// --database-url, DATABASE_URL, PGPASSWORD or a password file) are replaced by "REDACTED" in
// every log line and in /debug/pprof/cmdline.

// redacted is what a secret is replaced with.
const redacted = "REDACTED"

// minRedactBytes: shorter secrets are not searched for in log lines (every match of a
// two-letter password would garble the logs); pgsse warns about short HS256 secrets anyway,
// and /debug/pprof/cmdline hides the values of --jwt-secret and --database-url's password
// whatever their length.
const minRedactBytes = 6

// redactor knows the secrets of one `pgsse serve`. They are added while the configuration is
// parsed, before anything is logged or served; after that it is only read.
type redactor struct{ secrets []string }

// add registers a secret and the forms it takes when escaped in a URL.
func (r *redactor) add(secret string) {
	if len(secret) < minRedactBytes {
		return
	}
	_, userinfo, _ := strings.Cut(url.UserPassword("u", secret).String(), ":") // as in a URL's user:password@
	for _, s := range []string{secret, url.QueryEscape(secret), url.PathEscape(secret), userinfo} {
		dup := false
		for _, have := range r.secrets {
			dup = dup || have == s
		}
		if !dup {
			r.secrets = append(r.secrets, s)
		}
	}
}

// String returns s with every secret replaced.
func (r *redactor) String(s string) string {
	for _, secret := range r.secrets {
		if strings.Contains(s, secret) {
			s = strings.ReplaceAll(s, secret, redacted)
		}
	}
	return s
}

// redactingHandler is a slog.Handler that passes every record on with its message and
// attributes redacted.
type redactingHandler struct {
	inner slog.Handler
	r     *redactor
}

func (h redactingHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h redactingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	out := make([]slog.Attr, len(as))
	for i, a := range as {
		out[i] = h.attr(a)
	}
	return redactingHandler{inner: h.inner.WithAttrs(out), r: h.r}
}

func (h redactingHandler) WithGroup(name string) slog.Handler {
	return redactingHandler{inner: h.inner.WithGroup(name), r: h.r}
}

func (h redactingHandler) Handle(ctx context.Context, rec slog.Record) error {
	if len(h.r.secrets) == 0 {
		return h.inner.Handle(ctx, rec)
	}
	out := slog.NewRecord(rec.Time, rec.Level, h.r.String(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.inner.Handle(ctx, out)
}

// attr redacts one attribute: strings, and anything printed as text (errors, Stringers),
// groups member by member.
func (h redactingHandler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString, slog.KindAny:
		s := v.String()
		if red := h.r.String(s); red != s {
			return slog.String(a.Key, red)
		}
	case slog.KindGroup:
		g := v.Group()
		out := make([]slog.Attr, len(g))
		for i, m := range g {
			out[i] = h.attr(m)
		}
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(out...)}
	}
	return a
}

// cmdlineHandler is /debug/pprof/cmdline with the secrets redacted (net/http/pprof's serves
// os.Args as they are).
func cmdlineHandler(r *redactor) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte(strings.Join(redactArgs(os.Args, r), "\x00")))
	}
}

// redactArgs is args with the value of --jwt-secret and the password in --database-url
// hidden, and every known secret replaced.
func redactArgs(args []string, r *redactor) []string {
	out := make([]string, len(args))
	hideNext := ""
	for i, a := range args {
		switch {
		case hideNext != "":
			out[i] = hideValue(hideNext, a)
			hideNext = ""
			continue
		case strings.HasPrefix(a, "-"):
			name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if name == "jwt-secret" || name == "database-url" {
				if !hasValue {
					hideNext = name
				} else {
					a = a[:len(a)-len(value)] + hideValue(name, value)
				}
			}
		}
		out[i] = r.String(a)
	}
	return out
}

// hideValue is the shown form of a secret-bearing flag's value.
func hideValue(flag, value string) string {
	if flag == "jwt-secret" {
		return redacted
	}
	if u, err := url.Parse(value); err == nil && u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), redacted)
			return u.String()
		}
		return value
	}
	// key=value form: password=…
	fields := strings.Fields(value)
	for i, f := range fields {
		if k, _, ok := strings.Cut(f, "="); ok && k == "password" {
			fields[i] = "password=" + redacted
		}
	}
	return strings.Join(fields, " ")
}
