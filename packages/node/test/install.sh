#!/usr/bin/env bash
# Installs idempotency-pg the two ways an application does, into a new
# application each, without network: the documented way, `npm pack` into
# the application's vendor/ and `npm install ./vendor/<tarball>` (whose
# package.json and lock then hold a path inside the application, so
# `npm ci` works in any copy of it), and `npm install <directory>`. Each application then requires it
# (CommonJS), imports it (ESM) and type-checks a TypeScript file against its
# declarations, with TypeScript from the package's devDependencies.
#
#   test/install.sh <package directory with node_modules> <scratch directory>
set -euo pipefail

package=$(cd "$1" && pwd)
scratch=$2
mkdir -p "$scratch"
tsc=$package/node_modules/.bin/tsc
passed=0

check_app() { # directory how
  local app=$1 how=$2
  (cd "$app" && node -e "
    const m = require('idempotency-pg');
    if (typeof m.idempotent !== 'function' || typeof m.withIdempotency !== 'function') process.exit(1);
    console.log('require: ok');")
  (cd "$app" && node --input-type=module -e "
    import idempotencyPg, { idempotent, claim, SealedError } from 'idempotency-pg';
    if (typeof idempotent !== 'function' || idempotencyPg.claim !== claim || !(new SealedError('x') instanceof Error))
      process.exit(1);
    console.log('import: ok');")
  cat >"$app/check.cts" <<'TS'
import { idempotent, withIdempotency, claim, scopedKey, SHARED_KEYS, type IdempotentOptions, type PoolLike, SealedError,
  DEFAULT_PROBLEM_BASE, keyRef, type IdempotencyEvent } from 'idempotency-pg';
declare const pool: PoolLike;
const options: IdempotentOptions = { pool, scope: (req) => req.user.id, waitTimeout: '2s', storeValidationErrors: true, replayHeaders: ['Location'] };
const shared: IdempotentOptions = { pool, scope: SHARED_KEYS };
const databaseKey: string = scopedKey('alice', 'k');
void shared; void databaseKey;
const later: IdempotentOptions = {
  pool: (req) => req.app.locals.pool, scope: SHARED_KEYS, ttl: '15 minutes', problemBase: DEFAULT_PROBLEM_BASE,
  onEvent: (event: IdempotencyEvent) => { const hash: string | undefined = event.keyRef; void hash; void keyRef('k'); },
};
const inMilliseconds: IdempotentOptions = { pool: async () => pool, scope: SHARED_KEYS, ttl: 60000 };
void later; void inMilliseconds;
const route = idempotent(options, async (req, res) => {
  const { rows } = await req.db.query('SELECT 1');
  const key: string | undefined = req.idempotency.key;
  const scope: string | null = req.idempotency.scope;
  void scope;
  void rows; void key;
  res.statusCode = 201;
  res.end('{}');
});
async function consumer(): Promise<number> {
  const { replayed, response } = await withIdempotency(pool, { key: 'k', requestHash: 'h' }, async () => 42);
  const claimed = await claim(await pool.connect(), 'k', null, { waitTimeout: 100 });
  return replayed || claimed.replayed || new SealedError('x') instanceof Error ? response : 0;
}
void route; void consumer;
TS
  cat >"$app/check.mts" <<'TS'
import idempotencyPg, { idempotent, type StoredResponse } from 'idempotency-pg';
const stored: StoredResponse = { status: 201, headers: { Location: '/x' }, body: 'AA==', body_encoding: 'base64' };
const same: typeof idempotent = idempotencyPg.idempotent;
void stored; void same;
TS
  (cd "$app" && "$tsc" --noEmit --strict --module node16 --moduleResolution node16 --target es2022 check.cts check.mts)
  echo "types: ok"
  # A wrong option must not type-check: the declarations are checked, not ignored.
  printf "import { idempotent } from 'idempotency-pg';\nidempotent({ pool: 1 }, () => {});\n" >"$app/wrong.cts"
  printf "import { idempotent, PoolLike } from 'idempotency-pg';\ndeclare const pool: PoolLike;\nidempotent({ pool, scope: () => 'a' }, (req) => req.db.query(1));\n" >"$app/wrong2.cts"
  # A route without a scope does not type-check either.
  printf "import { idempotent, PoolLike } from 'idempotency-pg';\ndeclare const pool: PoolLike;\nidempotent({ pool }, () => {});\n" >"$app/wrong3.cts"
  # Nor a TTL that is neither milliseconds nor an interval's text.
  printf "import { idempotent, PoolLike, SHARED_KEYS } from 'idempotency-pg';\ndeclare const pool: PoolLike;\nidempotent({ pool, scope: SHARED_KEYS, ttl: true }, () => {});\n" >"$app/wrong4.cts"
  for wrong in wrong.cts wrong2.cts wrong3.cts wrong4.cts; do
    if (cd "$app" && "$tsc" --noEmit --strict --module node16 --moduleResolution node16 "$wrong" >/dev/null); then
      echo "$wrong type-checked ($how): the declarations are not checked" >&2
      exit 1
    fi
  done
  passed=$((passed + 1))
  echo "installed from $how: ok"
}

new_app() { # directory
  mkdir -p "$1"
  (cd "$1" && npm init -y >/dev/null)
}

new_app "$scratch/from-tarball"
mkdir "$scratch/from-tarball/vendor"
tarball=$(cd "$scratch/from-tarball" && npm pack --silent --pack-destination vendor "$package")
test -f "$scratch/from-tarball/vendor/$tarball"
listing=$(tar -tzf "$scratch/from-tarball/vendor/$tarball")
for file in package/lib/index.js package/lib/index.mjs package/index.d.ts package/index.d.mts package/README.md \
  package/CHANGELOG.md; do
  grep -qx "$file" <<<"$listing" || { echo "$tarball lacks $file" >&2; exit 1; }
done
if grep -q '^package/test/' <<<"$listing"; then
  echo "$tarball ships the tests" >&2
  exit 1
fi
(cd "$scratch/from-tarball" && npm install --offline --no-audit --no-fund --loglevel=error "./vendor/$tarball")
dependency=$(cd "$scratch/from-tarball" && node -p "require('./package.json').dependencies['idempotency-pg']")
if [ "$dependency" != "file:vendor/$tarball" ]; then
  echo "package.json holds $dependency, not the application's file:vendor/$tarball" >&2
  exit 1
fi
check_app "$scratch/from-tarball" "the npm pack tarball"
# The application, moved elsewhere without node_modules, installs from its
# own files.
mkdir "$scratch/moved"
(cd "$scratch/from-tarball" && tar --exclude=node_modules -cf - .) | (cd "$scratch/moved" && tar -xf -)
(cd "$scratch/moved" && npm ci --offline --no-audit --no-fund --loglevel=error)
(cd "$scratch/moved" && node -e "require('idempotency-pg').idempotent || process.exit(1)")
passed=$((passed + 1))
echo "npm ci of the application moved elsewhere: ok"

new_app "$scratch/from-directory"
(cd "$scratch/from-directory" && npm install --offline --no-audit --no-fund --loglevel=error "$package")
check_app "$scratch/from-directory" "the directory"
echo "install: $passed passed"
