#!/usr/bin/env bash
# The extension as a Debian package: builds postgresql-NN-idempotency for
# the major of PG_CONFIG (NN; 15 on the host, the root's own in
# test/run-majors) from debian/ with dpkg-buildpackage (pg_buildext, as
# every postgresql-NN-* package is built, debian/control made for that major
# from debian/control.in), checks what it holds, installs it, and plays the
# retry demo (examples/retry-demo/run) against the installed package.
#
# Installing: when PG_CONFIG is the system's PostgreSQL (a fresh machine,
# CI), with `apt-get install ./postgresql-NN-idempotency_*.deb`, which stays
# installed. When PG_CONFIG belongs to a copy of PostgreSQL under a prefix
# (<root>/usr/lib/postgresql/NN, an engineer's private copy on a shared
# machine), the package's files are unpacked into <root> with `dpkg-deb -x`
# instead, and the system's PostgreSQL is left alone.
#
# Ends with "debian: N passed, M failed". DEBIAN_PGPORT is the demo
# cluster's port (default 55443).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=test/lib.sh
source "$repo/test/lib.sh"

work=$(mktemp -d /tmp/idempotency-debian.XXXXXX)
chmod 755 "$work"
keep=false
trap '$keep || rm -rf "$work"' EXIT
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

missing=()
for pkg in build-essential debhelper dpkg-dev libssl-dev postgresql-server-dev-all; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -ne 0 ]; then
  echo "installing: ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The tracked files only: no build output or node_modules in the package.
mkdir "$work/idempotency"
if git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$work/idempotency")
else
  cp -a "$repo"/. "$work/idempotency"/
  rm -rf "$work/idempotency/build"
fi
echo "building the package (dpkg-buildpackage -b -us -uc) for PostgreSQL $PG_MAJOR"
echo "$PG_MAJOR" >"$work/idempotency/debian/pgversions"
# PG_SUPPORTED_VERSIONS: postgresql-common lists a major as supported only
# once it is released (19 is a release candidate in experimental). In CI
# (CI=true) a warning fails the package's build too (pg_buildext passes
# MAKEVARS to make).
if ! (cd "$work/idempotency" && export PG_SUPPORTED_VERSIONS=$PG_MAJOR ${CI:+MAKEVARS=WERROR=1} &&
  pg_buildext updatecontrol >"$work/build.log" 2>&1 &&
  dpkg-buildpackage -b -us -uc >>"$work/build.log" 2>&1); then
  keep=true
  tail -n 40 "$work/build.log"
  echo "debian: 0 passed, 1 failed (the build failed; its log: $work/build.log)"
  exit 1
fi
deb=$(ls "$work"/postgresql-$PG_MAJOR-idempotency_*_*.deb)
listing=$(dpkg-deb -c "$deb" | awk '{print $6}')
field() { dpkg-deb -f "$deb" "$1"; }

meta_version=$(sed -n 's/^   "version": "\(.*\)",$/\1/p' "$repo/META.json")
control_version=$(sed -n "s/^default_version = '\(.*\)'$/\1/p" "$repo/idempotency.control")
check "the package is postgresql-$PG_MAJOR-idempotency" test "$(field Package)" = postgresql-$PG_MAJOR-idempotency
check "its version is META.json's ($meta_version)" test "$(field Version)" = "$meta_version"
check "its version is the control file's default_version ($control_version)" \
  test "${meta_version%.*}" = "$control_version"
check "it depends on postgresql-$PG_MAJOR" grep -q "postgresql-$PG_MAJOR" <<<"$(field Depends)"
check "it holds the library" grep -qx "./usr/lib/postgresql/$PG_MAJOR/lib/idempotency.so" <<<"$listing"
check "it holds the control file" grep -qx "./usr/share/postgresql/$PG_MAJOR/extension/idempotency.control" <<<"$listing"
every_script=true
for script in "$repo"/idempotency--*.sql; do
  grep -qx "./usr/share/postgresql/$PG_MAJOR/extension/$(basename "$script")" <<<"$listing" || every_script=false
done
check "it holds every versioned SQL script" $every_script
check "it holds the install script of $control_version" \
  grep -qx "./usr/share/postgresql/$PG_MAJOR/extension/idempotency--$control_version.sql" <<<"$listing"

pkglibdir=$("$PG_CONFIG" --pkglibdir)
root=${pkglibdir%/usr/lib/postgresql/$PG_MAJOR/lib}
if [ "$root" = "$pkglibdir" ]; then
  echo "PG_CONFIG's library directory $pkglibdir is not .../usr/lib/postgresql/$PG_MAJOR/lib: cannot install the package for it" >&2
  failed=$((failed + 1))
elif [ -z "$root" ]; then
  echo "installing: apt-get install $deb"
  # --reinstall: on a machine where an earlier run left the package installed,
  # make install has since replaced its library; the package must win again.
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --allow-downgrades --reinstall "$deb" >/dev/null
  check "apt-get installed the package" \
    bash -c "dpkg-query -W -f='\${Status}' postgresql-$PG_MAJOR-idempotency | grep -q 'install ok installed'"
  check "dpkg knows the library as the package's" \
    bash -c "dpkg -S $pkglibdir/idempotency.so | grep -q '^postgresql-$PG_MAJOR-idempotency:'"
else
  echo "PG_CONFIG is a PostgreSQL under $root: unpacking the package there (dpkg-deb -x), not apt-get"
  dpkg-deb -x "$deb" "$root"
fi
mkdir "$work/unpacked"
dpkg-deb -x "$deb" "$work/unpacked"
check "the installed library is the package's" cmp -s "$work/unpacked/usr/lib/postgresql/$PG_MAJOR/lib/idempotency.so" \
  "$pkglibdir/idempotency.so"

# The demo, against the package as installed: CREATE EXTENSION, then a
# request delivered three times runs once.
if DEMO_SKIP_BUILD=1 DEMO_PGPORT=${DEBIAN_PGPORT:-55443} "$repo/examples/retry-demo/run" >"$work/demo.out" 2>&1; then
  demo_ran=true
else
  demo_ran=false
fi
check "the retry demo runs against the installed package" $demo_ran
check "the demo's request delivered three times ran once and was replayed twice" \
  bash -c "[ \"\$(grep -c '| req-7f3a |    300 | ran withdraw' '$work/demo.out')\" = 1 ] &&
           [ \"\$(grep -c '| req-7f3a |    300 | replayed' '$work/demo.out')\" = 2 ]"
if [ "$failed" -ne 0 ]; then
  keep=true
  echo "--- the demo's output ($work keeps the build log and the package)"
  head -n 40 "$work/demo.out"
fi
echo "debian: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
