-- Included (\i) at the top of every regress file, so that each file runs
-- alone (make installcheck-regress REGRESS=name) or after any other: the
-- extension, and sqlstate_of(). Running it again changes nothing.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
-- Reports an error as its SQLSTATE and message, to pin both.
CREATE OR REPLACE FUNCTION public.sqlstate_of(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE sql;
  RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
