require "pgsse_hub"
require_relative "pg_session"

hub = PgsseHub::Failover.new(ENV.fetch("PGSSE_HUB_SOCKET"), direct: -> { PgSession.new(ENV.fetch("DATABASE_URL")) })
hub.on_notification { |ev| puts "job #{ev.channel} #{ev.payload}" }
hub.on_resync { |channel| puts channel ? "re-read #{channel}" : "re-read every job" }
hub.subscribe("jobs") # returns once pgsse (or, after a failover, our own session) LISTENs
hub.run
