#!/usr/bin/env bash
# The clients scenario from psql: values as literals in the SQL, bare
# placeholders in fn. Prints RESULT lines (see test/clients/run).
set -euo pipefail

prefix="$CLIENTS_RUN-$CLIENTS_CONFIG-"
account=$CLIENTS_ACCOUNT
acc_first=$((account + 1)) acc_busy=$((account + 2)) acc_handler=$((account + 3))
acc_prepared=$((account + 4)) acc_generic=$((account + 5)) acc_batch=$((account + 6))

run_psql() { psql -X -qAt -v ON_ERROR_STOP=0 -v prefix="$prefix" "$@"; }

# first call, retry, conflict, handler code, types, cross-driver retries
run_psql -v acc_first=$acc_first -v acc_handler=$acc_handler \
  -v cross_key="$CLIENTS_CROSS_KEY" -v cross_account="$CLIENTS_CROSS_ACCOUNT" \
  -v cross_tag="$CLIENTS_CROSS_TAG" <<'SQL'
\set key :prefix 'first'
\set account :acc_first
\set amount 300
-- docs:begin psql
SELECT idempotency.idempotent_call(:'key', NULL, 'SELECT withdraw($1, $2)', :account, :amount)::text AS response,
       idempotency.last_call_replayed()::text AS replayed
\gset
-- docs:end psql
\echo RESULT first response :response
\unset response
\echo RESULT first replayed :replayed
\unset replayed
SELECT idempotency.idempotent_call(:'key', NULL, 'SELECT withdraw($1, $2)', :account, :amount)::text AS response,
       idempotency.last_call_replayed()::text AS replayed
\gset
\echo RESULT retry response :response
\unset response
\echo RESULT retry replayed :replayed
\unset replayed
SELECT idempotency.idempotent_call(:'key', NULL, 'SELECT withdraw($1, $2)', :account, 301);
\echo RESULT conflict sqlstate :SQLSTATE

\set key :prefix 'handler'
BEGIN;
SELECT replayed::text AS replayed FROM idempotency.claim(:'key', 'hash-1') \gset
\echo RESULT handler_claim replayed :replayed
\unset replayed
SELECT withdraw(:acc_handler, 50)::text AS work \gset
\echo RESULT handler_work response :work
SELECT idempotency.complete(:'key', :'work') \gset
\unset work
COMMIT;
BEGIN;
SELECT replayed::text AS replayed, response::text AS response FROM idempotency.claim(:'key', 'hash-1') \gset
COMMIT;
\echo RESULT handler_again replayed :replayed
\unset replayed
\echo RESULT handler_again response :response
\unset response

\set key :prefix 'release'
BEGIN;
SELECT replayed::text AS replayed FROM idempotency.claim(:'key', NULL) \gset
\unset replayed
SELECT idempotency.release(:'key') \gset
COMMIT;
SELECT state AS state FROM idempotency.lookup(:'key') \gset
\echo RESULT release_lookup state :state
\unset state
BEGIN;
SELECT replayed::text AS replayed FROM idempotency.claim(:'key', NULL) \gset
ROLLBACK;
\echo RESULT release_again replayed :replayed
\unset replayed

\set key :prefix 'types'
\set tag :prefix 'types'
SELECT idempotency.idempotent_call(:'key', NULL, 'SELECT record_types($1, $2, $3, $4, $5, $6)',
         :'tag', true, '2026-01-02 03:04:05+00', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
         '{"a": 1, "b": [true, null]}', 12.50)::text AS response,
       idempotency.last_call_replayed()::text AS replayed \gset
\echo RESULT types response :response
\unset response
\echo RESULT types replayed :replayed
\unset replayed
SELECT idempotency.idempotent_call(:'key', NULL, 'SELECT record_types($1, $2, $3, $4, $5, $6)',
         :'tag', true, '2026-01-02 03:04:05+00', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
         '{"a": 1, "b": [true, null]}', 12.50)::text AS response,
       idempotency.last_call_replayed()::text AS replayed \gset
\echo RESULT types_retry response :response
\unset response
\echo RESULT types_retry replayed :replayed
\unset replayed

\set key :prefix 'types-null'
\set tag :prefix 'types-null'
SELECT idempotency.idempotent_call(:'key', NULL, 'SELECT record_types($1, $2, $3, $4, $5, $6)',
         :'tag', NULL, NULL, NULL, NULL, NULL)::text AS response,
       idempotency.last_call_replayed()::text AS replayed \gset
\echo RESULT types_null response :response
\unset response
\echo RESULT types_null replayed :replayed
\unset replayed
SELECT idempotency.idempotent_call(:'key', NULL, 'SELECT record_types($1, $2, $3, $4, $5, $6)',
         :'tag', NULL, NULL, NULL, NULL, NULL)::text AS response,
       idempotency.last_call_replayed()::text AS replayed \gset
\echo RESULT types_null_retry response :response
\unset response
\echo RESULT types_null_retry replayed :replayed
\unset replayed

SELECT idempotency.idempotent_call(:'cross_key', NULL, 'SELECT withdraw($1, $2)', :cross_account, 250)::text AS response,
       idempotency.last_call_replayed()::text AS replayed \gset
