# frozen_string_literal: true

# PgsseHub: a worker client for the hub socket of `pgsse serve --hub-socket` (standard library
# only). Worker processes share pgsse's one PostgreSQL LISTEN session through the hub; the wire
# protocol is docs/hub-protocol.md. It mirrors the Go package pglisten:
#
# - HubClient speaks the protocol: HELLO, SUB answered only once the LISTEN completed on pgsse's
#   session (subscribe returns on ACK OK and raises AckError naming the code otherwise), UNSUB,
#   PING/PONG keepalive, NOTIFY, every STATUS.
# - Failover is what a worker wants: the hub first and, on connection refused, EOF, no ACK within
#   5 s, a silent hub, EVICTED, PROTOCOL_ERROR or SHUTDOWN, a switch once and for good to the
#   application's own LISTEN session (an adapter over its own driver, e.g. the pg gem),
#   re-LISTENing every recorded channel and then reporting one resync of everything.
#
# Events are queued (bounded) by the client's reader thread and delivered to the callbacks by
# run on the application's thread, in the order the hub (or PostgreSQL) sent them. When the
# application does not keep up, the reader stops reading and the hub applies its policy (a
# lossless worker is evicted, and a Failover then switches to its own session).
module PgsseHub
  VERSION = "0.1.0"
end

require_relative "pgsse_hub/frame"
require_relative "pgsse_hub/client"
require_relative "pgsse_hub/failover"
