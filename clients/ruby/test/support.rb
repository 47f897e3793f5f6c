# frozen_string_literal: true

# Test support: a real `pgsse serve` (PGSSE_BIN) against a real PostgreSQL (PGSSE_TEST_DSN, a
# migrated database), as clients/clients_test.go provides them.
require "minitest/autorun"
require "socket"
require "tmpdir"
require "pg"

$LOAD_PATH.unshift File.expand_path("../lib", __dir__)
require "pgsse_hub"
require_relative "../examples/pg_session"

module Support
  ROOT = File.expand_path("../../..", __dir__)
  BIN = ENV["PGSSE_BIN"]
  DSN = ENV["PGSSE_TEST_DSN"]

  # Live tests need the binary and the database; `make test` (clients/clients_test.go) always
  # sets both, so there they never skip.
  def need_server
    skip "PGSSE_BIN and PGSSE_TEST_DSN are not set (run by clients/clients_test.go)" unless BIN && DSN
  end

  def sql(query, params = [])
    conn = PG.connect(DSN)
    conn.exec_params(query, params).values
  ensure
    conn&.close
  end

  def notify(channel, payload) = sql("SELECT pg_notify($1, $2)", [channel, payload])

  # pg_terminate_backend of this database's pgsse-listen backend; the number terminated.
  def terminate_listen_session
    sql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity " \
        "WHERE application_name = 'pgsse-listen' AND datname = current_database()")[0][0].to_i
  end

  def own_sessions
    sql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'worker-listen' " \
        "AND datname = current_database()")[0][0].to_i
  end

  # A closed session's backend leaves pg_stat_activity a moment after its client has gone:
  # wait until none is left, so that the next test counts only its own.
  def wait_no_own_sessions(timeout = 15)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    until own_sessions.zero?
      raise "a worker-listen session is still there after its client closed" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      sleep 0.05
    end
  end

  # One `pgsse serve` process with a hub socket in a fresh temp dir.
  class Server
    attr_reader :socket, :log_path

    def initialize(*extra)
      @dir = Dir.mktmpdir("pgsse-rb-")
      @socket = File.join(@dir, "hub.sock")
      @log_path = File.join(@dir, "serve.log")
      @pid = Process.spawn(BIN, "serve", "--database-url", DSN, "--listen", "127.0.0.1:0", "--admin-listen", "",
                           "--hub-socket", @socket, "--jwt-secret", "0123456789abcdef0123456789abcdef",
                           "--retention", "0", "--log-level", "debug", *extra, %i[out err] => @log_path)
      deadline = Time.now + 30
      loop do
        begin
          UNIXSocket.new(@socket).close
          break # the socket answering is the signal
        rescue SystemCallError
          raise "pgsse serve exited:\n#{output}" if Process.waitpid(@pid, Process::WNOHANG)
          raise "the hub socket does not answer after 30 s:\n#{output}" if Time.now > deadline

          sleep 0.02
        end
      end
    end

    # The server's log so far (its last tail characters; nil = all of it).
    def output(tail = 4000)
      text = File.read(@log_path)
      tail && text.size > tail ? text[-tail..] : text
    end

    def kill = signal("KILL")

    # SIGTERM: pgsse drains (the hub sends SHUTDOWN) and exits.
    def stop = signal("TERM")

    def close
      signal("KILL")
    end

    private

    def signal(sig)
      return unless @pid

      Process.kill(sig, @pid)
      deadline = Time.now + 20
      until Process.waitpid(@pid, Process::WNOHANG)
        raise "pgsse serve did not exit within 20 s of SIG#{sig}" if Time.now > deadline

        sleep 0.02
      end
      @pid = nil
    end
  end

  def next_event(client, timeout = 10, what = "an event")
    ev = client.next_event(timeout)
    flunk "no #{what} within #{timeout} s" unless ev
    ev
  end

  def next_notification(client, timeout = 10)
    seen = []
    deadline = Time.now + timeout
    loop do
      ev = client.next_event([deadline - Time.now, 0.01].max)
      flunk "no notification within #{timeout} s; saw #{seen.inspect}" unless ev
      return ev if ev.kind == :notification

      seen << ev
    end
  end

  # Polls the condition (an observable with no signal of its own) until it holds.
  def wait_until(what, timeout = 30)
    deadline = Time.now + timeout
    until yield
      flunk "#{what}: not within #{timeout} s" if Time.now > deadline
      sleep 0.05
    end
  end
end
