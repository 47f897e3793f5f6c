# frozen_string_literal: true

require_relative "support"

# PgsseHub::HubClient against the real hub of a real `pgsse serve` and a real PostgreSQL.
class TestHubClientLive < Minitest::Test
  include Support
  H = PgsseHub

  def setup
    need_server
    @server = Server.new
    @hub = H::HubClient.new(@server.socket, name: "rb-test")
  end

  def teardown
    @hub&.close
    @server&.close
  end

  def test_ack_only_after_listen
    # A NOTIFY sent the moment subscribe returned must arrive: the hub answered ACK OK only once
    # its LISTEN had completed. Fresh channels, so every SUB waits for a LISTEN.
    25.times do |i|
      ch = "ack_#{i}_#{Process.pid}"
      @hub.subscribe(ch)
      notify(ch, "n#{i}")
      ev = next_notification(@hub)
      assert_equal [ch, "n#{i}"], [ev.channel, ev.payload]
      assert_operator ev.pid, :>, 0
    end
  end

  def test_lossless_10000_in_order
    @hub.subscribe("bulk")
    10.times do |k|
      sql("SELECT pg_notify('bulk', g::text) FROM generate_series(#{k * 1000 + 1}, #{k * 1000 + 1000}) g")
    end
    got = []
    while got.size < 10_000
      ev = next_event(@hub, 10, "notification #{got.size + 1} of 10000")
      assert_equal :notification, ev.kind, ev.inspect
      got << ev.payload.to_i
    end
    assert_equal (1..10_000).to_a, got
  end

  def test_resync_after_the_hubs_listen_session_is_terminated
    @hub.subscribe("jobs")
    assert_equal 1, terminate_listen_session
    assert_equal H::Event.down, next_event(@hub, 15, "LISTENER_DOWN")
    assert_equal H::Event.resync, next_event(@hub, 30, "RESYNC")
    notify("jobs", "after")
    assert_equal "after", next_notification(@hub).payload
  end

  def test_unsubscribe_ping_and_refusals
    @hub.subscribe("a")
    @hub.subscribe("a") # idempotent
    @hub.subscribe("b")
    assert_equal %w[a b], @hub.channels
    @hub.unsubscribe("a")
    notify("a", "dropped")
    notify("b", "kept")
    assert_equal "kept", next_notification(@hub).payload
    assert_raises(KeyError) { @hub.unsubscribe("a") }
    err = assert_raises(H::AckError) { @hub.subscribe("pgsse") } # reserved for pgsse's streams
    assert_equal "BAD_CHANNEL", err.code_name
    assert_includes err.message, "BAD_CHANNEL"
    assert_raises(ArgumentError) { @hub.subscribe("x" * 64) }
    assert_operator @hub.ping, :<, 5
    notify("b", "still usable")
    assert_equal "still usable", next_notification(@hub).payload
  end

  def test_shutdown_ends_run_with_the_reason
    @hub.subscribe("jobs")
    @server.stop
    err = assert_raises(H::HubFailure) { @hub.run }
    assert_equal :shutdown, err.reason
  end
end

