# Shared by test/run-all, examples/retry-demo/run and bench/run: install
# prerequisites, build and install the extension, and run commands as an
# unprivileged user.

PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
PG_BINDIR=$("$PG_CONFIG" --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)
TEST_USER=${TEST_USER:-postgres}
export PG_CONFIG

# The PostgreSQL major under test: PG_CONFIG's, or 15 before it is installed.
PG_MAJOR=$("$PG_CONFIG" --version 2>/dev/null | sed -n 's/^PostgreSQL \([0-9]*\).*/\1/p')
PG_MAJOR=${PG_MAJOR:-15}

# Debian packages the build and the suites need: libssl-dev for the
# OpenSSL headers the hashing includes (docs/architecture.md); pgbouncer for
# test/tap/402_pgbouncer.pl; libfaketime for the TAP files that set the
# server's clock (107, 221). On the host's PostgreSQL 15 also what only the
# host runs: python3-matplotlib for bench/scale's plot (its smoke runs in
# CI); clang-format and clang-tidy for the format and lint checks;
# debootstrap for test/pg-root. The examples, clients and packages install
# their own wherever they run.
PREREQUISITES=("postgresql-$PG_MAJOR" "postgresql-server-dev-$PG_MAJOR" libssl-dev libipc-run-perl make g++
  cmake libgtest-dev pgbouncer libfaketime)
[ "$PG_MAJOR" = 15 ] && PREREQUISITES+=(python3-matplotlib clang-format clang-tidy debootstrap)

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

install_prerequisites() {
  local missing=()
  for pkg in "${PREREQUISITES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  echo "installing: ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# In CI (CI=true) a warning fails the build.
build_and_install() {
  make -C "$repo" -s -j"$(nproc)" PG_CONFIG="$PG_CONFIG" ${CI:+WERROR=1}
  as_root make -C "$repo" -s install PG_CONFIG="$PG_CONFIG" >/dev/null
}

# Runs a command as the test user (initdb refuses to run as root).
as_test_user() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u "$TEST_USER" -- env PATH="$PG_BINDIR:$PATH" PG_CONFIG="$PG_CONFIG" "$@"
  else
    env PATH="$PG_BINDIR:$PATH" "$@"
  fi
}

# A copy of the source tree the test user can write into (test outputs,
# temporary clusters); prints its path.
scratch_copy() {
  local dir
  dir=$(mktemp -d /tmp/idempotency-test.XXXXXX)
  cp -a "$repo"/. "$dir"/
  rm -rf "$dir/.git" "$dir/build" "$dir/tmp_check" "$dir/results" "$dir/output_iso"
  [ "$(id -u)" -eq 0 ] && chown -R "$TEST_USER" "$dir"
  echo "$dir"
}
