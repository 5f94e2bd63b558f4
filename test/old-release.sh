#!/usr/bin/env bash
# Usage: test/old-release.sh VERSION
#
# Builds the library of an earlier release of the extension from the
# repository's own history and prints the path of a private copy of the
# PostgreSQL under test (the one of $PG_CONFIG, or of pg_config on PATH)
# with that release installed in place of the current one: its bin/ runs a
# server that loads the old library (PostgreSQL finds lib/ and share/
# relative to bin/, so a copied tree works). The cross-version TAP tests
# start old clusters with it (install_path).
#
# The release of VERSION is the last commit of the first-parent history of
# HEAD whose idempotency.control has default_version VERSION (the parent of
# the commit that moved it on). The repository is $IDEMPOTENCY_GIT_DIR, or
# the one this script is in; a shallow clone or a history without the
# release fails, never skips. Builds are kept under
# $IDEMPOTENCY_OLD_RELEASES (default /tmp/idempotency-old-releases-UID), keyed
# by the commit, the PostgreSQL installation and the other extensions'
# libraries in it, so later runs reuse them.
set -euo pipefail

version=${1:?usage: test/old-release.sh VERSION}
fail() {
  echo "test/old-release.sh: $*" >&2
  exit 1
}

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
git_dir=${IDEMPOTENCY_GIT_DIR:-}
if [ -z "$git_dir" ]; then
  [ -e "$src/.git" ] ||
    fail "no git history here ($src has no .git): the cross-version tests build release $version from the repository's history; set IDEMPOTENCY_GIT_DIR to a clone's git directory (test/run-all sets it from its own checkout's .git)"
  # Only this directory's own repository is read: git's ownership check
  # would refuse a clone of another user (the test user runs this).
  git_dir=$(git -c safe.directory="$src" -C "$src" rev-parse --absolute-git-dir)
fi
# An explicit git directory, which git reads whoever owns it.
export GIT_DIR=$git_dir
git rev-parse -q --verify HEAD >/dev/null || fail "$git_dir is not a git repository with a HEAD"
[ "$(git rev-parse --is-shallow-repository)" = false ] ||
  fail "$git_dir is a shallow clone: release $version must be built from its commit; fetch the whole history (git fetch --unshallow)"

control_version() { # commit
  git show "$1:idempotency.control" 2>/dev/null | sed -n "s/^default_version = '\(.*\)'$/\1/p"
}
commit=
for c in $(git log --first-parent --format=%H HEAD -- idempotency.control); do
  if [ "$(control_version "$c")" != "$version" ] && [ "$(control_version "$c^")" = "$version" ]; then
    commit=$(git rev-parse "$c^")
    break
  fi
done
[ -n "$commit" ] || fail "no commit of HEAD's history released version $version (none moved idempotency.control's default_version on from it)"

PG_CONFIG=${PG_CONFIG:-pg_config}
bindir=$("$PG_CONFIG" --bindir)
pkglibdir=$("$PG_CONFIG" --pkglibdir)
sharedir=$("$PG_CONFIG" --sharedir)
# The deepest directory holding the installation's bin, lib and share: the
# copy keeps their places relative to each other.
root=$bindir
while [ "${pkglibdir#"$root"/}" = "$pkglibdir" ] || [ "${sharedir#"$root"/}" = "$sharedir" ]; do
  [ "$root" != / ] || fail "$bindir, $pkglibdir and $sharedir share no directory"
  root=$(dirname "$root")
done
install_dir=$(dirname "$bindir")
[ "$(basename "$bindir")" = bin ] || fail "$bindir is not named bin: PostgreSQL::Test::Cluster cannot run it"

cache=${IDEMPOTENCY_OLD_RELEASES:-/tmp/idempotency-old-releases-$(id -u)}
# The libraries of other extensions (Citus) are in the key too: a copy made
# before one was installed would lack it.
others=$(cd "$pkglibdir" && find . -maxdepth 1 -name '*.so' ! -name 'idempotency*' | sort)
key=$version-$commit-$(printf '%s\n' "$("$PG_CONFIG" --version)" "$bindir" "$others" | sha1sum | cut -c1-12)
tree=$cache/$key
result=$tree${install_dir#"$root"}
if [ -f "$tree/.complete" ]; then
  echo "$result"
  exit 0
fi

mkdir -p "$cache"
exec 9>"$cache/$key.lock"
flock 9
if [ ! -f "$tree/.complete" ]; then
  rm -rf "$tree" "$tree.build"
  build=$tree.build
  mkdir -p "$build/src" "$build/stage" "$tree"
  git archive "$commit" | tar -x -C "$build/src"
  echo "building idempotency $version ($commit) for $("$PG_CONFIG" --version)" >&2
  make -C "$build/src" -s -j2 PG_CONFIG="$PG_CONFIG" >"$build/make.log" 2>&1 ||
    fail "building $version failed: $build/make.log"
  make -C "$build/src" -s install PG_CONFIG="$PG_CONFIG" DESTDIR="$build/stage" >>"$build/make.log" 2>&1 ||
    fail "installing $version failed: $build/make.log"
  for dir in "$install_dir" "$pkglibdir" "$sharedir"; do
    mkdir -p "$tree$(dirname "${dir#"$root"}")"
    [ -e "$tree${dir#"$root"}" ] || cp -a "$dir" "$tree${dir#"$root"}"
  done
  # The current release out, the old one in.
  rm -f "$tree${pkglibdir#"$root"}"/idempotency.so "$tree${sharedir#"$root"}"/extension/idempotency[.-]*
  cp "$build/stage$pkglibdir/idempotency.so" "$tree${pkglibdir#"$root"}/"
  cp "$build/stage$sharedir"/extension/idempotency[.-]* "$tree${sharedir#"$root"}/extension/"
  [ "$("$result/bin/pg_config" --pkglibdir)" = "$tree${pkglibdir#"$root"}" ] ||
    fail "the copy of $root in $tree does not find its own lib/"
  echo "$commit" >"$tree/.complete"
  rm -rf "$build"
fi
echo "$result"
