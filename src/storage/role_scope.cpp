// The SQL type idempotency.role_scope: the role a key belongs to.
//
// Inside a cluster a scope is the role's OID (4 bytes, compared with the oid
// type's own functions), so renaming a role keeps its keys. Outside it - text
// and binary I/O, hence COPY, pg_dump and logical replication in either mode
// - a scope is the role's name, which the receiving node maps to its own role
// of that name: an OID means another role, or none, on a node whose roles
// were created in another order.
//
// The text form is a role name as an identifier (quoted where needed, as
// regrole writes it); the binary form is the same text. A role that no longer
// exists, or none, is written "-" and read back as no role (OID 0), which is
// never the scope of a caller: its keys stay out of every role's reach
// instead of passing, by OID, to whichever role holds that OID elsewhere.
// For the same reason a number is read as no role, never as the role with
// that OID: it is how regrole writes a role that no longer exists.
#include "idempotency/storage/role_scope.hpp"

#include "idempotency/compat.hpp"

extern "C" {
#include "libpq/pqformat.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/regproc.h"
}

namespace idempotency::storage {

namespace {

constexpr const char *no_role = "-";

// The role a scope's text names, on this node; 42704 if there is none.
// "-" and numbers name no role (OID 0).
// Role names are global, so no search_path is involved.
bool is_number(const char *scope_text) {
  if (*scope_text == '\0')
    return false;
  for (const char *c = scope_text; *c != '\0'; c++)
    if (*c < '0' || *c > '9')
      return false;
  return true;
}

Oid role_of_text(const char *scope_text) {
  if (strcmp(scope_text, no_role) == 0 || is_number(scope_text))
    return InvalidOid;
  List *names = compat::stringToQualifiedNameList(scope_text, nullptr);
  if (list_length(names) != 1)
    ereport(ERROR, (errcode(ERRCODE_INVALID_NAME),
                    errmsg("invalid role name \"%s\"", scope_text),
                    errdetail("A role scope is one role name, or \"-\".")));
  return get_role_oid(strVal(linitial(names)), false);
}

const char *text_of_role(Oid role) {
  const char *name = GetUserNameFromId(role, true);
  return name == nullptr ? no_role : quote_identifier(name);
}

} // namespace

Datum role_scope_in(FunctionCallInfo fcinfo) {
  return ObjectIdGetDatum(role_of_text(PG_GETARG_CSTRING(0)));
}

Datum role_scope_out(FunctionCallInfo fcinfo) {
  PG_RETURN_CSTRING(pstrdup(text_of_role(PG_GETARG_OID(0))));
}

Datum role_scope_recv(FunctionCallInfo fcinfo) {
  StringInfo message = reinterpret_cast<StringInfo>(PG_GETARG_POINTER(0));
  int text_bytes;
  char *scope_text =
      pq_getmsgtext(message, message->len - message->cursor, &text_bytes);
  return ObjectIdGetDatum(role_of_text(scope_text));
}

Datum role_scope_send(FunctionCallInfo fcinfo) {
  const char *scope_text = text_of_role(PG_GETARG_OID(0));
  StringInfoData message;
  pq_begintypsend(&message);
  pq_sendtext(&message, scope_text, strlen(scope_text));
  PG_RETURN_BYTEA_P(pq_endtypsend(&message));
}

} // namespace idempotency::storage
