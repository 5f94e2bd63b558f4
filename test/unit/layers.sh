#!/usr/bin/env bash
# Structure checks, run by `make` (before the library links) and by ctest
# with the unit tests:
#  - the project's headers are under include/idempotency/, each layer's
#    beside the others (include/idempotency/<layer>/), and included by that
#    prefixed name, so none can shadow a PostgreSQL header;
#  - every `#include "idempotency/..."` in src/ and include/ points into its
#    own layer's folder or down the layers (docs/architecture.md), never up
#    or sideways;
#  - every SQL-callable function is declared in src/entry/functions.cpp, and
#    every C symbol the install scripts name is declared there.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"

# Layers, top first; folders on one line are one layer and include none of
# each other.
layer_of() {
  case $1 in
  entry) echo 5 ;;
  worker) echo 4 ;;
  protocol) echo 3 ;;
  storage | fingerprint | stats) echo 2 ;;
  settings | boundary) echo 1 ;;
  *) echo "unknown layer: $1" >&2; return 1 ;;
  esac
}

failures=0
fail() {
  echo "not ok - $*"
  failures=$((failures + 1))
}

# The folder (layer) a source or header belongs to: src/<layer>/x.cpp,
# include/idempotency/<layer>/x.hpp.
folder_of() {
  case $1 in
  src/*) cut -d/ -f2 <<<"$1" ;;
  include/idempotency/*) cut -d/ -f3 <<<"$1" ;;
  esac
}

stray_headers=$(find src -name '*.hpp' -o -name '*.h' | sort)
[ -z "$stray_headers" ] ||
  fail "headers under src/ (they belong under include/idempotency/): $stray_headers"

while IFS=: read -r file _ line; do
  included=$(sed -n 's/^#include "\([^"]*\)".*/\1/p' <<<"$line")
  if [ -f "include/idempotency/$included" ]; then
    fail "$file includes \"$included\": project headers are included as \"idempotency/$included\""
    continue
  fi
  # Names outside idempotency/ are PostgreSQL's own headers;
  # idempotency/pg.hpp and idempotency/server_free.hpp are below every layer.
  case $included in idempotency/*/*) ;; *) continue ;; esac
  [ -f "include/$included" ] || fail "$file includes $included, which does not exist"
  from=$(folder_of "$file")
  to=$(cut -d/ -f2 <<<"$included")
  [ "$from" = "$to" ] && continue
  from_layer=$(layer_of "$from")
  to_layer=$(layer_of "$to")
  [ "$to_layer" -lt "$from_layer" ] ||
    fail "$file includes $included: $to/ is not below $from/"
done < <(grep -rn '^#include "' src include --include='*.cpp' --include='*.hpp')

# Differences between PostgreSQL majors live in idempotency/compat.hpp
# alone: no other file tests the server's version.
versioned=$(grep -rlE 'PG_VERSION_NUM|PG_MAJORVERSION_NUM' src include --include='*.cpp' --include='*.hpp' |
  grep -vxE 'include/idempotency/(compat|server_free)\.hpp' || true)
[ -z "$versioned" ] ||
  fail "PG_VERSION_NUM outside include/idempotency/compat.hpp: $versioned"

declared=$(sed -n 's/^IDEMPOTENCY_SQL_FUNCTION(\([a-z_0-9]*\),.*/\1/p' src/entry/functions.cpp | sort)
named=$(sed -n "s/.*'MODULE_PATHNAME', *'\([a-z_0-9]*\)'.*/\1/p" idempotency--*.sql | sort -u)
[ -n "$declared" ] || fail "src/entry/functions.cpp declares no SQL function"
for symbol in $named; do
  grep -qx "$symbol" <<<"$declared" ||
    fail "$symbol, named by an install script, is not declared in src/entry/functions.cpp"
done
elsewhere=$(grep -rln '^IDEMPOTENCY_SQL_FUNCTION(' src | grep -v '^src/entry/functions.cpp$' || true)
[ -z "$elsewhere" ] ||
  fail "IDEMPOTENCY_SQL_FUNCTION outside src/entry/functions.cpp: $elsewhere"

if [ "$failures" -ne 0 ]; then
  echo "layers: $failures failed"
  exit 1
fi
echo "layers: ok"
