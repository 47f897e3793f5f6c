# frozen_string_literal: true

require_relative "support"

# The frame decoder against the hex examples of docs/hub-protocol.md (read from the doc, not
# copied), and against malformed input.
class TestFrames < Minitest::Test
  H = PgsseHub
  DOC = File.join(Support::ROOT, "docs", "hub-protocol.md")
  TYPES = H::TYPE_NAMES.invert
  ACKS = H::ACK_CODES.invert
  STATUSES = H::STATUS_CODES.invert

  def section = File.read(DOC).split("## Worked example (hex)", 2)[1].split("\n## ", 2)[0]

  # [description, bytes] for each row of the 'Worked example (hex)' table.
  def rows
    section.lines.filter_map do |line|
      cells = line.strip.delete_prefix("|").delete_suffix("|").split("|").map(&:strip)
      next unless cells.size == 2 && cells[1].start_with?("`")

      [cells[0], [cells[1].scan(/`([0-9a-f]+)`/).join].pack("H*")]
    end
  end

  # The Frame a row's description names: 'SUB req 7, lossless, `jobs`'.
  def expected(desc)
    t = TYPES.fetch(desc.split.first)
    f = { type: t }
    %w[req pid token version].each { |k| f[k.to_sym] = Regexp.last_match(1).to_i if desc =~ /\b#{k} (\d+)/ }
    f[:mode] = H::LOSSLESS if desc =~ /\blossless\b/
    f[:mode] = H::WAKE if desc =~ /\bwake\b/
    codes = { H::ACK => ACKS, H::STATUS => STATUSES }.fetch(t, {})
    codes.each { |name, code| f[:code] = code if desc =~ /\b#{name}\b/ }
    desc.scan(/(\w+)? ?`([^`]*)`/).each do |label, value|
      key = if label == "name" then :name
            elsif %w[payload text].include?(label) || t == H::ACK then :text
            else :channel
            end
      f[key] = value
    end
    f[:version] ||= 1 if t == H::HELLO
    H::Frame.new(**f)
  end

  def test_table_rows_decode_to_what_they_say
    assert_operator rows.size, :>=, 16, "rows of the hex table in docs/hub-protocol.md"
    seen = []
    rows.each do |desc, data|
      want = expected(desc)
      f, n = H.decode(data)
      assert_equal data.bytesize, n, "#{desc}: one whole frame per row"
      assert_equal want, f, desc
      assert_equal data, H.encode(f), "#{desc}: re-encodes to the same bytes"
      d = H::Decoder.new # frames arrive in arbitrary pieces
      got = data.bytes.each_with_index.filter_map do |b, i|
        d.feed(b.chr)
        (fr = d.next) && [i, fr]
      end
      assert_equal [[data.bytesize - 1, want]], got, "#{desc}: byte by byte"
      seen << f.code if f.type == H::STATUS
    end
    H::STATUS_CODES.each { |code, name| assert_includes seen, code, "the doc shows STATUS #{name}" }
  end

  def test_session_decodes_in_order
    session = section.scan(/(sends|reads) `([0-9a-f]+)`/).map { |v, hx| [v, [hx].pack("H*")] }
    assert_equal %w[sends reads sends reads reads], session.map(&:first)
    assert_equal [H::HELLO, H::STATUS, H::SUB, H::ACK, H::NOTIFY], session.map { |_, b| H.decode(b)[0].type }
    d = H::Decoder.new
    d.feed(session.select { |v, _| v == "reads" }.map(&:last).join)
    assert_equal [H::STATUS, H::ACK, H::NOTIFY], Array.new(3) { d.next.type }
    assert_nil d.next
    notify = H.decode(session.last[1])[0]
    assert_equal ["jobs", "42"], [notify.channel, notify.text]
  end

  MALFORMED = [
    ["length 0", "0000000083", "length 0"],
    ["length over 65536", "0001000183", "length 65537"],
    ["unknown type", "000000017f", "unknown frame type 0x7f"],
    ["ACK cut short", "00000003810000", "ends inside a field"],
    ["ACK code 5", "000000068100000001" "05", "ACK code 5"],
    ["STATUS code 0", "00000003830000", "STATUS code 0"],
    ["STATUS channel past the end", "0000000483" "03" "05" "6a", "ends inside a field"],
    ["NOTIFY channel empty", "0000000782" "00000001" "00" "78", "channel must be 1-63"],
    ["NOTIFY channel with NUL", "0000000882" "00000001" "02" "6100", "NUL"],
    ["PONG with trailing bytes", "0000000a84" "000000000000000101", "exactly a u64"],
    ["SUB mode 2", "0000000702" "00000001" "02" "61", "SUB mode 2"],
    ["HELLO version 2", "0000000601" "02" "00000001", "HELLO version 2"]
  ].freeze

  def test_malformed_frames_are_protocol_errors
    MALFORMED.each do |name, hx, msg|
      err = assert_raises(H::ProtocolError, name) { H.decode([hx].pack("H*")) }
      assert_includes err.message, msg, name
    end
  end

  def test_incomplete_is_not_an_error
    data = ["0000000c8200007a69046a6f62733432"].pack("H*")
    (0...data.bytesize).each { |i| assert_equal [nil, 0], H.decode(data.byteslice(0, i)) }
  end
end
