# The clients scenario from ruby-pg (see test/clients/run): bare
# placeholders; `typed` passes Ruby values through a type map that gives each
# parameter its type (Integer as int8, String as text, true as bool, Time as
# timestamptz, Hash as jsonb, Array as text[]); `untyped` passes
# strings with no types, as exec_params does by default.
#
#   ruby scenario.rb typed|untyped
require 'pg'
require 'json'

TYPED = ARGV[0] == 'typed'
PREFIX = "#{ENV.fetch('CLIENTS_RUN')}-#{ENV.fetch('CLIENTS_CONFIG')}-"
ACCOUNT = Integer(ENV.fetch('CLIENTS_ACCOUNT'))
UUID = 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'
DOC = { 'a' => 1, 'b' => [true, nil] }.freeze

# The values of record_types, as each configuration passes them.
def type_values(tag)
  if TYPED
    # A BigDecimal has no scale: BigDecimal('12.50') goes as 12.5, another
    # numeric than the 12.50 the other drivers send. The amount goes as text.
    [tag, true, Time.utc(2026, 1, 2, 3, 4, 5), UUID, DOC, '12.50']
  else
    [tag, 'true', '2026-01-02 03:04:05+00', UUID, JSON.generate(DOC), '12.50']
  end
end

def result(step, field, value)
  puts "RESULT #{step} #{field} #{value}"
  $stdout.flush
end

def sqlstate(error)
  error.result&.error_field(PG::PG_DIAG_SQLSTATE)
end

def step(name)
  yield
rescue PG::Error => e
  result(name, 'error', "#{sqlstate(e)} #{e.message}".tr("\n", ' '))
end

# docs:begin ruby-pg
CALL_WITHDRAW = <<~SQL
  SELECT idempotency.idempotent_call($1, NULL, 'SELECT withdraw($1, $2)', $2, $3)::text AS response,
         idempotency.last_call_replayed() AS replayed
SQL

class Busy < StandardError; end
class KeyReused < StandardError; end

def withdraw(conn, key, account, amount)
  row = conn.exec_params(CALL_WITHDRAW, [key, account, amount]).first
  [row['response'], row['replayed'] == 't'] # ['{"account": 7, "balance": 9700}', false]
rescue PG::Error => e
  case e.result&.error_field(PG::PG_DIAG_SQLSTATE)
  when 'IK409' then raise Busy, key # 409: retry later with the same key
  when 'IK422' then raise KeyReused, key # 422: a new request needs a new key
  else raise
  end
end
# docs:end ruby-pg

CALL_TYPES = <<~SQL
  SELECT idempotency.idempotent_call($1, NULL, 'SELECT record_types($1, $2, $3, $4, $5, $6)',
                                     $2, $3, $4, $5, $6, $7)::text AS response,
         idempotency.last_call_replayed() AS replayed
SQL

def boolean(value)
  value == 't'
end

def connect(application)
  conn = PG.connect(application_name: application)
  conn.type_map_for_queries = typed_parameters if TYPED
  conn
end

TEXT_ARRAY = PG::TextEncoder::Array.new(elements_type: PG::TextEncoder::String.new, oid: 1009)
JSONB_ARRAY = PG::TextEncoder::Array.new(elements_type: PG::TextEncoder::JSON.new, oid: 3807)

def typed_parameters
  map = PG::TypeMapByClass.new
  map[Array] = TEXT_ARRAY
  map[Integer] = PG::TextEncoder::Integer.new(oid: 20)
  map[String] = PG::TextEncoder::String.new(oid: 25)
  map[TrueClass] = map[FalseClass] = PG::TextEncoder::Boolean.new(oid: 16)
  map[Time] = PG::TextEncoder::TimestampWithTimeZone.new(oid: 1184)
  map[Hash] = PG::TextEncoder::JSON.new(oid: 3802)
  map
end

def report_call(name, conn, sql, params)
  step(name) do
    row = conn.exec_params(sql, params).first
    result(name, 'response', row['response'])
    result(name, 'replayed', boolean(row['replayed']))
  end
end

conn = connect('clients')
other = connect('clients-holder')

first = "#{PREFIX}first"
%w[first retry].each do |name|
  step(name) do
    response, replayed = withdraw(conn, first, ACCOUNT + 1, 300)
    result(name, 'response', response)
    result(name, 'replayed', replayed)
  rescue Busy, KeyReused => e
    raise e.cause
  end
end
step('conflict') do
  conn.exec_params(CALL_WITHDRAW, [first, ACCOUNT + 1, 301])
rescue PG::Error => e
  result('conflict', 'sqlstate', sqlstate(e))
end

step('busy') do
  key = "#{PREFIX}busy"
  other.transaction do |holder|
    holder.exec_params(CALL_WITHDRAW, [key, ACCOUNT + 2, 100])
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    begin
      conn.exec_params(CALL_WITHDRAW, [key, ACCOUNT + 2, 100])
    rescue PG::Error => e
      result('busy', 'sqlstate', sqlstate(e))
    end
    result('busy', 'elapsed_ms', ((Process.clock_gettime(Process::CLOCK_MONOTONIC) - started) * 1000).to_i)
  end
  report_call('busy_after', conn, CALL_WITHDRAW, [key, ACCOUNT + 2, 100])
end

