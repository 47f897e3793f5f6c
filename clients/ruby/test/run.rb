# frozen_string_literal: true

# Runs every test: ruby clients/ruby/test/run.rb (clients/clients_test.go does, with a server).
Dir[File.join(__dir__, "test_*.rb")].sort.each { |f| require f }
