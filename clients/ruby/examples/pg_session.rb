require "pg"

# The application's own LISTEN session for PgsseHub::Failover, over the pg gem.
class PgSession
  def initialize(url) = @conn = PG.connect(url, application_name: "worker-listen")
  def io = @conn.socket_io
  def listen(channel) = @conn.exec("LISTEN #{@conn.quote_ident(channel)}")
  def unlisten(channel) = @conn.exec("UNLISTEN #{@conn.quote_ident(channel)}")
  def close = @conn.close

  def notifications
    @conn.consume_input # raises PG::ConnectionBad once the connection is lost
    got = []
    while (n = @conn.notifies) do got << [n[:relname], n[:extra], n[:be_pid]] end
    got
  end
end
