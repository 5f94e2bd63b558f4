#!/usr/bin/env bash
# Packaging checks: `make install` honours DESTDIR and PG_CONFIG, installs
# the install script of the default version and the update script from the
# previous release (0.7, the one other version the library serves) and no
# other version's script, every package's version agrees with the control
# file's, and the docs' relative links resolve and each setting and SQLSTATE
# is defined on its home page only (test/doc-links.py, whose own self-test,
# test/doc-links-test.py, runs first).
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
# The current version installs from its own script, built from idempotency.sql.
check "the install script of $default_version is idempotency.sql" \
  cmp -s "$repo/idempotency.sql" "$extdir/idempotency--$default_version.sql"
# A database at 0.7 or 1.0 updates along the chain of update scripts
# 0.7 -> 1.0 -> the default version; the library serves the schema of the
# version before its own, and of 0.7 through the same chain.
update_scripts=("idempotency--0.7--1.0.sql" "idempotency--1.0--$default_version.sql")
for script in "${update_scripts[@]}"; do
  check "the update script $script is installed" test -f "$extdir/$script"
done
is_current_script() { # name
  local script
  [ "$1" = "idempotency--$default_version.sql" ] && return 0
  for script in "${update_scripts[@]}"; do
    [ "$1" = "$script" ] && return 0
  done
  return 1
}
# No other version's script: an install script of an older version would
# make a database the library does not serve.
only_current_scripts() { # dir
  local script others=()
  for script in "$1"/idempotency--*.sql; do
    is_current_script "$(basename "$script")" || others+=("$(basename "$script")")
  done
  [ "${#others[@]}" -eq 0 ] || { echo "other scripts: ${others[*]}"; return 1; }
}
check "no script of another version is installed (only $default_version's and the update chain)" \
  only_current_scripts "$extdir"
# The repository holds no other version's script either (make installs
# every idempotency--*.sql there is).
check "the repository holds no script of another version" only_current_scripts "$repo"
# The release's version agrees everywhere it is stated (test/versions.py):
# META.json, debian/changelog, the npm, Python and Go packages carry the control
# file's X.Y as X.Y.0. The checker first shows it flags each one changed
# alone (a checker that finds nothing would pass any tree).
check "test/versions.py: every version agrees with default_version $default_version" \
  python3 "$repo/test/versions.py"
versions_flags_each_change() {
  local file copy=$stage/versions
  for file in META.json debian/changelog packages/node/package.json packages/node/package-lock.json \
    packages/python/pyproject.toml packages/python/src/idempotency_pg/__init__.py packages/go/idempotency/doc.go \
    idempotency.control; do
    rm -rf "$copy"
    mkdir -p "$copy"
    (cd "$repo" && cp --parents idempotency.control META.json debian/changelog packages/node/package.json \
      packages/node/package-lock.json packages/python/pyproject.toml \
      packages/python/src/idempotency_pg/__init__.py packages/go/idempotency/doc.go "$copy"/)
    # The first mention of the version in the file, changed.
    sed -i "0,/'$default_version'\|$default_version\.0/s//'9.9'/" "$copy/$file"
    cmp -s "$repo/$file" "$copy/$file" && { echo "$file: the version was not changed"; return 1; }
    python3 "$repo/test/versions.py" "$copy" >/dev/null &&
      { echo "test/versions.py passed with the version changed in $file"; return 1; }
  done
  return 0
}
check "test/versions.py flags a version changed in any one of its files" versions_flags_each_change
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

# The link checker flags each kind of broken link and a definition outside
# its home page (a checker that finds nothing would pass any docs), then the
# docs' relative links name files and headings that exist, and settings and
# SQLSTATEs are defined in docs/settings.md and docs/errors.md only.
check "test/doc-links.py flags every kind of broken link and a duplicate definition (test/doc-links-test.py)" \
  python3 "$repo/test/doc-links-test.py"
check "every relative link of the Markdown files resolves, each setting and SQLSTATE is defined once" python3 "$repo/test/doc-links.py"

echo "packaging: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
