package engine

import (
	"net"
	"strconv"
	"testing"
	"unsafe"

	"github.com/panjf2000/gnet/v2"
	"github.com/stretchr/testify/assert"
)

// addrConn is a gnet.Conn with the addresses gnet keeps from the acceptor's net.TCPConn.
type addrConn struct {
	gnet.Conn
	local, remote *net.TCPAddr
}

func (c addrConn) LocalAddr() net.Addr  { return c.local }
func (c addrConn) RemoteAddr() net.Addr { return c.remote }

// compactAddrs keeps every address readable and as it was, with a peer's IPv4 address one
// slice for the connections from it, up to maxSharedPeerIPs peers (issue 25: an idle
// connection's bytes).
func TestCompactAddrsSharesIPs(t *testing.T) {
	peers := map[[4]byte]net.IP{}
	conn := func(peer string, port int) addrConn {
		return addrConn{
			local:  &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 8080},
			remote: &net.TCPAddr{IP: net.ParseIP(peer), Port: port},
		}
	}
	a, b, c := conn("10.0.0.7", 1000), conn("10.0.0.7", 1001), conn("10.0.0.8", 1002)
	v6 := conn("2001:db8::1", 1003)
	for _, x := range []addrConn{a, b, c, v6} {
		compactAddrs(x, peers)
	}
	assert.Equal(t, "127.0.0.1:8080", a.LocalAddr().String())
	assert.Equal(t, "10.0.0.7:1000", a.RemoteAddr().String())
	assert.Equal(t, "10.0.0.7:1001", b.RemoteAddr().String())
	assert.Equal(t, "10.0.0.8:1002", c.RemoteAddr().String())
	assert.Equal(t, "[2001:db8::1]:1003", v6.RemoteAddr().String())
	assert.Same(t, unsafe.SliceData(a.remote.IP), unsafe.SliceData(b.remote.IP), "one slice per peer address")
	assert.NotSame(t, unsafe.SliceData(a.remote.IP), unsafe.SliceData(c.remote.IP))
	assert.Len(t, a.remote.IP, net.IPv4len, "the 4-byte form, not the sockaddr's 16")

	for i := range maxSharedPeerIPs + 10 {
		compactAddrs(conn("10.1."+strconv.Itoa(i/250)+"."+strconv.Itoa(i%250), 2000), peers)
	}
	assert.Len(t, peers, maxSharedPeerIPs, "the table is bounded")
	d := conn("10.9.9.9", 3000)
	compactAddrs(d, peers)
	assert.Equal(t, "10.9.9.9:3000", d.RemoteAddr().String(), "a peer beyond the table gets a copy of its own")
}
