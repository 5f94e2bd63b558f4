# shellcheck shell=bash
# Shared by bench/run and bench/profile: a throwaway cluster as the
# unprivileged test user, on its own port and socket directory, with the
# workload of bench/workload.sql loaded into database `bench`. Expects
# test/lib.sh sourced, and $repo, $port, $accounts and $replay_keys set.
# shellcheck disable=SC2154

# The fn every extension leg runs, as a client would pass it.
# shellcheck disable=SC2016
ext_fn='SELECT bench.withdraw($1, $2)'

log() { echo "bench: $*" >&2; }
fail() {
  echo "bench: FAILED: $*" >&2
  exit 1
}

# --- the cluster ------------------------------------------------------------

work=""
background_pids=()

cleanup() {
  local status=$?
  for pid in "${background_pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  if [ -n "$work" ] && [ -f "$work/data/postmaster.pid" ]; then
    as_test_user pg_ctl -D "$work/data" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  if [ -n "$work" ]; then
    if [ "${BENCH_KEEP:-0}" = 1 ] || [ "$status" -ne 0 ]; then
      log "work directory kept: $work"
    else
      rm -rf "$work"
    fi
  fi
}
trap cleanup EXIT

start_cluster() {
  work=$(mktemp -d /tmp/idempotency-bench.XXXXXX)
  mkdir -p "$work/logs"
  [ "$(id -u)" -eq 0 ] && chown -R "$TEST_USER" "$work"
  as_test_user initdb --no-sync -A trust -U postgres -D "$work/data" >/dev/null
  # autovacuum is off so it cannot land in one leg and not another; the
  # runner vacuums between rounds instead. That spares the textbook protocol
  # the cleanup of its dead in_progress row versions, in its favour.
  cat >>"$work/data/postgresql.conf" <<EOF
port = $port
listen_addresses = ''
unix_socket_directories = '$work'
shared_preload_libraries = 'idempotency'
shared_buffers = 256MB
max_wal_size = 8GB
checkpoint_timeout = 30min
autovacuum = off
${BENCH_CONF:-}
EOF
  pg_ctl_with start
}

# Starts or restarts the cluster; extra server options in $1.
pg_ctl_with() {
  local action=$1 options=${2:-}
  as_test_user pg_ctl -D "$work/data" -l "$work/server.log" -w -o "$options" \
    "$action" >/dev/null || {
    tail -20 "$work/server.log" >&2
    fail "pg_ctl $action"
  }
}

# psql as USER on DB, unaligned, stopping at the first error.
sql_as() {
  local user=$1 db=$2
  shift 2
  psql -X -q -At -v ON_ERROR_STOP=1 -h "$work" -p "$port" -U "$user" -d "$db" "$@"
}
admin() { sql_as postgres bench "$@"; }
as_bench() { sql_as bench bench "$@"; }

load_workload() {
  sql_as postgres postgres -c "CREATE ROLE bench LOGIN" \
    -c "CREATE DATABASE bench OWNER bench"
  admin -c "CREATE EXTENSION idempotency" \
    -c "CREATE EXTENSION pg_walinspect"
  as_bench -f "$repo/bench/workload.sql" >/dev/null
  as_bench -c "INSERT INTO bench.accounts SELECT id, 1000000000000000 FROM generate_series(1, $accounts) id"
  # The stored keys the replay legs pick from, written by the real calls.
  as_bench -c "SELECT count(bench.idempotent_withdraw('r' || i, 1 + i % $accounts, 1)) FROM generate_series(1, $replay_keys) i" \
    -c "SELECT count(idempotency.idempotent_call('r' || i, NULL, '$ext_fn', 1 + i % $accounts, 1::bigint)) FROM generate_series(1, $replay_keys) i" >/dev/null
  vacuum_all
}

vacuum_all() {
  admin -c "VACUUM (ANALYZE) bench.accounts, bench.ledger, bench.keys, idempotency.keys"
}

