-- A hash that an error interrupts gives its hashing context back: when its
-- transaction ends, and when the subtransaction it was taken in aborts. A
-- backend keeps 8 contexts of each kind; each failed call below leaves one
-- behind until then, so without the give-back the ninth would fail with
-- "too many hashes open at once". A value that has no UTF-8 form (byte 0x81
-- of WIN1250) interrupts its request's hash: the value is hashed in UTF-8
-- (22P05), after the text before it.
\i sql/include/setup.sql
\set regress_database :DBNAME
CREATE DATABASE regress_interrupted_hash TEMPLATE template0 ENCODING 'WIN1250' LOCALE 'C';
\c regress_interrupted_hash
CREATE EXTENSION idempotency;
CREATE FUNCTION hash_of_unconvertible(key text) RETURNS void LANGUAGE sql AS $$
  SELECT idempotency.idempotent_call(key, NULL, 'SELECT $2', 'text first', convert_from('\x81', 'WIN1250'))
$$;
\set VERBOSITY terse

-- Each failure in a transaction of its own.
SELECT format('SELECT hash_of_unconvertible(%L)', 'alone-' || i) FROM generate_series(1, 10) i \gexec
SELECT idempotency.idempotent_call('after-transactions', NULL, 'SELECT $1', 'hashed');

-- In one transaction, each under a savepoint rolled back.
DO $$
BEGIN
  FOR i IN 1..10 LOOP
    BEGIN
      PERFORM hash_of_unconvertible('savepoint-' || i);
    EXCEPTION WHEN untranslatable_character THEN
      NULL;
    END;
  END LOOP;
  RAISE NOTICE 'after savepoints: %',
    idempotency.idempotent_call('after-savepoints', NULL, 'SELECT $1', 'hashed');
END $$;

\c :regress_database
DROP DATABASE regress_interrupted_hash;
