-- Hostile and odd keys: bytes that are not valid in the database encoding,
-- multibyte keys at the 255-byte limit, and keys that differ only in
-- whitespace, case or Unicode normalization. A key is compared byte for
-- byte (collation "C"), whatever the caller's collation.
\i sql/include/setup.sql
\set regress_database :DBNAME

-- In a UTF8 database a key is valid UTF-8 by the time it reaches the call:
-- the server rejects invalid bytes (22021) and NUL (54000) while building
-- the argument, so fn never runs and nothing is stored.
CREATE DATABASE regress_hostile_utf8 TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C';
\c regress_hostile_utf8
SET client_encoding = 'UTF8';
CREATE EXTENSION idempotency;
CREATE TABLE runs (label text);
CREATE FUNCTION run(label text) RETURNS text LANGUAGE sql
  AS $$ INSERT INTO runs VALUES (label) RETURNING 'ran ' || label $$;
CREATE FUNCTION sqlstate_of(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE sql;
  RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

SELECT sqlstate_of($$SELECT idempotency.idempotent_call(convert_from('\xff'::bytea, 'UTF8'), NULL, 'SELECT run($1)', 'ff')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call(convert_from('\x6bc3'::bytea, 'UTF8'), NULL, 'SELECT run($1)', 'truncated')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call(convert_from('\xeda080'::bytea, 'UTF8'), NULL, 'SELECT run($1)', 'surrogate')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call(E'k\xff', NULL, 'SELECT run($1)', 'escape')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('k' || chr(0), NULL, 'SELECT run($1)', 'nul')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call(U&'k\0000', NULL, 'SELECT run($1)', 'nul')$$);
SELECT count(*) AS stored FROM idempotency.keys;
SELECT count(*) AS runs FROM runs;
-- Bytes in another encoding are converted first: LATIN1 'caf\xe9' is the
-- key 'café'.
SELECT idempotency.idempotent_call(convert_from('\x636166e9'::bytea, 'LATIN1'), NULL, 'SELECT run($1)', 'latin1');
SELECT idempotency.idempotent_call('café', NULL, 'SELECT run($1)', 'latin1'), idempotency.last_call_replayed();

-- 255 bytes is the limit whatever the characters: 2-, 3- and 4-byte
-- characters that fill 255 bytes run; one byte more is 22023.
SELECT idempotency.idempotent_call(repeat('é', 127) || 'x', NULL, 'SELECT run($1)', '2-byte');
SELECT idempotency.idempotent_call(repeat('€', 85), NULL, 'SELECT run($1)', '3-byte');
SELECT idempotency.idempotent_call(repeat('😀', 63) || 'abc', NULL, 'SELECT run($1)', '4-byte');
SELECT sqlstate_of($$SELECT idempotency.idempotent_call(repeat('€', 85) || 'x', NULL, 'SELECT run($1)', '3-byte')$$);
SELECT sqlstate_of($$SELECT idempotency.idempotent_call(repeat('😀', 64), NULL, 'SELECT run($1)', '4-byte')$$);
SELECT octet_length(key) AS bytes, char_length(key) AS characters, response
  FROM idempotency.keys WHERE octet_length(key) > 100 ORDER BY characters;

-- Whitespace, case, invisible characters and Unicode normalization make
-- distinct keys: each runs fn once and is stored on its own.
CREATE TABLE variants (label text, key text);
INSERT INTO variants VALUES
  ('plain', 'key'), ('upper', 'KEY'), ('title', 'Key'),
  ('leading space', ' key'), ('trailing space', 'key '), ('tab', E'key\t'),
  ('newline', E'key\n'), ('no-break space', 'key' || U&'\00A0'),
  ('zero-width space', U&'k\200Bey'), ('byte order mark', U&'\FEFFkey'),
  ('NFC é', U&'\00E9'), ('NFD é', U&'e\0301'), ('fullwidth', U&'\FF4B\FF45\FF59');
SELECT label, idempotency.idempotent_call(key, NULL, 'SELECT run($1)', label) AS response,
       idempotency.last_call_replayed() AS replayed
  FROM variants ORDER BY label;
SELECT count(*) AS stored, count(DISTINCT key) AS distinct_keys
  FROM idempotency.keys WHERE key IN (SELECT key FROM variants);
-- Each variant replays only its own response.
SELECT label, idempotency.idempotent_call(key, NULL, 'SELECT run($1)', label) AS response,
       idempotency.last_call_replayed() AS replayed
  FROM variants ORDER BY label;
-- A case-insensitive collation on the argument does not merge keys.
CREATE COLLATION case_insensitive (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
SELECT 'key' = 'KEY' COLLATE case_insensitive AS equal_under_the_collation;
SELECT idempotency.idempotent_call('KEY' COLLATE case_insensitive, NULL, 'SELECT run($1)', 'upper') AS response,
       idempotency.last_call_replayed() AS replayed;
SELECT idempotency.idempotent_call('kEy' COLLATE case_insensitive, NULL, 'SELECT run($1)', 'plain') AS response,
       idempotency.last_call_replayed() AS replayed;
-- 'plain' ran twice: once for 'key', once for 'kEy'.
SELECT label, count(*) AS runs FROM runs GROUP BY label ORDER BY label;

-- In a SQL_ASCII database any byte but NUL can be part of a key: the key is
-- its bytes. 0xff and 0xfe are two keys; 255 such bytes are allowed, 256 not.
CREATE DATABASE regress_hostile_sql_ascii TEMPLATE template0 ENCODING 'SQL_ASCII' LOCALE 'C';
\c regress_hostile_sql_ascii
CREATE EXTENSION idempotency;
CREATE FUNCTION sqlstate_of(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE sql;
  RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE;
END $$;
SELECT idempotency.idempotent_call(convert_from('\xff'::bytea, 'SQL_ASCII'), NULL, 'SELECT ''ff''');
SELECT idempotency.idempotent_call(convert_from('\xfe'::bytea, 'SQL_ASCII'), NULL, 'SELECT ''fe''');
SELECT idempotency.idempotent_call(convert_from('\xff'::bytea, 'SQL_ASCII'), NULL, 'SELECT ''ff'''),
       idempotency.last_call_replayed();
SELECT sqlstate_of($$SELECT idempotency.idempotent_call(convert_from('\xff'::bytea, 'SQL_ASCII'), NULL, 'SELECT ''other''')$$);
SELECT idempotency.idempotent_call(convert_from(decode(repeat('c3', 255), 'hex'), 'SQL_ASCII'), NULL, 'SELECT 255');
SELECT sqlstate_of($$SELECT idempotency.idempotent_call(convert_from(decode(repeat('c3', 256), 'hex'), 'SQL_ASCII'), NULL, 'SELECT 256')$$);
SELECT octet_length(key) AS bytes, encode(convert_to(substr(key, 1, 2), 'SQL_ASCII'), 'hex') AS first_bytes, response
  FROM idempotency.keys ORDER BY bytes, first_bytes;

\c :regress_database
DROP DATABASE regress_hostile_sql_ascii;
DROP DATABASE regress_hostile_utf8;
