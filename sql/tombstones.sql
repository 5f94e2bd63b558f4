-- Tombstones: when a key's response expires, the key is remembered for
-- idempotency.remember; a retry of the same request then gets IK410 (it
-- already ran, its response is no longer kept), another request with the
-- key IK422, and after the window the key is absent and runs as new. The
-- decision goes by the row's times, whether or not expiry has yet turned
-- the row into a tombstone.
\i sql/include/setup.sql
SELECT idempotency.expire() AS expired_before \gset
-- The keys earlier files left go too: one whose short TTL ran out while
-- this file runs would add to the counts of expire() below.
DELETE FROM idempotency.keys;
CREATE SCHEMA tombstones;
SET search_path = tombstones, public;

-- fn's result is the run number: a second run of one request shows as a
-- new number.
CREATE SEQUENCE runs;
GRANT USAGE ON SCHEMA tombstones TO PUBLIC;
GRANT USAGE ON SEQUENCE runs TO PUBLIC;
CREATE FUNCTION call(key text, fn text DEFAULT 'SELECT nextval(''tombstones.runs'')')
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  RETURN idempotency.idempotent_call(key, NULL, fn)::text;
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' ||
    regexp_replace(SQLERRM, '\d{4}-\d\d-\d\d [0-9:.+-]+', '<time>', 'g');
END $$;
CREATE FUNCTION decline() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
  PERFORM nextval('tombstones.runs');
  RAISE EXCEPTION 'declined';
END $$;
-- The error of a statement, its times masked.
CREATE FUNCTION error_of(sql text) RETURNS text LANGUAGE sql AS $$
  SELECT regexp_replace(public.sqlstate_of(sql), '\d{4}-\d\d-\d\d [0-9:.+-]+',
                        '<time>', 'g')
$$;
-- The response of the key expired a second ago (the row is still live).
CREATE FUNCTION expire_response(aged text) RETURNS void LANGUAGE sql AS $$
  UPDATE idempotency.keys
     SET created_at = now() - interval '1 hour', expires_at = now() - interval '1 second'
   WHERE key = aged AND expired_at IS NULL
$$;
-- A tombstone whose window ended a second ago.
CREATE FUNCTION end_window(digest bytea) RETURNS void LANGUAGE sql AS $$
  UPDATE idempotency.keys SET expires_at = now() - interval '1 second'
   WHERE key_digest = digest AND expired_at IS NOT NULL
$$;
CREATE FUNCTION row_of(digest bytea)
RETURNS TABLE (key text, has_response boolean, tombstone boolean, since_run interval,
               window_ interval)
LANGUAGE sql AS $$
  SELECT key, response IS NOT NULL, expired_at IS NOT NULL,
         expired_at - created_at, expires_at - expired_at
    FROM idempotency.keys WHERE key_digest = digest
$$;

-- The setting: a span, 0 for off, at most a year, superuser only.
SHOW idempotency.remember;
SET idempotency.remember = '0';
SHOW idempotency.remember;
SET idempotency.remember = '365 days';
SET idempotency.remember = '12 months';
SET idempotency.remember = '366 days';
SET idempotency.remember = '13 months';
SET idempotency.remember = '-1 day';
SET idempotency.remember = '1 day -1 hour';
SET idempotency.remember = 'soon';
RESET idempotency.remember;
CREATE ROLE tombstone_alice;
CREATE ROLE tombstone_bob;
SET ROLE tombstone_alice;
SET idempotency.remember = 0;
RESET ROLE;
SHOW idempotency.remember;

-- A live key replays.
SELECT call('pay-1');
SELECT call('pay-1');
-- Its response expired, the row not yet touched by expiry: the same request
-- is refused (IK410), never run; another request is IK422.
SELECT expire_response('pay-1');
SELECT state, expires_at - created_at AS remembered_for, response
  FROM idempotency.lookup('pay-1');
SELECT call('pay-1');
SELECT call('pay-1', 'SELECT 2');
SELECT last_value AS runs_so_far FROM runs;

-- Expiry turns it into a tombstone: no key text, no response, when the
-- response expired; forgotten idempotency.remember later.
SELECT idempotency.expire() AS expired;
SELECT * FROM row_of(idempotency.key_digest('pay-1'));
SELECT call('pay-1');
SELECT call('pay-1', 'SELECT 2');
SELECT state, response FROM idempotency.lookup('pay-1');
SELECT (SELECT expires_at FROM idempotency.lookup('pay-1')) =
       (SELECT expires_at FROM idempotency.keys
         WHERE key_digest = idempotency.key_digest('pay-1')) AS forgotten_at_matches;
-- A second expiry round leaves a tombstone within its window alone.
SELECT idempotency.expire() AS expired;
SELECT count(*) AS tombstones FROM idempotency.keys
 WHERE key_digest = idempotency.key_digest('pay-1') AND expired_at IS NOT NULL;

