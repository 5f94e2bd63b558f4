#!/usr/bin/env bash
# Builds idempotency-pg's wheel and sdist with build-dist, as the README
# says, and installs each into a new virtual environment of Debian's
# /usr/bin/python3 (--system-site-packages, so Debian's Django and psycopg
# are found), without an index. Checks that building leaves the package's
# directory as it was, and that each environment imports the package at
# the version of pyproject.toml.
#
#   tests/install.sh <package directory> <scratch directory>
set -euo pipefail

package=$(cd "$1" && pwd)
scratch=$2
mkdir -p "$scratch"
python=/usr/bin/python3
passed=0
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$package/pyproject.toml")

# A copy of the package directory stands for a checkout; the build must
# leave it as it was (no build/, no egg-info, no dist/, nothing touched).
tree=$scratch/checkout
cp -R "$package" "$tree"
touch "$scratch/before-build"
sleep 1
listing_before=$(cd "$tree" && find . | sort)
"$tree/build-dist" "$scratch/dist" | tee "$scratch/built"
listing_after=$(cd "$tree" && find . | sort)
if [ "$listing_before" != "$listing_after" ] || [ -n "$(find "$tree" -newer "$scratch/before-build")" ]; then
  echo "build-dist changed the package directory:" >&2
  diff <(echo "$listing_before") <(echo "$listing_after") >&2 || true
  find "$tree" -newer "$scratch/before-build" >&2
  exit 1
fi
wheel=$scratch/dist/idempotency_pg-$version-py3-none-any.whl
sdist=$(ls "$scratch"/dist/idempotency[-_]pg-"$version".tar.gz)
test -f "$wheel" && test -f "$sdist"
wheel_listing=$("$python" -m zipfile -l "$wheel")
for file in idempotency_pg/__init__.py idempotency_pg/django.py idempotency_pg/scope.py idempotency_pg/starlette.py \
  idempotency_pg/aio.py; do
  grep -q "^$file " <<<"$wheel_listing" || { echo "the wheel lacks $file" >&2; exit 1; }
done
sdist_listing=$(tar -tzf "$sdist")
grep -q '/CHANGELOG.md$' <<<"$sdist_listing" || { echo "the sdist lacks CHANGELOG.md" >&2; exit 1; }
if grep -q '/tests/' <<<"$sdist_listing"; then
  echo "the sdist ships the tests" >&2
  exit 1
fi
passed=$((passed + 1))
echo "built the wheel and the sdist, the package directory untouched: ok"

check_env() { # venv how
  (cd "$scratch" && "$1/bin/python" - "$version" <<'PY'
import sys

import idempotency_pg
import idempotency_pg.django  # Debian's Django, seen through --system-site-packages
import idempotency_pg.starlette  # Debian's Starlette
from importlib.metadata import version

assert idempotency_pg.__version__ == sys.argv[1] == version("idempotency-pg"), idempotency_pg.__version__
assert idempotency_pg.__file__.startswith(sys.prefix), idempotency_pg.__file__
assert idempotency_pg.scoped_key("alice", "k").startswith("\u00a7")
print("import: ok")
PY
  )
  passed=$((passed + 1))
  echo "installed from $2: ok"
}

"$python" -m venv --system-site-packages "$scratch/from-wheel"
"$scratch/from-wheel/bin/pip" install --quiet --no-index "$wheel"
check_env "$scratch/from-wheel" "the wheel"

"$python" -m venv --system-site-packages "$scratch/from-sdist"
"$scratch/from-sdist/bin/pip" install --quiet --no-index --no-build-isolation "$sdist"
check_env "$scratch/from-sdist" "the sdist"
echo "install: $passed passed"
