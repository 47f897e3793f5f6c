# frozen_string_literal: true

require "logger"
require "socket"

module PgsseHub
  # What the application receives: kind :notification (channel, payload String with the exact
  # bytes PostgreSQL sent, tagged UTF-8; pid of the notifying backend), :down (notifications may
  # be missed until the next resync) or :resync (re-read the state behind channel; nil = every
  # channel).
  Event = Struct.new(:kind, :channel, :payload, :pid) do
    def self.notification(channel, payload, pid) = new(:notification, channel, payload, pid)
    def self.down = new(:down, nil, nil, 0)
    def self.resync(channel = nil) = new(:resync, channel, nil, 0)
  end

  # The hub client stopped. reason is one of :unavailable (no socket, connection refused),
  # :closed (EOF), :ack_timeout, :timeout (no answer to PING, a write that did not finish),
  # :evicted, :shutdown, :protocol, :closed_by_application; detail is what the hub or the socket
  # said.
  class HubFailure < StandardError
    attr_reader :reason, :detail

    def initialize(reason, detail = "")
      @reason = reason
      @detail = detail
      super("pgsse hub: #{reason}#{detail.empty? ? "" : ": #{detail}"}")
    end
  end

  # The hub refused a SUB or UNSUB (code_name "BAD_CHANNEL", "LISTEN_FAILED", "LIMIT" or
  # "NOT_SUBSCRIBED"). The client stays usable.
  class AckError < StandardError
    attr_reader :channel, :code, :code_name, :ack_message

    def initialize(channel, code, message)
      @channel = channel
      @code = code
      @code_name = ACK_CODES.fetch(code, code.to_s)
      @ack_message = message
      super("pgsse hub refused #{channel.inspect}: #{@code_name}: #{message}")
    end
  end

  # A one-shot value a thread waits for with a deadline.
  class Waiter
    def initialize
      @mu = Mutex.new
      @cv = ConditionVariable.new
      @set = false
      @value = nil
    end

    def set(value = true)
      @mu.synchronize do
        next if @set

        @set = true
        @value = value
        @cv.broadcast
      end
    end

    def set? = @mu.synchronize { @set }

    # [true, value] once set, [false, nil] after timeout seconds (nil = no deadline).
    def wait(timeout = nil)
      deadline = timeout && (Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout)
      @mu.synchronize do
        until @set
          left = deadline && (deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC))
          return [false, nil] if left && left <= 0

          @cv.wait(@mu, left)
        end
        [true, @value]
      end
    end
  end

  END_OF_EVENTS = Object.new.freeze

  # The bounded event queue shared by the reader thread(s) and the application's run, and the
  # callbacks run delivers to.
  class Dispatcher
    def initialize(event_buffer:, on_notification: nil, on_resync: nil, on_down: nil)
      @max = event_buffer
      @items = []
      @qmu = Mutex.new
      @qcv = ConditionVariable.new
      @closing = false
      @end = nil
      @on_notification = on_notification
      @on_resync = on_resync
      @on_down = on_down
    end

    # on_notification { |event| }: a notification (event.channel, event.payload, event.pid).
    def on_notification(&blk) = (@on_notification = blk)
    # on_resync { |channel| }: re-read the state behind channel (nil = every channel).
    def on_resync(&blk) = (@on_resync = blk)
    # on_down { }: pgsse lost its PostgreSQL session; notifications may be missed until the resync.
    def on_down(&blk) = (@on_down = blk)

    # The next Event; nil after timeout seconds (nil = wait) or once closed; raises the failure
    # that ended the client once everything before it was taken.
    def next_event(timeout = nil)
      deadline = timeout && (Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout)
      @qmu.synchronize do
        loop do
          return nil if @closing

          unless @items.empty?
            item = @items.first
            if item.equal?(END_OF_EVENTS)
              raise @end if @end

              return nil
            end
            @items.shift
            @qcv.broadcast
            return item
          end
          left = deadline && (deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC))
          return nil if left && left <= 0

          @qcv.wait(@qmu, left)
        end
      end
    end

    # Delivers events to the callbacks on the calling thread until close (then it returns) or
    # until the client can go on no longer (then it raises the HubFailure).
    def run
      while (ev = next_event)
        case ev.kind
        when :notification then @on_notification&.call(ev)
        when :resync then @on_resync&.call(ev.channel)
        when :down then @on_down&.call
        end
      end
    end

    private

    def closing? = @qmu.synchronize { @closing }

    # Queues item, blocking while the queue is full (the application is behind); false if close
    # was called meanwhile.
    def put(item)
      @qmu.synchronize do
        @qcv.wait(@qmu, 0.2) while !@closing && @items.size >= @max
        return false if @closing

        @items << item
        @qcv.broadcast
        true
      end
    end

    # Ends the event stream after what is queued: run raises err.
    def finish(err)
      @qmu.synchronize do
        @end = err
        @items << END_OF_EVENTS
        @qcv.broadcast
      end
    end

    def start_closing
      @qmu.synchronize do
        @closing = true
        @qcv.broadcast
      end
    end
  end

  # One connection to the hub (docs/hub-protocol.md). Connects, says HELLO and waits for STATUS
  # READY in new, raising HubFailure if the hub is not there or does not take the worker. On any
  # later failure the client stops: run raises the HubFailure (#failure holds it). Use Failover
  # to fall back to the application's own session.
  class HubClient < Dispatcher
    attr_reader :failure, :last_down

    def initialize(path, name: nil, mode: LOSSLESS, connect_timeout: 2.0, ack_timeout: 5.0, ping_interval: 5.0,
                   event_buffer: 4096, on_notification: nil, on_resync: nil, on_down: nil, logger: nil,
                   dispatcher: nil, on_fail: nil)
      super(event_buffer: event_buffer, on_notification: on_notification, on_resync: on_resync, on_down: on_down)
      @d = dispatcher || self
      @on_fail = on_fail
      @path = path
      @mode = mode
      @ack_timeout = ack_timeout
      @ping_interval = ping_interval
      @log = logger || Logger.new($stderr, level: Logger::WARN, progname: "pgsse_hub")
      @name = (name || File.basename($PROGRAM_NAME)).b.byteslice(0, MAX_NAME)
      @mu = Mutex.new
      @wmu = Mutex.new
      @subs = {}
      @pending = {} # req => [channel, unsub, Waiter]
      @pongs = {}
      @req = 0
      @failure = nil
      @last_down = false
      @failed = Waiter.new
      @ping_sent = nil
      @last_recv = now
      @delivering = false
      @dec = Decoder.new
      connect(connect_timeout)
      @reader = Thread.new { read_loop }
      @reader.name = "pgsse-hub-reader"
      return unless ping_interval&.positive?

      @pinger = Thread.new { ping_loop }
      @pinger.name = "pgsse-hub-ping"
    end

    # Sends SUB and returns once the hub answered ACK OK — which it does only once the LISTEN
    # completed on pgsse's PostgreSQL session: every notification committed after this returns
    # is delivered. Raises AckError (code_name says why) or HubFailure.
    def subscribe(channel)
      ch = PgsseHub.channel_name(channel)
      return if @mu.synchronize { @subs.key?(ch) }

      code, msg = request(ch, false)
      raise AckError.new(ch, code, msg) unless code.zero?
    end

    # Sends UNSUB; notifications for channel stop at once. KeyError if it was not subscribed.
    def unsubscribe(channel)
      ch = PgsseHub.channel_name(channel)
      @mu.synchronize do
        raise KeyError, "not subscribed to #{ch.inspect}" unless @subs.delete(ch)
      end
      code, msg = request(ch, true)
      raise AckError.new(ch, code, msg) unless [0, 4].include?(code)
    end

    # Sends PING and waits for its PONG; returns the round trip in seconds.
    def ping(timeout = 5.0)
      w = Waiter.new
      token = @mu.synchronize do
        @req += 1
        t = (1 << 63) | @req
        @pongs[t] = w
        t
      end
      t0 = now
      write(PgsseHub.encode(Frame.new(type: PING, token: token)))
      ok, = w.wait(timeout)
      @mu.synchronize { @pongs.delete(token) }
      raise @failure if @failure
      raise HubFailure.new(:timeout, "no PONG within #{timeout} s") unless ok

      now - t0
    end

    def channels = @mu.synchronize { @subs.keys.sort }

    # Closes the connection; run returns.
    def close
      start_closing if @d.equal?(self)
      fail_with(HubFailure.new(:closed_by_application))
      [@reader, @pinger].each { |t| t&.join(5) unless t.equal?(Thread.current) }
      nil
    end

    private

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    def connect(timeout)
      @sock = Socket.new(:UNIX, :STREAM)
      begin
        @sock.connect_nonblock(Socket.sockaddr_un(@path))
      rescue IO::WaitWritable
        raise HubFailure.new(:unavailable, "#{@path}: connect timed out") unless @sock.wait_writable(timeout)

        begin
          @sock.connect_nonblock(Socket.sockaddr_un(@path))
        rescue Errno::EISCONN
          nil
        end
      end
      write_raw(PgsseHub.encode(Frame.new(type: HELLO, pid: Process.pid, name: @name)), timeout)
      handshake(now + timeout)
    rescue SystemCallError, IOError, ArgumentError => e
      @sock&.close
      raise HubFailure.new(:unavailable, "#{@path}: #{e.message}")
    rescue HubFailure
      @sock&.close
      raise
    end

    def handshake(deadline)
      loop do
        if (f = @dec.next)
          return if f.type == STATUS && f.code == READY
          raise PgsseHub.status_failure(f) if f.type == STATUS

          raise HubFailure.new(:protocol, "expected STATUS READY, got #{TYPE_NAMES[f.type]}")
        end
        left = deadline - now
        raise HubFailure.new(:unavailable, "no STATUS READY within the connect timeout") if left <= 0 ||
                                                                                             !@sock.wait_readable(left)

        data = @sock.read_nonblock(65_536, exception: false)
        raise HubFailure.new(:closed, "EOF before READY") if data.nil?

        @dec.feed(data) if data.is_a?(String)
      end
    rescue ProtocolError => e
      raise HubFailure.new(:protocol, e.message)
    end

    def read_loop
      until @failed.set?
        while (f = @dec.next)
          return unless handle(f)
        end
        begin
          data = @sock.readpartial(65_536)
        rescue EOFError
          return fail_with(HubFailure.new(:closed, "EOF"))
        rescue IOError, SystemCallError => e
          return fail_with(HubFailure.new(:closed, e.message))
        end
        @last_recv = now
        @dec.feed(data)
      end
    rescue ProtocolError => e
      fail_with(HubFailure.new(:protocol, e.message))
    end

    def handle(f)
      case f.type
      when NOTIFY
        ch = PgsseHub.text(f.channel)
        return true unless @mu.synchronize { @subs.key?(ch) } # unsubscribed while it was in flight

        deliver(Event.notification(ch, PgsseHub.text(f.text), f.pid))
      when ACK
        p = @mu.synchronize do
          pend = @pending.delete(f.req)
          # Subscribed from this frame on: a NOTIFY right behind the ACK is delivered.
          @subs[pend[0]] = true if pend && !pend[1] && f.code.zero?
          pend
        end
        p&.[](2)&.set([f.code, PgsseHub.text(f.text)])
        true
      when STATUS
        case f.code
        when READY then true
        when LISTENER_DOWN
          @last_down = true
          deliver(Event.down)
        when RESYNC
          if f.channel.empty?
            @last_down = false
            return deliver(Event.resync)
          end
          ch = PgsseHub.text(f.channel)
          return true unless @mu.synchronize { @subs.key?(ch) }

          deliver(Event.resync(ch))
        else
          fail_with(PgsseHub.status_failure(f))
          false
        end
      when PONG
        @ping_sent = nil
        w = @mu.synchronize { @pongs.delete(f.token) }
        w&.set
        true
      else
        fail_with(HubFailure.new(:protocol, "unexpected #{TYPE_NAMES[f.type]} frame from the hub"))
        false
      end
    end

    def deliver(event)
      @delivering = true
      @d.send(:put, event) && !@failed.set?
    ensure
      @delivering = false
    end

    def fail_with(failure)
      pending = @mu.synchronize do
        return if @failure

        @failure = failure
        all = @pending.values + @pongs.values.map { |w| [nil, nil, w] }
        @pending.clear
        all
      end
      @failed.set
      begin
        @sock.shutdown(Socket::SHUT_RDWR)
      rescue IOError, SystemCallError
        nil
      end
      @sock.close unless @sock.closed?
      pending.each { |p| p[2].set(nil) }
      @log.info(failure.message) unless failure.reason == :closed_by_application
      if @on_fail
        @on_fail.call(failure, self)
      elsif failure.reason != :closed_by_application
        finish(failure)
      end
      nil
    end

    def write(data, timeout = 5.0)
      @wmu.synchronize do
        raise @failure if @failed.set?

        write_raw(data, timeout)
      rescue HubFailure => e
        fail_with(e)
        raise @failure
      rescue IOError, SystemCallError => e
        fail_with(HubFailure.new(:closed, "write: #{e.message}"))
        raise @failure
      end
    end

    # The reader thread blocks in readpartial on the same socket: writes are non-blocking,
    # waiting for room up to the deadline.
    def write_raw(data, timeout)
      deadline = now + timeout
      until data.empty?
        n = @sock.write_nonblock(data, exception: false)
        if n == :wait_writable
          left = deadline - now
          raise HubFailure.new(:timeout, "a write did not finish within #{timeout} s") if left <= 0

          @sock.wait_writable(left)
          next
        end
        data = data.byteslice(n..)
      end
    end

    def request(channel, unsub)
      w = Waiter.new
      req = @mu.synchronize do
        raise @failure if @failure

        @req = (@req + 1) & 0xFFFFFFFF
        @pending[@req] = [channel, unsub, w]
        @req
      end
      frame = unsub ? Frame.new(type: UNSUB, req: req, channel: channel) : Frame.new(type: SUB, req: req, mode: @mode, channel: channel)
      write(PgsseHub.encode(frame))
      ok, value = w.wait(@ack_timeout)
      fail_with(HubFailure.new(:ack_timeout, "no ACK for #{channel.inspect} within #{@ack_timeout} s")) unless ok
      raise @failure if value.nil?

      value
    end

    def ping_loop
      token = 0
      last_seen = nil
      stale = 0
      loop do
        done, = @failed.wait(@ping_interval)
        return if done

        recv = @last_recv
        if @ping_sent && recv == last_seen && !@delivering
          stale += 1
          return fail_with(HubFailure.new(:timeout, "no answer to PING")) if stale >= 2

          next
        end
        stale = 0
        last_seen = recv
        next if @ping_sent

        token += 1
        @ping_sent = now
        begin
          write(PgsseHub.encode(Frame.new(type: PING, token: token)))
        rescue HubFailure
          return
        end
      end
    end
  end

  module_function

  # A channel name as the hub and PostgreSQL take it: 1-63 bytes without NUL (ArgumentError).
  def channel_name(channel)
    ch = channel.to_s.dup.force_encoding(Encoding::UTF_8)
    raise ArgumentError, "channel #{channel.inspect}: must be 1-#{MAX_CHANNEL} bytes without NUL" unless
      (1..MAX_CHANNEL).cover?(ch.bytesize) && !ch.include?("\0")

    ch
  end

  def text(bytes) = bytes.dup.force_encoding(Encoding::UTF_8)

  def status_failure(f)
    reason = { SHUTDOWN => :shutdown, EVICTED => :evicted, PROTOCOL_ERROR => :protocol }.fetch(f.code, :protocol)
    detail = text(f.text)
    HubFailure.new(reason, detail.empty? ? STATUS_CODES[f.code] : detail)
  end
end
