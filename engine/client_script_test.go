package engine

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/clients/js"
)

// GET /pgsse.js serves the browser client (clients/js/pgsse.js) byte for byte, with or without
// --demo, to any origin, with cache headers; If-None-Match naming its ETag is a 304, HEAD gets
// the head alone, other methods a 405 (docs/http.md, The browser client).
func TestClientScript(t *testing.T) {
	t.Parallel()
	ts := startServer(t, "", nil)
	addr := ts.Addr().String()

	r := get(t, addr, "/pgsse.js", "Origin: https://app.example")
	require.Equal(t, 200, r.Status, r.Body)
	assert.Equal(t, js.Script, r.Body)
	assert.Equal(t, "text/javascript; charset=utf-8", r.Header.Get("Content-Type"))
	assert.Equal(t, strconv.Itoa(len(js.Script)), r.Header.Get("Content-Length"))
	assert.Equal(t, "public, max-age=300", r.Header.Get("Cache-Control"))
	assert.Equal(t, "*", r.Header.Get("Access-Control-Allow-Origin"), "a module script from another origin needs CORS")
	assert.Equal(t, "nosniff", r.Header.Get("X-Content-Type-Options"))
	etag := r.Header.Get("ETag")
	require.Regexp(t, `^"[0-9a-f]{16}"$`, etag)

	t.Run("query ignored", func(t *testing.T) {
		r := get(t, addr, "/pgsse.js?v=0.1.0")
		require.Equal(t, 200, r.Status)
		assert.Equal(t, js.Script, r.Body)
	})

	for _, inm := range []string{etag, `"other", ` + etag, "W/" + etag, "*"} {
		t.Run("If-None-Match "+inm, func(t *testing.T) {
			r := get(t, addr, "/pgsse.js", "If-None-Match: "+inm)
			require.Equal(t, 304, r.Status, r.Body)
			assert.Empty(t, r.Body)
			assert.Equal(t, etag, r.Header.Get("ETag"))
			assert.Equal(t, "public, max-age=300", r.Header.Get("Cache-Control"))
		})
	}
	t.Run("If-None-Match of another version", func(t *testing.T) {
		r := get(t, addr, "/pgsse.js", `If-None-Match: "0123456789abcdef"`)
		require.Equal(t, 200, r.Status)
		assert.Equal(t, js.Script, r.Body)
	})

	t.Run("HEAD", func(t *testing.T) {
		r := exchange(t, addr, "HEAD", request("HEAD", "/pgsse.js"))
		require.Equal(t, 200, r.Status)
		assert.Empty(t, r.Body, "a HEAD response carries no body")
		assert.Equal(t, strconv.Itoa(len(js.Script)), r.Header.Get("Content-Length"))
		assert.Equal(t, etag, r.Header.Get("ETag"))
	})

	for _, m := range []string{"PUT", "DELETE", "OPTIONS"} {
		t.Run(m, func(t *testing.T) {
			r := exchange(t, addr, m, request(m, "/pgsse.js"))
			require.Equal(t, 405, r.Status, r.Body)
			assert.Equal(t, "GET, HEAD", r.Header.Get("Allow"))
			assertErrorBody(t, r)
		})
	}

	for _, target := range []string{"/pgsse.jsx", "/js/pgsse.js", "/pgsse.js/", "/PGSSE.JS"} {
		t.Run(target, func(t *testing.T) {
			r := get(t, addr, target)
			require.Equal(t, 404, r.Status, r.Body)
		})
	}
}