-- Past the window the key is absent: the same request runs as new, and its
-- new row is live.
SELECT end_window(idempotency.key_digest('pay-1'));
SELECT state FROM idempotency.lookup('pay-1');
SELECT call('pay-1');
SELECT key, has_response, tombstone FROM row_of(idempotency.key_digest('pay-1'));
SELECT call('pay-1');

-- A live row past its whole window (expiry never came by) is absent too.
SELECT call('late-1');
UPDATE idempotency.keys SET created_at = now() - interval '9 days',
       expires_at = now() - interval '8 days' WHERE key = 'late-1';
SELECT state FROM idempotency.lookup('late-1');
SELECT call('late-1');
-- And expiry deletes such a row without a tombstone.
SELECT call('late-2');
UPDATE idempotency.keys SET created_at = now() - interval '9 days',
       expires_at = now() - interval '8 days' WHERE key = 'late-2';
SELECT idempotency.expire() AS expired;
SELECT count(*) AS rows_left FROM idempotency.keys
 WHERE key_digest = idempotency.key_digest('late-2');

-- The window is fixed when the key is claimed, with its TTL, as exact time
-- (remember_for): the setting of whoever judges the key later plays no part.
SET idempotency.remember = '1 hour';
SELECT call('short-1');
SET idempotency.remember = '3 hours';
SELECT call('long-1');
SET idempotency.remember = '1 day';
SELECT key, remember_for FROM idempotency.keys
 WHERE key IN ('short-1', 'long-1') ORDER BY key;
UPDATE idempotency.keys SET created_at = now() - interval '3 hours',
       expires_at = now() - interval '2 hours' WHERE key IN ('short-1', 'long-1');
SELECT state FROM idempotency.lookup('short-1');
SELECT state FROM idempotency.lookup('long-1');
SET idempotency.remember = '1 hour';
SELECT state FROM idempotency.lookup('long-1');
SELECT call('long-1');
-- Expiry ends the window where the caller does, whatever its own setting:
-- the long key's tombstone goes an hour from now, the short key goes now.
SET idempotency.remember = 0;
SELECT idempotency.expire() > 0 AS expired;
SET idempotency.remember = '1 day';
SELECT expires_at - expired_at AS tombstone_window, remember_for
  FROM idempotency.keys WHERE key_digest = idempotency.key_digest('long-1');
SELECT count(*) AS short_rows_left FROM idempotency.keys
 WHERE key_digest = idempotency.key_digest('short-1');
SELECT call('long-1');
SELECT call('short-1') ~ '^\d+$' AS short_runs_as_new;
RESET idempotency.remember;
-- A live row without remember_for (loaded with triggers disabled) is
-- remembered for 7 days past its TTL, by callers and expiry alike.
SELECT call('no-window-1');
UPDATE idempotency.keys SET remember_for = NULL, created_at = now() - interval '3 days',
       expires_at = now() - interval '2 days' WHERE key = 'no-window-1';
SET idempotency.remember = 0;
SELECT call('no-window-1');
SELECT idempotency.expire() > 0 AS expired;
SELECT expires_at - expired_at AS tombstone_window
  FROM idempotency.keys WHERE key_digest = idempotency.key_digest('no-window-1');
RESET idempotency.remember;

-- remember = 0: no tombstones; a retry past the TTL runs again, and expiry
-- deletes the row.
SET idempotency.remember = 0;
SELECT call('off-1');
SELECT expire_response('off-1');
SELECT state FROM idempotency.lookup('off-1');
SELECT call('off-1');
SELECT expire_response('off-1');
SELECT idempotency.expire() AS expired;
SELECT count(*) AS rows_left FROM idempotency.keys
 WHERE key_digest = idempotency.key_digest('off-1');
RESET idempotency.remember;

-- forget() deletes a tombstone (true); the key is then absent and runs.
SELECT call('forget-1');
SELECT expire_response('forget-1');
SELECT idempotency.expire() AS expired;
SELECT idempotency.forget('forget-1') AS forgotten;
SELECT idempotency.forget('forget-1') AS forgotten_again;
SELECT state FROM idempotency.lookup('forget-1');
SELECT call('forget-1');

