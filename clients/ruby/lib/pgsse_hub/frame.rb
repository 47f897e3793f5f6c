# frozen_string_literal: true

module PgsseHub
  MAX_BODY = 65_536 # largest body length N a frame may announce (type byte included)
  MAX_NAME = 64     # longest HELLO name
  MAX_CHANNEL = 63  # PostgreSQL's identifier limit
  VERSION_BYTE = 1

  HELLO = 0x01
  SUB = 0x02
  UNSUB = 0x03
  PING = 0x04
  ACK = 0x81
  NOTIFY = 0x82
  STATUS = 0x83
  PONG = 0x84
  TYPE_NAMES = { HELLO => "HELLO", SUB => "SUB", UNSUB => "UNSUB", PING => "PING",
                 ACK => "ACK", NOTIFY => "NOTIFY", STATUS => "STATUS", PONG => "PONG" }.freeze

  LOSSLESS = 0
  WAKE = 1

  ACK_CODES = { 0 => "OK", 1 => "BAD_CHANNEL", 2 => "LISTEN_FAILED", 3 => "LIMIT", 4 => "NOT_SUBSCRIBED" }.freeze
  STATUS_CODES = { 1 => "READY", 2 => "LISTENER_DOWN", 3 => "RESYNC", 4 => "SHUTDOWN", 5 => "EVICTED",
                   6 => "PROTOCOL_ERROR" }.freeze
  READY = 1
  LISTENER_DOWN = 2
  RESYNC = 3
  SHUTDOWN = 4
  EVICTED = 5
  PROTOCOL_ERROR = 6

  # Bytes that break docs/hub-protocol.md; the connection cannot go on.
  class ProtocolError < StandardError; end

  # One decoded frame. Only the fields of its type are set (docs/hub-protocol.md, Frames):
  # HELLO version/pid/name, SUB req/mode/channel, UNSUB req/channel, PING and PONG token,
  # ACK req/code/text, NOTIFY pid/channel/text (the payload), STATUS code/channel/text.
  # Strings are binary (ASCII-8BIT).
  Frame = Struct.new(:type, :version, :pid, :name, :req, :mode, :channel, :code, :text, :token,
                     keyword_init: true) do
    def initialize(type:, version: 0, pid: 0, name: "".b, req: 0, mode: 0, channel: "".b, code: 0, text: "".b,
                   token: 0)
      super(type: type, version: version, pid: pid, name: name.b, req: req, mode: mode, channel: channel.b,
            code: code, text: text.b, token: token)
    end
  end

  module_function

  def check_channel(channel, allow_empty: false)
    return if channel.empty? && allow_empty
    raise ProtocolError, "channel must be 1-#{MAX_CHANNEL} bytes, got #{channel.bytesize}" unless
      (1..MAX_CHANNEL).cover?(channel.bytesize)
    raise ProtocolError, "channel contains a NUL byte" if channel.include?("\0")
  end

  # Decodes the frame at buf[start..]. Returns [frame, bytes used], or [nil, 0] when buf holds
  # only part of a frame. Raises ProtocolError for a length of 0 or over 65536, an unknown type
  # or code, or a field cut short — as soon as the bytes show it.
  def decode(buf, start = 0)
    buf = buf.b unless buf.encoding == Encoding::BINARY
    avail = buf.bytesize - start
    return [nil, 0] if avail < 4

    n = buf.byteslice(start, 4).unpack1("N")
    raise ProtocolError, "frame length #{n} is outside 1-#{MAX_BODY}" unless (1..MAX_BODY).cover?(n)
    return [nil, 0] if avail < 5

    t = buf.getbyte(start + 4)
    raise ProtocolError, format("unknown frame type 0x%02x", t) unless TYPE_NAMES.key?(t)
    return [nil, 0] if avail < 4 + n

    [decode_body(t, buf.byteslice(start + 5, n - 1)), 4 + n]
  end

  def decode_body(t, b)
    name = TYPE_NAMES[t]
    need = ->(k) { raise ProtocolError, "#{name} frame ends inside a field" if b.bytesize < k }
    case t
    when HELLO
      need.call(5)
      raise ProtocolError, "HELLO version #{b.getbyte(0)} (want #{VERSION_BYTE})" if b.getbyte(0) != VERSION_BYTE
      raise ProtocolError, "HELLO name longer than #{MAX_NAME} bytes" if b.bytesize - 5 > MAX_NAME

      Frame.new(type: t, version: b.getbyte(0), pid: b.byteslice(1, 4).unpack1("N"), name: b.byteslice(5..))
    when SUB
      need.call(5)
      raise ProtocolError, "SUB mode #{b.getbyte(4)} (want 0 or 1)" if b.getbyte(4) > WAKE

      check_channel(b.byteslice(5..))
      Frame.new(type: t, req: b.unpack1("N"), mode: b.getbyte(4), channel: b.byteslice(5..))
    when UNSUB
      need.call(4)
      check_channel(b.byteslice(4..))
      Frame.new(type: t, req: b.unpack1("N"), channel: b.byteslice(4..))
    when PING, PONG
      need.call(8)
      raise ProtocolError, "#{name} body must be exactly a u64 token" if b.bytesize > 8

      Frame.new(type: t, token: b.unpack1("Q>"))
    when ACK
      need.call(5)
      raise ProtocolError, "ACK code #{b.getbyte(4)} is not 0-4" unless ACK_CODES.key?(b.getbyte(4))

      Frame.new(type: t, req: b.unpack1("N"), code: b.getbyte(4), text: b.byteslice(5..))
    when NOTIFY
      need.call(5)
      stop = 5 + b.getbyte(4)
      need.call(stop)
      check_channel(b.byteslice(5, stop - 5))
      Frame.new(type: t, pid: b.unpack1("N"), channel: b.byteslice(5, stop - 5), text: b.byteslice(stop..))
    else # STATUS
      need.call(2)
      raise ProtocolError, "STATUS code #{b.getbyte(0)} is not 1-6" unless STATUS_CODES.key?(b.getbyte(0))

      stop = 2 + b.getbyte(1)
      need.call(stop)
      check_channel(b.byteslice(2, stop - 2), allow_empty: true)
      Frame.new(type: t, code: b.getbyte(0), channel: b.byteslice(2, stop - 2), text: b.byteslice(stop..))
    end
  end

  # Encodes a Frame (any type) to its bytes: length, type, fields.
  def encode(f)
    body =
      case f.type
      when HELLO then [f.type, f.version.zero? ? VERSION_BYTE : f.version, f.pid].pack("CCN") + f.name.byteslice(0, MAX_NAME)
      when SUB then [f.type, f.req, f.mode].pack("CNC") + f.channel
      when UNSUB then [f.type, f.req].pack("CN") + f.channel
      when PING, PONG then [f.type, f.token].pack("CQ>")
      when ACK then [f.type, f.req, f.code].pack("CNC") + f.text
      when NOTIFY then [f.type, f.pid, f.channel.bytesize].pack("CNC") + f.channel + f.text
      when STATUS then [f.type, f.code, f.channel.bytesize].pack("CCC") + f.channel + f.text
      else raise ArgumentError, "unknown frame type #{f.type.inspect}"
      end
    raise ArgumentError, "frame body of #{body.bytesize} bytes exceeds #{MAX_BODY}" if body.bytesize > MAX_BODY

    [body.bytesize].pack("N") + body
  end

  # Buffers bytes as they arrive (frames come in arbitrary pieces) and yields whole frames.
  class Decoder
    def initialize
      @buf = +"".b
      @off = 0 # bytes of @buf already decoded
    end

    def feed(data)
      if @off.positive?
        @buf = @buf.byteslice(@off..)
        @off = 0
      end
      @buf << data.b
    end

    # The next whole frame, or nil until more bytes arrive; raises ProtocolError.
    def next
      f, n = PgsseHub.decode(@buf, @off)
      @off += n
      f
    end
  end
end
