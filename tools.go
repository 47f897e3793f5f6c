//go:build tools

// Package tools pins the chosen stack in go.mod while the packages that use
// it are being written; see README "Dependencies". Delete entries once used.
package tools

import (
	_ "github.com/golang-jwt/jwt/v5"
	_ "github.com/jackc/pgx/v5/pgconn"
	_ "github.com/panjf2000/gnet/v2"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/stretchr/testify/require"
	_ "github.com/valyala/bytebufferpool"
	_ "go.uber.org/goleak"
)
