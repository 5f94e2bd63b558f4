// Every SQL-callable function of the library, in the order the versions'
// scripts created them; the symbols that only schemas before 0.7 name refuse,
// saying how to update (and keep pg_upgrade and restores of such schemas from
// failing on a missing symbol). Each is declared through the error boundary
// (boundary/boundary.hpp); its body lives in its module, declared in
// entry/functions.hpp (role_scope's I/O functions and the keys_loaded trigger
// in their module's header). A C symbol named in the install or update script
// and missing here fails CREATE EXTENSION ("could not find function").
#include "idempotency/boundary/boundary.hpp"
#include "idempotency/entry/functions.hpp"
#include "idempotency/protocol/loaded_rows.hpp"
#include "idempotency/storage/role_marks.hpp"

// clang-format off

// since 0.1

// idempotency.current_scope() RETURNS idempotency.role_scope
IDEMPOTENCY_SQL_FUNCTION(idempotency_current_scope, idempotency::entry::current_scope_body)
// idempotency.idempotent_call(key, request_hash, fn [, VARIADIC args "any"]) RETURNS jsonb
IDEMPOTENCY_SQL_FUNCTION(idempotency_idempotent_call, idempotency::entry::idempotent_call_body)
// idempotency.last_call_replayed() RETURNS boolean
IDEMPOTENCY_SQL_FUNCTION(idempotency_last_call_replayed, idempotency::entry::last_call_replayed_body)
// idempotency.expire() RETURNS bigint
IDEMPOTENCY_SQL_FUNCTION(idempotency_expire, idempotency::entry::expire_body)
// idempotency.expiry_status() RETURNS SETOF record
IDEMPOTENCY_SQL_FUNCTION(idempotency_expiry_status, idempotency::entry::expiry_status_body)

// since 0.2

// idempotency.stats_counters() RETURNS SETOF record
IDEMPOTENCY_SQL_FUNCTION(idempotency_stats_counters, idempotency::entry::stats_counters_body)
// idempotency.stats_reset() RETURNS void
IDEMPOTENCY_SQL_FUNCTION(idempotency_stats_reset, idempotency::entry::stats_reset_body)

// since 0.3

// the I/O functions of type idempotency.role_scope
IDEMPOTENCY_SQL_FUNCTION(idempotency_role_scope_in, idempotency::storage::role_scope_in)
IDEMPOTENCY_SQL_FUNCTION(idempotency_role_scope_out, idempotency::storage::role_scope_out)
IDEMPOTENCY_SQL_FUNCTION(idempotency_role_scope_recv, idempotency::storage::role_scope_recv)
IDEMPOTENCY_SQL_FUNCTION(idempotency_role_scope_send, idempotency::storage::role_scope_send)
// idempotency.claim(key, request_hash) RETURNS TABLE (replayed, response, created_at, expires_at)
IDEMPOTENCY_SQL_FUNCTION(idempotency_claim, idempotency::entry::claim_body)
// idempotency.complete(key, response) RETURNS void
IDEMPOTENCY_SQL_FUNCTION(idempotency_complete, idempotency::entry::complete_body)
// idempotency.release(key) RETURNS void
IDEMPOTENCY_SQL_FUNCTION(idempotency_release, idempotency::entry::release_body)
// idempotency.last_call() RETURNS TABLE (outcome, created_at, expires_at)
IDEMPOTENCY_SQL_FUNCTION(idempotency_last_call, idempotency::entry::last_call_body)
// idempotency.lookup(key) RETURNS TABLE (state, created_at, expires_at, response)
IDEMPOTENCY_SQL_FUNCTION(idempotency_lookup, idempotency::entry::lookup_body)
// idempotency.forget(key) RETURNS boolean
IDEMPOTENCY_SQL_FUNCTION(idempotency_forget, idempotency::entry::forget_body)

// since 0.4

// idempotency.key_digest(key text) of 0.4 to 0.6: refuses, with how to update
IDEMPOTENCY_SQL_FUNCTION(idempotency_key_digest, idempotency::entry::schema_before_0_7_body)

// since 0.5
// idempotency.tenant_call(tenant, key, request_hash, fn [, VARIADIC args "any"]) RETURNS jsonb
IDEMPOTENCY_SQL_FUNCTION(idempotency_tenant_call, idempotency::entry::tenant_call_body)
// idempotency.tenant_claim(tenant, key, request_hash) RETURNS TABLE (replayed, response, created_at, expires_at)
IDEMPOTENCY_SQL_FUNCTION(idempotency_tenant_claim, idempotency::entry::tenant_claim_body)
// idempotency.tenant_complete(tenant, key, response) RETURNS void
IDEMPOTENCY_SQL_FUNCTION(idempotency_tenant_complete, idempotency::entry::tenant_complete_body)
// idempotency.tenant_release(tenant, key) RETURNS void
IDEMPOTENCY_SQL_FUNCTION(idempotency_tenant_release, idempotency::entry::tenant_release_body)
// idempotency.tenant_lookup(tenant, key) RETURNS TABLE (state, created_at, expires_at, response)
IDEMPOTENCY_SQL_FUNCTION(idempotency_tenant_lookup, idempotency::entry::tenant_lookup_body)
// idempotency.tenant_forget(tenant, key) RETURNS boolean
IDEMPOTENCY_SQL_FUNCTION(idempotency_tenant_forget, idempotency::entry::tenant_forget_body)

// since 0.6

// idempotency.keys_loaded() of 0.6: refuses, with how to update
IDEMPOTENCY_SQL_FUNCTION(idempotency_keys_loaded, idempotency::entry::schema_before_0_7_body)

// since 0.7

// idempotency.key_digest(key text) RETURNS bytea, ordered
IDEMPOTENCY_SQL_FUNCTION(idempotency_ordered_key_digest, idempotency::entry::key_digest_body)
// idempotency.keys_loaded() RETURNS trigger, ordered digests
IDEMPOTENCY_SQL_FUNCTION(idempotency_ordered_keys_loaded, idempotency::protocol::keys_loaded_body)
// idempotency.mark_key_roles() RETURNS bigint
IDEMPOTENCY_SQL_FUNCTION(idempotency_mark_key_roles, idempotency::entry::mark_key_roles_body)
// idempotency.drop_owned_keys() RETURNS event_trigger
IDEMPOTENCY_SQL_FUNCTION(idempotency_drop_owned_keys, idempotency::entry::drop_owned_keys_body)

// idempotency--0.7--1.0.sql

// idempotency.keep_role_marks() RETURNS event_trigger
IDEMPOTENCY_SQL_FUNCTION(idempotency_keep_role_marks, idempotency::entry::keep_role_marks_body)
// idempotency.derived_key(key text, label text) RETURNS text
IDEMPOTENCY_SQL_FUNCTION(idempotency_derived_key, idempotency::entry::derived_key_body)
// idempotency.claim_batch(keys text[], request_hashes text[]) RETURNS TABLE (ordinality, key, outcome, sqlstate, message, response, created_at, expires_at)
IDEMPOTENCY_SQL_FUNCTION(idempotency_claim_batch, idempotency::entry::claim_batch_body)
// idempotency.complete_batch(keys text[], responses jsonb[]) RETURNS void
IDEMPOTENCY_SQL_FUNCTION(idempotency_complete_batch, idempotency::entry::complete_batch_body)

// clang-format on
