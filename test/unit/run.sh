#!/usr/bin/env bash
# Configure, build and run the unit tests (see CMakeLists.txt) into
# build/unit at the repository root. Works from any working directory.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build_dir="$repo_root/build/unit"
jobs="$(nproc 2>/dev/null || echo 2)"

# In CI (CI=true) a warning fails the build, as the Makefile's WERROR=1.
werror=OFF
[ -n "${CI:-}" ] && werror=ON
cmake -S "$repo_root" -B "$build_dir" -DIDEMPOTENCY_WERROR="$werror"
cmake --build "$build_dir" -j "$jobs"
# --no-tests=error: a build that registered no test fails instead of passing.
ctest --test-dir "$build_dir" --output-on-failure --no-tests=error -j "$jobs"
