# frozen_string_literal: true

require_relative "support"
require "open3"

# The README's examples, as files: the worker (examples/worker.rb) with its pg-gem session
# receives through the hub, and from its own session once pgsse stops — with no backtrace.
class TestExamples < Minitest::Test
  include Support
  HERE = File.expand_path("..", __dir__)

  def test_readme_and_hub_protocol_show_the_example_files
    readme = File.read(File.join(HERE, "README.md"))
    %w[worker.rb pg_session.rb].each do |name|
      assert_includes readme, "```ruby\n#{File.read(File.join(HERE, "examples", name))}```",
                      "clients/ruby/README.md shows examples/#{name}"
    end
    assert_includes File.read(File.join(ROOT, "docs", "hub-protocol.md")),
                    "```ruby\n#{File.read(File.join(HERE, "examples", "worker.rb"))}```"
  end

  # A process's output lines, read on a thread; wait for one matching a pattern.
  class Lines
    def initialize(io)
      @lines = []
      @mu = Mutex.new
      @cv = ConditionVariable.new
      Thread.new do
        io.each_line { |l| @mu.synchronize { @lines << l.chomp; @cv.broadcast } }
      rescue IOError
        nil
      end
    end

    def text = @mu.synchronize { @lines.join("\n") }

    def wait(pattern, timeout: 30, poke: nil)
      deadline = Time.now + timeout
      loop do
        return if @mu.synchronize { @lines.any? { |l| l.match?(pattern) } }
        raise Minitest::Assertion, "no line matching #{pattern.inspect} within #{timeout} s; got #{text}" if Time.now > deadline

        poke&.call
        @mu.synchronize { @cv.wait(@mu, 0.2) }
      end
    end
  end

  def test_worker_fails_over_without_a_backtrace
    need_server
    server = Server.new
    env = { "PGSSE_HUB_SOCKET" => server.socket, "DATABASE_URL" => DSN, "RUBYLIB" => File.join(HERE, "lib") }
    stdin, stdout, stderr, wait = Open3.popen3(env, "ruby", "-e", "$stdout.sync = true; load ARGV.shift",
                                               File.join(HERE, "examples", "worker.rb"))
    out = Lines.new(stdout)
    err = Lines.new(stderr)
    # Until it has subscribed nothing reaches it: notify until one arrives.
    out.wait(/^job jobs hub$/, poke: -> { notify("jobs", "hub") })
    server.stop
    out.wait(/^re-read every job$/)
    notify("jobs", "own session")
    out.wait(/^job jobs own session$/)
    assert wait.alive?, "the worker keeps running on its own session"
    refute_match(/\.rb:\d+:in /, err.text, "no backtrace")
    assert_match(/shutdown: pgsse is shutting down.*switching to the application's own LISTEN session/, err.text)
  ensure
    Process.kill("KILL", wait.pid) if wait&.alive?
    [stdin, stdout, stderr].each { |io| io&.close }
    server&.close
  end
end
