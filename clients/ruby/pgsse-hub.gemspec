# frozen_string_literal: true

require_relative "lib/pgsse_hub"

Gem::Specification.new do |s|
  s.name = "pgsse-hub"
  s.version = PgsseHub::VERSION
  s.summary = "Worker client for pgsse's hub socket: share one PostgreSQL LISTEN session, fail over to your own"
  s.description = "Subscribes worker processes (Puma, Sidekiq, any Ruby) to PostgreSQL notifications through " \
                  "pgsse's hub socket, with ACK-after-LISTEN, RESYNC handling and failover to the " \
                  "application's own LISTEN session. Standard library only."
  s.authors = ["pgsse"]
  s.license = "MIT"
  s.files = Dir["lib/**/*.rb"] + ["README.md"]
  s.require_paths = ["lib"]
  s.required_ruby_version = ">= 3.0"
  s.metadata = { "rubygems_mfa_required" => "true" }
end