-- claim() follows: the same request_hash is IK410, another IK422, both
-- with nothing claimed.
BEGIN;
SELECT replayed FROM idempotency.claim('order-1', 'hash-a');
SELECT idempotency.complete('order-1', '{"id": 1}');
COMMIT;
SELECT expire_response('order-1');
SELECT error_of($$SELECT idempotency.claim('order-1', 'hash-a')$$);
SELECT error_of($$SELECT idempotency.claim('order-1', 'hash-b')$$);
SELECT idempotency.expire() AS expired;
SELECT error_of($$SELECT idempotency.claim('order-1', 'hash-a')$$);
SELECT error_of($$SELECT idempotency.claim('order-1', 'hash-b')$$);
SELECT error_of($$SELECT idempotency.complete('order-1', '{}')$$);
-- claim_batch answers a tombstone's key as claim() does, without failing
-- the batch's other keys: IK410 for its request, IK422 for another.
BEGIN;
SELECT ordinality, key, outcome, sqlstate
  FROM idempotency.claim_batch(ARRAY['order-1', 'batch-new', 'order-1'],
                               ARRAY['hash-a', 'hash-n', 'hash-b']);
ROLLBACK;

-- A stored error's key is remembered the same way.
SET idempotency.store_errors = 'P0001';
SELECT call('error-1', 'SELECT tombstones.decline()');
SELECT call('error-1', 'SELECT tombstones.decline()');
SELECT expire_response('error-1');
SELECT idempotency.expire() AS expired;
SELECT call('error-1', 'SELECT tombstones.decline()');
RESET idempotency.store_errors;

-- Roles: one role's tombstone is not another's key; it cannot see it.
SET ROLE tombstone_alice;
SELECT call('shared');
RESET ROLE;
SELECT expire_response('shared');
SELECT idempotency.expire() AS expired;
SET ROLE tombstone_bob;
SELECT state FROM idempotency.lookup('shared');
SELECT count(*) AS rows_bob_sees FROM idempotency.keys;
SELECT call('shared') ~ '^\d+$' AS bob_runs;
SELECT idempotency.forget('shared') AS bob_forgets_his_own;
SET ROLE tombstone_alice;
SELECT state FROM idempotency.lookup('shared');
SELECT count(*) AS rows_alice_sees FROM idempotency.keys WHERE expired_at IS NOT NULL;
SELECT call('shared');
RESET ROLE;

-- A tombstone loaded as a dump loads it (COPY or INSERT through the
-- keys_loaded trigger) keeps its digest: it has no key text to compute one
-- from, and stays a tombstone.
INSERT INTO idempotency.keys (scope, key, request_hash, response, created_at,
                              expires_at, key_digest, expired_at)
SELECT 'tombstone_alice'::idempotency.role_scope, '', request_hash, NULL, now() - interval '2 days',
       now() + interval '5 days', idempotency.key_digest('loaded-1'),
       now() - interval '1 day'
  FROM idempotency.keys WHERE key_digest = idempotency.key_digest('shared')
   AND scope OPERATOR(idempotency.=) 'tombstone_alice'::idempotency.role_scope;
SET ROLE tombstone_alice;
SELECT state FROM idempotency.lookup('loaded-1');
SELECT call('loaded-1');
SELECT call('loaded-1', 'SELECT 2');
RESET ROLE;

-- DROP OWNED deletes the roles' keys, tombstones with them.
DROP OWNED BY tombstone_alice, tombstone_bob;
SELECT count(*) AS keys_left FROM idempotency.keys
 WHERE key_digest IN (idempotency.key_digest('shared'), idempotency.key_digest('loaded-1'));
DROP ROLE tombstone_alice;
DROP ROLE tombstone_bob;

-- Statistics: an IK410 answer is a late retry; tombstones are counted apart
-- from live keys, and the oldest live key's age ignores them.
SELECT idempotency.expire() AS settled \gset
SELECT keys AS live_before, tombstones AS tombstones_before
  FROM idempotency.stats WHERE datname = current_database() \gset
SELECT keys AS own_live_before, tombstones AS own_tombstones_before
  FROM idempotency.key_usage WHERE role = current_user::regrole \gset
SELECT idempotency.stats_reset();
SELECT call('stats-1');
SELECT keys - :live_before AS new_live_keys FROM idempotency.stats
 WHERE datname = current_database();
SELECT expire_response('stats-1');
SELECT idempotency.expire() AS expired;
UPDATE idempotency.keys SET created_at = now() - interval '30 days'
 WHERE key_digest = idempotency.key_digest('stats-1');
SELECT call('stats-1');
SELECT call('stats-1');
SELECT call('stats-1', 'SELECT 2');
SELECT calls_ran, replays, conflicts, mismatches, late_retries, keys_expired,
       keys - :live_before AS new_live_keys,
       tombstones - :tombstones_before AS new_tombstones,
       oldest_key_age < interval '1 day' AS oldest_is_live
  FROM idempotency.stats WHERE datname = current_database();
SELECT keys - :own_live_before AS new_live_keys,
       tombstones - :own_tombstones_before AS new_tombstones
  FROM idempotency.key_usage WHERE role = current_user::regrole;
SELECT idempotency.forget('stats-1');
DROP SCHEMA tombstones CASCADE;