\echo RESULT cross response :response
\unset response
\echo RESULT cross replayed :replayed
\unset replayed
\set key :cross_key '-types'
SELECT idempotency.idempotent_call(:'key', NULL, 'SELECT record_types($1, $2, $3, $4, $5, $6)',
         :'cross_tag', true, '2026-01-02 03:04:05+00', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
         '{"a": 1, "b": [true, null]}', 12.50)::text AS response,
       idempotency.last_call_replayed()::text AS replayed \gset
\echo RESULT cross_types response :response
\unset response
\echo RESULT cross_types replayed :replayed
\unset replayed
SQL

# A server-side prepared statement (PREPARE, parameters untyped) executed
# 20 times with different keys, then 20 retries; once with the default
# plan cache, once with generic plans forced.
prepared() { # step plan_cache_mode account
  local i
  {
    echo "SET plan_cache_mode = $2;"
    echo "PREPARE call_withdraw AS SELECT idempotency.idempotent_call(\$1, NULL, 'SELECT withdraw(\$1, \$2)', \$2, \$3)::text;"
    for pass in run retry; do
      for i in $(seq 0 19); do
        echo "EXECUTE call_withdraw('$prefix$1-$i', $3, $((i + 1))) \\gset"
        echo "\\echo RESULT $1.$pass.$i response :idempotent_call"
        echo "\\unset idempotent_call"
      done
    done
  } | run_psql
}
prepared prepared auto $acc_prepared
prepared prepared_generic force_generic_plan $acc_generic

# claim_batch / complete_batch: three keys in one transaction, the second
# with a NULL request hash; withdraw for each claimed key, its answer kept in
# an array literal (psql's jsonb[]) for complete_batch. Then the same batch
# again with the first key repeated under another hash: three replays and
# one IK422 refusal.
batch() {
  local i keys="ARRAY['${prefix}batch-0', '${prefix}batch-1', '${prefix}batch-2']"
  local hashes="ARRAY['hash-0', NULL, 'hash-2']"
  {
    echo "BEGIN;"
    echo "SELECT o[1] AS outcome_0, o[2] AS outcome_1, o[3] AS outcome_2"
    echo "  FROM (SELECT array_agg(outcome ORDER BY ordinality) AS o FROM idempotency.claim_batch($keys, $hashes)) b \\gset"
    echo "\\set done_keys '{}'"
    echo "\\set done_works '{}'"
    for i in 0 1 2; do
      echo "\\echo RESULT batch.$i outcome :outcome_$i"
      echo "SELECT :'outcome_$i' = 'claimed' AS claimed \\gset"
      echo "\\if :claimed"
      echo "SELECT withdraw($((acc_batch + i)), $((10 * (i + 1))))::text AS work \\gset"
      echo "\\echo RESULT batch.$i response :work"
      echo "SELECT array_append(:'done_keys'::text[], '${prefix}batch-$i') AS done_keys,"
      echo "       array_append(:'done_works'::jsonb[], :'work') AS done_works \\gset"
      echo "\\endif"
    done
    echo "SELECT idempotency.complete_batch(:'done_keys', :'done_works') \\gset"
    echo "COMMIT;"
    echo "BEGIN;"
    echo "SELECT 'RESULT batch_retry.' || (ordinality - 1) || ' ' || field || ' ' || value"
    echo "  FROM idempotency.claim_batch($keys || '${prefix}batch-0'::text, $hashes || 'hash-0-other'::text),"
    echo "       LATERAL (VALUES ('outcome', outcome), ('response', response::text), ('sqlstate', sqlstate)) f (field, value)"
    echo "  WHERE value IS NOT NULL ORDER BY ordinality;"
    echo "COMMIT;"
  } | run_psql
}
batch

# IK409: a second session holds the key in an open transaction.
key="${prefix}busy"
call="SELECT idempotency.idempotent_call('$key', NULL, 'SELECT withdraw(\$1, \$2)', $acc_busy, 100)::text"
coproc holder { PGAPPNAME=clients-holder-$CLIENTS_CONFIG run_psql >/dev/null; }
echo "BEGIN; $call;" >&"${holder[1]}"
deadline=$((SECONDS + 10))
until [ "$(run_psql -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'clients-holder-$CLIENTS_CONFIG' AND state = 'idle in transaction'")" = 1 ]; do
  [ "$SECONDS" -lt "$deadline" ] || { echo "the holder never held the key" >&2; break; }
  sleep 0.05
done
started=$EPOCHREALTIME
sqlstate=$(run_psql -c "$call" -c '\echo :SQLSTATE' 2>/dev/null | tail -n 1)
elapsed_ms=$(( (${EPOCHREALTIME/./} - ${started/./}) / 1000 ))
echo "RESULT busy sqlstate $sqlstate"
echo "RESULT busy elapsed_ms $elapsed_ms"
# shellcheck disable=SC2154 # holder_PID is set by coproc
holder_pid=$holder_PID
echo "COMMIT;" >&"${holder[1]}"
eval "exec ${holder[1]}>&-" # the holder reads to the end of its input and leaves
wait "$holder_pid" || true
run_psql <<SQL
$call AS response, idempotency.last_call_replayed()::text AS replayed \gset
\echo RESULT busy_after response :response
\unset response
\echo RESULT busy_after replayed :replayed
\unset replayed
SQL
