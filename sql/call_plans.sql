-- fn's prepared plan is kept per backend; it must follow search_path,
-- DDL and the calling role like any cached plan.
\i sql/include/setup.sql
CREATE SCHEMA plan_a;
CREATE SCHEMA plan_b;
CREATE FUNCTION plan_a.which() RETURNS text LANGUAGE sql AS $$ SELECT 'a' $$;
CREATE FUNCTION plan_b.which() RETURNS text LANGUAGE sql AS $$ SELECT 'b' $$;
SET search_path = plan_a, public;
SELECT idempotency.idempotent_call('plan-1', NULL, 'SELECT which()');
SET search_path = plan_b, public;
SELECT idempotency.idempotent_call('plan-2', NULL, 'SELECT which()');
RESET search_path;

-- A table recreated with another column type.
CREATE TABLE plan_t (v int);
INSERT INTO plan_t VALUES (1);
SELECT idempotency.idempotent_call('plan-3', NULL, 'SELECT v FROM plan_t');
DROP TABLE plan_t;
CREATE TABLE plan_t (v text);
INSERT INTO plan_t VALUES ('one');
SELECT idempotency.idempotent_call('plan-4', NULL, 'SELECT v FROM plan_t');

-- A statement that failed to prepare is tried afresh next time.
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('plan-5', NULL, 'SELECT plan_later()')$$);
CREATE FUNCTION plan_later() RETURNS int LANGUAGE sql AS $$ SELECT 5 $$;
SELECT idempotency.idempotent_call('plan-5', NULL, 'SELECT plan_later()');

-- The same text with other argument types is another plan.
SELECT idempotency.idempotent_call('plan-6', NULL, 'SELECT pg_typeof($1)::text', 1);
SELECT idempotency.idempotent_call('plan-7', NULL, 'SELECT pg_typeof($1)::text', 'x'::text);

-- A plan made for one role is checked again for the next.
CREATE ROLE regress_planner;
SELECT idempotency.idempotent_call('plan-8', NULL, 'SELECT count(*) FROM plan_t');
SET SESSION AUTHORIZATION regress_planner;
SELECT sqlstate_of($$SELECT idempotency.idempotent_call('plan-9', NULL, 'SELECT count(*) FROM plan_t')$$);
RESET SESSION AUTHORIZATION;
DROP ROLE regress_planner;

DROP TABLE plan_t;
DROP FUNCTION plan_later();
DROP SCHEMA plan_a, plan_b CASCADE;
