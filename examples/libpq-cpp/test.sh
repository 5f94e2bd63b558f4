#!/usr/bin/env bash
# End-to-end test of the libpq example: builds withdraw.cpp warning-free,
# then runs it against the payment service's database and checks its exit
# status, its output and the ledger for every error path a driver handles.
#
#   test.sh BUILD_DIR
#
# The PG* variables name a database where the idempotency extension is
# created and examples/http/schema.sql is loaded.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=$1
withdraw_bin=$build/withdraw
tmp=$(mktemp -d "$build/test.XXXXXX")
run=$RANDOM$RANDOM # keeps keys apart across runs
holder_pid=
gate_pid=
gate_lock=7001 # advisory lock the key holder waits for before it commits

cleanup() {
  if [ -n "$holder_pid" ]; then kill "$holder_pid" 2>/dev/null || true; fi
  if [ -n "$gate_pid" ]; then kill "$gate_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

sql() { psql -X -qAt -v ON_ERROR_STOP=1 -c "$1"; }

# A field of a JSON document, e.g. json_field "$out" replayed.
json_field() {
  psql -X -qAt -v ON_ERROR_STOP=1 -v doc="$1" -v path="{$2}" <<<"SELECT (:'doc'::jsonb) #>> :'path'"
}

new_account() { sql "INSERT INTO accounts (id, balance) SELECT coalesce(max(id), 0) + 1, $1 FROM accounts RETURNING id"; }
ledger_rows() { sql "SELECT count(*) FROM ledger WHERE account_id = $1"; }
balance_of() { sql "SELECT balance FROM accounts WHERE id = $1"; }

# Runs the program; leaves its exit status, stdout and stderr in
# $status, $out and $err.
withdraw() {
  set +e
  "$withdraw_bin" "$@" >"$tmp/out" 2>"$tmp/err"
  status=$?
  set -e
  out=$(<"$tmp/out")
  err=$(<"$tmp/err")
}

expect() { # what actual expected
  if [ "$2" != "$3" ]; then
    echo "    $1: got '$2', expected '$3'"
    [ -n "${err:-}" ] && echo "    program stderr: $err"
    return 1
  fi
}

expect_match() { # what text pattern
  if ! grep -q -- "$3" <<<"$2"; then
    echo "    $1: '$2' does not contain '$3'"
    return 1
  fi
}

wait_for() { # what sql expected
  local deadline=$((SECONDS + 10))
  until [ "$(sql "$2")" = "$3" ]; do
    if [ "$SECONDS" -ge "$deadline" ]; then echo "    timed out waiting for $1"; return 1; fi
    sleep 0.05
  done
}

# The gate: a session holding an advisory lock until open_gate; the key
# holder waits for that lock before it commits, so it holds its key exactly
# as long as a case needs, however slow the machine.
close_gate() {
  mkfifo "$tmp/gate"
  psql -X -qAt -v ON_ERROR_STOP=1 <"$tmp/gate" >/dev/null &
  gate_pid=$!
  exec 3>"$tmp/gate"
  echo "SET application_name = 'gate'; SELECT pg_advisory_lock($gate_lock);" >&3
  wait_for "the gate to close" \
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = $gate_lock AND granted" 1
}

# Background processes start with descriptor 3 closed (3>&-), so that this
# is the gate's input's last writer.
open_gate() {
  exec 3>&- # psql reaches the end of its input and leaves
  wait "$gate_pid"
  gate_pid=
  rm -f "$tmp/gate"
}

# Another session runs the same withdrawal and holds its key, uncommitted,
# until open_gate; its response is written to $tmp/holder.out.
hold_key() { # key account amount
  close_gate
  psql -X -qAt -v ON_ERROR_STOP=1 -v key="$1" -v account="$2" -v amount="$3" \
    >"$tmp/holder.out" 3>&- <<SQL &
SET application_name = 'key-holder';
BEGIN;
SELECT idempotency.idempotent_call(:'key', NULL, 'SELECT withdraw(\$1, \$2)',
                                   :'account'::bigint, :'amount'::bigint);
SELECT 'gate passed' FROM pg_advisory_xact_lock($gate_lock);
COMMIT;
SQL
  holder_pid=$!
  wait_for "the holder to claim the key and wait at the gate" \
    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'key-holder' AND wait_event = 'advisory'" 1
}

holder_finished() {
  wait "$holder_pid"
  holder_pid=
  head -n 1 "$tmp/holder.out"
}

# Starts the program in the background; withdraw_finished waits for it and
# leaves $status, $out and $err as withdraw does.
withdraw_in_background() {
  "$withdraw_bin" "$@" >"$tmp/out" 2>"$tmp/err" 3>&- &
  withdraw_pid=$!
}

withdraw_finished() {
  set +e
  wait "$withdraw_pid"
  status=$?
  set -e
  out=$(<"$tmp/out")
  err=$(<"$tmp/err")
}

wait_for_stderr() { # pattern
  local deadline=$((SECONDS + 30))
  until grep -q -- "$1" "$tmp/err"; do
    if [ "$SECONDS" -ge "$deadline" ]; then echo "    the program never printed '$1': $(<"$tmp/err")"; return 1; fi
    sleep 0.02
  done
}

case_builds_warning_free() {
  make -s -C "$here" BUILD_DIR="$build" >/dev/null 2>"$tmp/build.err" || { cat "$tmp/build.err"; return 1; }
  expect "compiler diagnostics" "$(cat "$tmp/build.err")" "" && [ -x "$withdraw_bin" ]
}

case_first_call_runs_then_replays() {
  local account first_response
  account=$(new_account 1000)
  withdraw "k-$run-first" "$account" 300
  expect "exit status" "$status" 0 || return 1
  expect "replayed" "$(json_field "$out" replayed)" false || return 1
  expect "balance in response" "$(json_field "$out" response,balance)" 700 || return 1
  first_response=$(json_field "$out" response)

  withdraw "k-$run-first" "$account" 300
  expect "exit status of the retry" "$status" 0 || return 1
  expect "replayed" "$(json_field "$out" replayed)" true || return 1
  expect "replayed response" "$(json_field "$out" response)" "$first_response" || return 1
  expect "ledger rows" "$(ledger_rows "$account")" 1 || return 1
  expect "balance" "$(balance_of "$account")" 700
}

case_key_reused_is_ik422() {
  local account
  account=$(new_account 1000)
  withdraw "k-$run-reused" "$account" 300
  withdraw "k-$run-reused" "$account" 301
  expect "exit status" "$status" 3 || return 1
  expect_match "stderr" "$err" IK422 || return 1
  expect "ledger rows" "$(ledger_rows "$account")" 1
}

case_invalid_keys_are_22023() {
  local account
  account=$(new_account 1000)
  withdraw "" "$account" 300
  expect "exit status for an empty key" "$status" 2 || return 1
  expect_match "stderr" "$err" 22023 || return 1
  withdraw "$(printf 'k%.0s' {1..256})" "$account" 300
  expect "exit status for a 256-byte key" "$status" 2 || return 1
  expect "ledger rows" "$(ledger_rows "$account")" 0
}

case_business_errors_are_not_retried() {
  local account
  account=$(new_account 100)
  withdraw "k-$run-poor" "$account" 300
  expect "exit status for insufficient funds" "$status" 4 || return 1
  expect_match "stderr" "$err" PY402 || return 1
  withdraw "k-$run-nobody" 999999 1
  expect "exit status for an unknown account" "$status" 4 || return 1
  expect_match "stderr" "$err" P0002
}

case_ik409_is_retried_until_replay() {
  local account held
  account=$(new_account 1000)
  hold_key "k-$run-busy" "$account" 300
  withdraw_in_background "k-$run-busy" "$account" 300
  wait_for_stderr "retryable error (IK409)" || return 1
  open_gate
  held=$(holder_finished)
  withdraw_finished
  expect "exit status" "$status" 0 || return 1
  expect_match "stderr" "$err" "retryable error (IK409)" || return 1
  expect "replayed" "$(json_field "$out" replayed)" true || return 1
  expect "response" "$(json_field "$out" response)" "$held" || return 1
  expect "ledger rows" "$(ledger_rows "$account")" 1
}

case_40001_under_repeatable_read_is_retried() {
  local account
  account=$(new_account 1000)
  hold_key "k-$run-rr" "$account" 300
  # Waits for the holder instead of failing with IK409; when the holder
  # commits, the key is newer than this transaction's snapshot: 40001.
  PGOPTIONS="-c default_transaction_isolation=repeatable\\ read -c idempotency.wait_timeout=600000" \
    withdraw_in_background "k-$run-rr" "$account" 300
  wait_for "the program to wait for the holder" \
    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'idempotency-libpq-example' AND wait_event_type = 'Lock'" 1 || return 1
  open_gate
  holder_finished >/dev/null
  withdraw_finished
  expect "exit status" "$status" 0 || return 1
  expect_match "stderr" "$err" "retryable error (40001)" || return 1
  expect "replayed" "$(json_field "$out" replayed)" true || return 1
  expect "ledger rows" "$(ledger_rows "$account")" 1
}

case_lost_connection_is_retried_with_the_same_key() {
  local account
  account=$(new_account 1000)
  hold_key "k-$run-lost" "$account" 300
  withdraw_in_background "k-$run-lost" "$account" 300
  wait_for_stderr "attempt 2:" || return 1
  sql "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'idempotency-libpq-example'" >/dev/null
  wait_for_stderr "connection lost" || return 1
  open_gate
  holder_finished >/dev/null
  withdraw_finished
  expect "exit status" "$status" 0 || return 1
  expect_match "stderr" "$err" "connection lost" || return 1
  expect "replayed" "$(json_field "$out" replayed)" true || return 1
  expect "ledger rows" "$(ledger_rows "$account")" 1 || return 1
  expect "balance" "$(balance_of "$account")" 700
}

passed=0
failed=0
for case_name in case_builds_warning_free case_first_call_runs_then_replays \
  case_key_reused_is_ik422 case_invalid_keys_are_22023 \
  case_business_errors_are_not_retried case_ik409_is_retried_until_replay \
  case_40001_under_repeatable_read_is_retried \
  case_lost_connection_is_retried_with_the_same_key; do
  if "$case_name"; then
    echo "ok - ${case_name#case_}"
    passed=$((passed + 1))
  else
    echo "not ok - ${case_name#case_}"
    failed=$((failed + 1))
  fi
  if [ "$case_name" = case_builds_warning_free ] && [ "$failed" -ne 0 ]; then break; fi
done
echo "libpq-cpp: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