step('handler') do
  key = "#{PREFIX}handler"
  conn.transaction do |tx|
    claim = tx.exec_params('SELECT replayed FROM idempotency.claim($1, $2)', [key, 'hash-1']).first
    result('handler_claim', 'replayed', boolean(claim['replayed']))
    work = tx.exec_params('SELECT withdraw($1::int, $2)::text AS response', [ACCOUNT + 3, 50]).first['response']
    result('handler_work', 'response', work)
    tx.exec_params('SELECT idempotency.complete($1, $2)', [key, TYPED ? JSON.parse(work) : work]) # a Hash is jsonb
  end
  again = conn.transaction do |tx|
    tx.exec_params('SELECT replayed, response::text FROM idempotency.claim($1, $2)', [key, 'hash-1']).first
  end
  result('handler_again', 'replayed', boolean(again['replayed']))
  result('handler_again', 'response', again['response'])
end

step('release') do
  key = "#{PREFIX}release"
  conn.transaction do |tx|
    tx.exec_params('SELECT replayed FROM idempotency.claim($1, $2)', [key, nil])
    tx.exec_params('SELECT idempotency.release($1)', [key])
  end
  result('release_lookup', 'state', conn.exec_params('SELECT state FROM idempotency.lookup($1)', [key]).first['state'])
  conn.exec('BEGIN')
  replayed = conn.exec_params('SELECT replayed FROM idempotency.claim($1, $2)', [key, nil]).first['replayed']
  conn.exec('ROLLBACK')
  result('release_again', 'replayed', boolean(replayed))
end

# Three keys, the second with a nil request hash, in one transaction:
# withdraw for each claimed key, then complete_batch with the answers. In
# `typed` an Array goes as text[] (the type map) and the answers as Hashes
# through a jsonb[] encoder; in `untyped` the arrays go as array literals,
# untyped. Then the batch again with the first key repeated under another
# hash.
def batch_array(values)
  TYPED ? values : PG::TextEncoder::Array.new.encode(values)
end

batch_keys = (0..2).map { |i| "#{PREFIX}batch-#{i}" }
batch_hashes = ['hash-0', nil, 'hash-2']
step('batch') do
  conn.transaction do |tx|
    claims = tx.exec_params('SELECT outcome FROM idempotency.claim_batch($1, $2) ORDER BY ordinality',
                            [batch_array(batch_keys), batch_array(batch_hashes)]).column_values(0)
    keys = []
    responses = []
    claims.each_with_index do |outcome, i|
      result("batch.#{i}", 'outcome', outcome)
      next unless outcome == 'claimed'

      work = tx.exec_params('SELECT withdraw($1::int, $2)::text AS response', [ACCOUNT + 6 + i, 10 * (i + 1)])
               .first['response']
      result("batch.#{i}", 'response', work)
      keys << batch_keys[i]
      responses << (TYPED ? JSON.parse(work) : work)
    end
    if TYPED
      tx.exec_params('SELECT idempotency.complete_batch($1, $2)', [keys, responses], 0,
                     PG::TypeMapByColumn.new([TEXT_ARRAY, JSONB_ARRAY]))
    else
      tx.exec_params('SELECT idempotency.complete_batch($1, $2)', [batch_array(keys), batch_array(responses)])
    end
  end
end
step('batch_retry') do
  rows = conn.transaction do |tx|
    tx.exec_params('SELECT outcome, sqlstate, response::text FROM idempotency.claim_batch($1, $2) ORDER BY ordinality',
                   [batch_array(batch_keys + batch_keys[0, 1]), batch_array(batch_hashes + ['hash-0-other'])]).to_a
  end
  rows.each_with_index do |row, i|
    result("batch_retry.#{i}", 'outcome', row['outcome'])
    result("batch_retry.#{i}", 'sqlstate', row['sqlstate'])
    result("batch_retry.#{i}", 'response', row['response'])
  end
end

key = "#{PREFIX}types"
%w[types types_retry].each { |name| report_call(name, conn, CALL_TYPES, [key] + type_values(key)) }
key = "#{PREFIX}types-null"
%w[types_null types_null_retry].each { |name| report_call(name, conn, CALL_TYPES, [key, key, nil, nil, nil, nil, nil]) }

[['prepared', 'auto', ACCOUNT + 4], ['prepared_generic', 'force_generic_plan', ACCOUNT + 5]].each do |name, mode, account|
  step(name) do
    conn.exec("SET plan_cache_mode = #{mode}")
    conn.prepare(name, CALL_WITHDRAW, TYPED ? [25, 20, 20] : nil) # text, int8, int8 when typed
    %w[run retry].each do |run|
      20.times do |i|
        row = conn.exec_prepared(name, ["#{PREFIX}#{name}-#{i}", account, i + 1]).first
        result("#{name}.#{run}.#{i}", 'response', row['response'])
      end
    end
    conn.exec('RESET plan_cache_mode')
  end
end

report_call('cross', conn, CALL_WITHDRAW, [ENV.fetch('CLIENTS_CROSS_KEY'), Integer(ENV.fetch('CLIENTS_CROSS_ACCOUNT')), 250])
report_call('cross_types', conn, CALL_TYPES,
            ["#{ENV.fetch('CLIENTS_CROSS_KEY')}-types"] + type_values(ENV.fetch('CLIENTS_CROSS_TAG')))
other.close
conn.close
