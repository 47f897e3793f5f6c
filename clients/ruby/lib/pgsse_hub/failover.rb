# frozen_string_literal: true

module PgsseHub
  # The hub first; on its failure (see HubFailure) a switch once and for good to the
  # application's own LISTEN session, made by calling +direct+ (a Proc returning a session
  # adapter) only then. After the switch every recorded channel is LISTENed again and one resync
  # of everything (channel nil) is reported, preceded by a :down if the hub had been connected:
  # notifications between the two may have been missed. A direct session that is lost later is
  # reopened with backoff and reported the same way (:down, then :resync).
  #
  # The adapter (clients/ruby/README.md has one for the pg gem) is called only on the client's
  # direct-session thread, never concurrently:
  # - io -> the connection's socket (an IO), watched for readability;
  # - listen(channel) / unlisten(channel): LISTEN/UNLISTEN with the channel quoted as an
  #   identifier; return once PostgreSQL answered, raise on failure;
  # - notifications -> [[channel, payload, pid], ...]: what has arrived; called when io is
  #   readable and after each listen/unlisten; raises once the connection is lost;
  # - close.
  class Failover < Dispatcher
    attr_reader :source, :reason, :direct_error

    def initialize(path, direct:, name: nil, mode: LOSSLESS, connect_timeout: 2.0, ack_timeout: 5.0,
                   ping_interval: 5.0, event_buffer: 4096, on_notification: nil, on_resync: nil, on_down: nil,
                   logger: nil)
      super(event_buffer: event_buffer, on_notification: on_notification, on_resync: on_resync, on_down: on_down)
      @direct_factory = direct
      @log = logger || Logger.new($stderr, level: Logger::WARN, progname: "pgsse_hub")
      @mu = Mutex.new
      @chans = {}   # recorded: subscribe called, not failed or unsubscribed
      @cmds = []    # [op, channel, Waiter] for the direct thread
      @switched = Waiter.new
      @closed = false
      @wake_r, @wake_w = IO.pipe
      @source = :hub
      @reason = nil
      @direct_error = nil
      @hub = nil
      @direct_thread = nil
      begin
        @hub = HubClient.new(path, name: name, mode: mode, connect_timeout: connect_timeout, ack_timeout: ack_timeout,
                                   ping_interval: ping_interval, logger: @log, dispatcher: self,
                                   on_fail: method(:hub_failed))
      rescue HubFailure => e
        start_switch(e, report_down: false)
      end
    end

    # Records channel (a switch re-LISTENs it) and subscribes on the current side: returns once
    # the LISTEN completed — on pgsse's session (ACK OK) or, after a switch, on the application's
    # own. Raises AckError for a refused SUB, or the direct session's error.
    def subscribe(channel)
      ch = PgsseHub.channel_name(channel)
      had, hub = @mu.synchronize do
        h = @chans.key?(ch)
        @chans[ch] = true
        [h, @hub]
      end
      begin
        if hub
          begin
            return hub.subscribe(ch)
          rescue HubFailure
            @switched.wait
          end
        else
          @switched.wait
        end
        direct_cmd(:listen, ch)
      rescue StandardError
        @mu.synchronize { @chans.delete(ch) } unless had
        raise
      end
    end

    # Forgets channel and unsubscribes on the current side. KeyError if not subscribed.
    def unsubscribe(channel)
      ch = PgsseHub.channel_name(channel)
      hub = @mu.synchronize do
        raise KeyError, "not subscribed to #{ch.inspect}" unless @chans.delete(ch)

        @hub
      end
      if hub
        begin
          return hub.unsubscribe(ch)
        rescue KeyError
          return # its SUB had not been acknowledged
        rescue HubFailure
          @switched.wait
        end
      end
      direct_cmd(:unlisten, ch)
    end

    # PING/PONG round trip to the hub in seconds (nil once switched to the own session).
    def ping(timeout = 5.0) = @mu.synchronize { @hub }&.ping(timeout)

    def channels = @mu.synchronize { @chans.keys.sort }

    # Stops the hub client or the own session (a switch in progress too); run returns.
    def close
      hub, thread = @mu.synchronize do
        return if @closed

        @closed = true
        wake
        [@hub, @direct_thread]
      end
      start_closing
      hub&.close
      fail_cmds(HubFailure.new(:closed_by_application))
      if thread
        thread.join(10) unless thread.equal?(Thread.current) # the own session is closed when close returns
      else
        @wake_r.close
        @wake_w.close
      end
      nil
    end

    private

    def hub_failed(failure, hub)
      # On the hub's reader thread (or a caller's), after the hub's last event was queued.
      start_switch(failure, report_down: !hub.last_down) unless failure.reason == :closed_by_application
    end

    def start_switch(failure, report_down:)
      @mu.synchronize do
        return if @closed

        @reason = failure
        @direct_thread = Thread.new do
          direct_sessions(report_down)
        ensure
          @wake_r.close
          @wake_w.close
        end
        @direct_thread.name = "pgsse-hub-direct"
      end
    end

    def direct_sessions(report_down)
      @log.warn("#{@reason.message}; switching to the application's own LISTEN session for good")
      @mu.synchronize do
        @source = :direct
        @hub = nil
      end
      @switched.set
      return if report_down && !put(Event.down)

      backoff = 0.1
      first = true
      until closing?
        session = nil
        begin
          session = @direct_factory.call
          todo = @mu.synchronize { @chans.keys }
          todo.each do |ch|
            session.listen(ch)
            drain(session)
          end
          @log.info("own LISTEN session live (#{todo.size} channels); resyncing")
          return unless put(Event.resync)

          backoff = 0.1
          first = false
          serve(session)
          return
        rescue StandardError => e
          return if closing?

          @direct_error = e
          @log.error("own LISTEN session: #{e.class}: #{e.message} (retrying in #{backoff} s)")
          fail_cmds(e)
          return if !first && !put(Event.down)

          first = true # report the next loss only after a resync
        ensure
          begin
            session&.close
          rescue StandardError
            nil
          end
        end
        return if wait_closing(backoff)

        backoff = [backoff * 2, 5.0].min
      end
    end

    def wait_closing(seconds)
      r, = IO.select([@wake_r], nil, nil, seconds)
      @wake_r.read_nonblock(4096, exception: false) if r
      closing?
    end

    def serve(session)
      io = session.io
      until closing?
        run_cmds(session)
        r, = IO.select([io, @wake_r], nil, nil, 1.0)
        next unless r

        @wake_r.read_nonblock(4096, exception: false) if r.include?(@wake_r)
        drain(session) if r.include?(io)
      end
    end

    def drain(session)
      session.notifications.each do |channel, payload, pid|
        channel = channel.to_s.dup.force_encoding(Encoding::UTF_8)
        next unless @mu.synchronize { @chans.key?(channel) }
        return unless put(Event.notification(channel, payload.to_s.dup.force_encoding(Encoding::UTF_8), pid.to_i))
      end
    end

    def run_cmds(session)
      loop do
        op, ch, w = @mu.synchronize { @cmds.shift }
        return unless op

        begin
          session.public_send(op, ch)
          w.set(:ok)
        rescue StandardError => e # refused; a lost connection shows in notifications next
          w.set(e)
        end
        drain(session)
      end
    end

    def fail_cmds(err)
      cmds = @mu.synchronize { @cmds.slice!(0..) }
      cmds.each { |_, _, w| w.set(err) }
    end

    def wake
      @wake_w.write_nonblock("x", exception: false)
    rescue IOError
      nil
    end

    def direct_cmd(op, channel)
      w = Waiter.new
      @mu.synchronize do
        raise HubFailure.new(:closed_by_application) if @closed

        @cmds << [op, channel, w]
        wake
      end
      _, result = w.wait
      raise result if result.is_a?(Exception)
    end
  end
end
