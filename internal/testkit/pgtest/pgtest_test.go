package pgtest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewDatabaseIsFreshAndDropped(t *testing.T) {
	var name string
	t.Run("inner", func(t *testing.T) {
		dsn := NewDatabase(t)
		name = QueryValue(t, dsn, "SELECT current_database()")
		require.Contains(t, name, "pgsse_t_")
		assert.Equal(t, "0", QueryValue(t, dsn, "SELECT count(*) FROM pg_tables WHERE schemaname='public'"))
	})
	assert.Equal(t, "0", QueryValue(t, URL(t), "SELECT count(*) FROM pg_database WHERE datname='"+name+"'"),
		"database must be dropped when the test ends")
}

func TestClusterRestartAndSSL(t *testing.T) {
	c := StartCluster(t, ClusterOptions{SSL: true})
	assert.Equal(t, "t", QueryValue(t, c.URL("require"), "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"))
	before := QueryValue(t, c.SocketURL(), "SELECT pg_postmaster_start_time()")
	c.Restart()
	after := QueryValue(t, c.SocketURL(), "SELECT pg_postmaster_start_time()")
	assert.NotEqual(t, before, after, "restart must start a new postmaster")
}