# PgsseHub::Failover: the hub, then the application's own session (examples/pg_session.rb).
class TestFailoverLive < Minitest::Test
  include Support
  H = PgsseHub

  def setup
    need_server
    @cleanup = []
  end

  def teardown
    @cleanup.reverse_each(&:call)
  end

  def failover(path, **kw)
    f = H::Failover.new(path, direct: -> { PgSession.new(DSN) }, name: "rb-failover",
                              logger: Logger.new(File::NULL), **kw)
    @cleanup << -> { f.close; wait_no_own_sessions }
    f
  end

  def server(*extra)
    s = Server.new(*extra)
    @cleanup << -> { s.close }
    s
  end

  def check_switch(f, reason, down: true)
    ev = next_event(f, 15, down ? "down" : "resync")
    ev = next_event(f, 30, "resync") while ev.kind == :down # the hub may report its session down as it stops
    assert_equal H::Event.resync, ev, "the switch is one resync of everything"
    assert_equal :direct, f.source
    assert_equal reason, f.reason.reason
    assert_equal 1, own_sessions
    notify("jobs", "direct")
    ev = next_event(f, 10, "a notification on the own session")
    assert_equal [:notification, "jobs", "direct"], [ev.kind, ev.channel, ev.payload],
                 "after the switch's resync comes the notification, not a second resync"
    f.subscribe("later") # subscribing after the switch LISTENs on the own session
    notify("later", "x")
    assert_equal "later", next_notification(f).channel
  end

  def test_failover_when_pgsse_is_killed
    s = server
    f = failover(s.socket)
    f.subscribe("jobs")
    assert_equal :hub, f.source
    assert_equal 0, own_sessions, "no own session while the hub serves"
    notify("jobs", "via the hub")
    assert_equal "via the hub", next_notification(f).payload
    s.kill
    check_switch(f, :closed)
    # The own session is lost too: reopened with backoff, reported as down, then resync.
    assert_equal 1, sql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity " \
                        "WHERE application_name = 'worker-listen' AND datname = current_database()")[0][0].to_i
    assert_equal H::Event.down, next_event(f, 15, "down")
    assert_equal H::Event.resync, next_event(f, 30, "resync")
    notify("jobs", "reopened")
    assert_equal "reopened", next_notification(f).payload
  end

  def test_failover_on_shutdown
    s = server
    f = failover(s.socket)
    f.subscribe("jobs")
    s.stop
    check_switch(f, :shutdown)
  end

  def test_failover_when_the_socket_refuses
    path = File.join(Dir.mktmpdir, "nobody.sock")
    UNIXServer.new(path).close # a socket file nobody accepts on: connection refused
    f = failover(path)
    f.subscribe("jobs")
    check_switch(f, :unavailable, down: false)
  end

  def test_failover_on_eviction
    s = server("--hub-worker-buffer", "131080")
    f = failover(s.socket, event_buffer: 1)
    f.subscribe("jobs")
    # Nobody takes events: the reader stalls, the socket and then the hub's ring fill up.
    sql("SELECT pg_notify('jobs', repeat('x', 7000) || g) FROM generate_series(1, 400) g")
    wait_until("the hub evicting the worker") { s.output(nil).include?("evicting a worker") }
    ev = next_event(f, 30, "the switch after eviction") while ev.nil? || ev.kind == :notification
    assert_equal H::Event.down, ev
    assert_equal H::Event.resync, next_event(f, 30, "resync")
    assert_equal :evicted, f.reason.reason
    notify("jobs", "direct")
    assert_equal "direct", next_notification(f).payload
  end

  def test_run_delivers_to_callbacks_and_close_ends_it
    s = server
    got = []
    received = Queue.new
    resyncs = Queue.new
    f = failover(s.socket)
    f.on_notification do |ev|
      got << ev.payload
      received << ev.payload
      f.close if got.size == 2
    end
    f.on_resync { |ch| resyncs << ch }
    f.subscribe("jobs")
    t = Thread.new { f.run }
    notify("jobs", "one")
    assert_equal "one", received.pop # delivered through the hub before it is killed
    s.kill
    assert_nil resyncs.pop # blocks until the switch's resync of everything
    notify("jobs", "two")
    refute_nil t.join(30), "run returns after close"
    assert_equal %w[one two], got
  end
end

