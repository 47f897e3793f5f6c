// Package js holds the browser client, pgsse.js (an ES module, see README.md here), so that
// pgsse can serve the file itself at GET /pgsse.js (engine/demo.go) and a page can load it
// without a bundler. The same file is the npm package pgsse-browser.
package js

import _ "embed" // for go:embed

// Script is pgsse.js, byte for byte.
//
//go:embed pgsse.js
var Script string
