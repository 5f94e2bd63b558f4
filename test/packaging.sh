#!/usr/bin/env bash
# Packaging checks: `make install` honours DESTDIR and PG_CONFIG, installs
# every versioned script the control file needs, META.json agrees with the
# control file, and the docs' relative links resolve (test/doc-links.py, whose
# own self-test, test/doc-links-test.py, runs first).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pg_config=${PG_CONFIG:-pg_config}
stage=$(mktemp -d /tmp/idempotency-stage.XXXXXX)
trap 'rm -rf "$stage"' EXIT
passed=0
failed=0
check() {
  local what=$1
  shift
  if "$@"; then
    echo "ok - $what"
    passed=$((passed + 1))
  else
    echo "not ok - $what"
    failed=$((failed + 1))
  fi
}

make -C "$repo" -s install DESTDIR="$stage" PG_CONFIG="$pg_config" >/dev/null
libdir=$stage$("$pg_config" --pkglibdir)
extdir=$stage$("$pg_config" --sharedir)/extension

check "the library lands under DESTDIR" test -f "$libdir/idempotency.so"
check "the control file lands under DESTDIR" test -f "$extdir/idempotency.control"
default_version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$repo/idempotency.control")
check "an install script for 0.1 is installed" test -f "$extdir/idempotency--0.1.sql"
# The current version installs from its own script, built from idempotency.sql.
check "the install script of $default_version is idempotency.sql" \
  cmp -s "$repo/idempotency.sql" "$extdir/idempotency--$default_version.sql"
# Every version up to the default is reachable from 0.1 by update scripts.
reachable() {
  local version=0.1
  while [ "$version" != "$default_version" ]; do
    local next
    next=$(cd "$extdir" && ls "idempotency--$version--"*.sql 2>/dev/null | head -n 1 |
      sed "s/^idempotency--$version--\(.*\)\.sql$/\1/")
    [ -n "$next" ] || return 1
    version=$next
  done
}
check "default_version $default_version is reachable from 0.1" reachable
# The version META.json's "provides" gives the extension (first "version"
# after "provides").
meta_version=$(awk '/"provides"/ { p = 1 } p && /"version"/ { gsub(/.*"version": *"|".*/, ""); print; exit }' "$repo/META.json")
check "META.json provides version $meta_version for control version $default_version" \
  test "$meta_version" = "$default_version.0"
# The build must stop because of the missing pg_config itself, not fail for
# any other reason (a broken tree would fail too).
fails_for_missing_pg_config() {
  local output
  if output=$(make -C "$repo" -s install DESTDIR="$stage/other" PG_CONFIG=/nonexistent/pg_config 2>&1); then
    echo "make succeeded without a pg_config"
    return 1
  fi
  grep -q 'PG_CONFIG=/nonexistent/pg_config is not a working pg_config' <<<"$output" ||
    { echo "make failed, but not for the missing pg_config: $output"; return 1; }
  [ ! -e "$stage/other" ] || { echo "make installed something under $stage/other"; return 1; }
}
check "PG_CONFIG chooses the installation (a missing pg_config fails the build)" \
  fails_for_missing_pg_config

# The link checker flags each kind of broken link (a checker that finds
# nothing would pass any docs), then the docs' relative links name files and
# headings that exist.
check "test/doc-links.py flags every kind of broken link it checks (test/doc-links-test.py)" \
  python3 "$repo/test/doc-links-test.py"
check "every relative link of the Markdown files resolves" python3 "$repo/test/doc-links.py"

echo "packaging: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