# Each STATUS code, as a hub peer sends it (a Unix socket server speaking the frames).
class TestScriptedHub < Minitest::Test
  H = PgsseHub

  def serve(*frames, answer_sub: true)
    path = File.join(Dir.mktmpdir, "hub.sock")
    srv = UNIXServer.new(path)
    Thread.new do
      c = srv.accept
      d = H::Decoder.new
      loop do
        f = d.next
        unless f
          data = c.readpartial(4096)
          d.feed(data)
          next
        end
        if f.type == H::HELLO
          c.write(H.encode(H::Frame.new(type: H::STATUS, code: H::READY)))
        elsif f.type == H::SUB && answer_sub
          c.write(H.encode(H::Frame.new(type: H::ACK, req: f.req)) + frames.map { |x| H.encode(x) }.join)
        end
      end
    rescue EOFError, IOError, SystemCallError
      nil
    ensure
      c&.close
      srv.close
    end
    path
  end

  def status(code, channel: "", text: "") = H::Frame.new(type: H::STATUS, code: code, channel: channel, text: text)

  CASES = [
    ["LISTENER_DOWN", [H::LISTENER_DOWN], H::Event.down, nil],
    ["RESYNC all", [H::RESYNC], H::Event.resync, nil],
    ["RESYNC channel", [H::RESYNC, "jobs"], H::Event.resync("jobs"), nil],
    ["RESYNC other channel", [H::RESYNC, "other"], nil, nil],
    ["READY again", [H::READY], nil, nil],
    ["SHUTDOWN", [H::SHUTDOWN, "", "bye"], nil, :shutdown],
    ["EVICTED", [H::EVICTED, "", "slow"], nil, :evicted],
    ["PROTOCOL_ERROR", [H::PROTOCOL_ERROR, "", "bad"], nil, :protocol]
  ].freeze

  def test_status_codes
    marker = H::Frame.new(type: H::NOTIFY, pid: 1, channel: "jobs", text: "marker")
    CASES.each do |name, (code, channel, text), want_event, want_failure|
      frame = status(code, channel: channel || "", text: text || "")
      path = want_failure ? serve(frame) : serve(frame, marker)
      c = H::HubClient.new(path, ping_interval: 0, logger: Logger.new(File::NULL))
      c.subscribe("jobs")
      if want_failure
        err = assert_raises(H::HubFailure, name) { c.next_event(5) }
        assert_equal want_failure, err.reason, name
      else
        ev = c.next_event(5)
        if want_event
          assert_equal want_event, ev, name
          ev = c.next_event(5)
        end
        assert_equal "marker", ev&.payload, name
      end
      c.close
    end
  end

  def test_a_workers_frame_from_the_hub_is_a_protocol_error
    c = H::HubClient.new(serve(H::Frame.new(type: H::PING, token: 1)), ping_interval: 0, logger: Logger.new(File::NULL))
    c.subscribe("jobs")
    err = assert_raises(H::HubFailure) { c.next_event(5) }
    assert_equal :protocol, err.reason
    c.close
  end

  def test_a_silent_hub_fails_with_timeout
    # The peer answers HELLO and SUB but never a PING: two silent intervals end the client.
    c = H::HubClient.new(serve, ping_interval: 0.1, logger: Logger.new(File::NULL))
    c.subscribe("jobs")
    err = assert_raises(H::HubFailure) { c.next_event(5) }
    assert_equal :timeout, err.reason
    c.close
  end

  def test_failover_on_protocol_error
    skip "PGSSE_TEST_DSN is not set (run by clients/clients_test.go)" unless Support::DSN
    f = H::Failover.new(serve(status(H::PROTOCOL_ERROR, text: "bad")), direct: -> { PgSession.new(Support::DSN) },
                                                                       ping_interval: 0, logger: Logger.new(File::NULL))
    f.subscribe("jobs")
    assert_equal H::Event.down, f.next_event(10)
    assert_equal H::Event.resync, f.next_event(30)
    assert_equal [:direct, :protocol, "bad"], [f.source, f.reason.reason, f.reason.detail]
    PG.connect(Support::DSN).tap { |c| c.exec("NOTIFY jobs, 'direct'") }.close
    assert_equal "direct", f.next_event(10).payload
  ensure
    f&.close
  end

  def test_no_ack_within_the_deadline
    c = H::HubClient.new(serve(answer_sub: false), ack_timeout: 0.5, ping_interval: 0, logger: Logger.new(File::NULL))
    err = assert_raises(H::HubFailure) { c.subscribe("jobs") }
    assert_equal :ack_timeout, err.reason
    c.close
  end
end
