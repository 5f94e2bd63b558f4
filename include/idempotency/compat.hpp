// Every difference between the PostgreSQL majors built for (15, 17, 18, 19),
// the one place that tests PG_VERSION_NUM: each function has the newest
// server's name and arguments. A FRONTEND build (the unit tests' hashing)
// gets only the hashing part.
#pragma once

#ifdef FRONTEND
extern "C" {
#include "postgres_fe.h"
}
#else
#include "idempotency/pg.hpp"

extern "C" {
#include "access/genam.h"
#include "access/tableam.h"
#include "executor/executor.h"
#include "nodes/bitmapset.h"
#include "parser/analyze.h"
#include "parser/parse_relation.h"
#include "storage/proc.h"
#include "utils/backend_status.h"
#include "utils/wait_event.h"
#include "utils/guc.h"
#include "utils/regproc.h"
#include "utils/rel.h"
#include "utils/relcache.h"
}
#endif

#if PG_VERSION_NUM < 150000 || PG_VERSION_NUM >= 200000
#error "idempotency builds for PostgreSQL 15 to 19"
#endif

// How fingerprint/fingerprint hashes (docs/architecture.md, "Hashing"):
// OpenSSL's EVP where the server is built with OpenSSL 3.0 or later, the
// first with EVP_MD_fetch; else pg_cryptohash and pg_hmac, also when
// IDEMPOTENCY_HASH_WITH_PG_CRYPTOHASH is defined (the unit tests build both).
#if defined(USE_OPENSSL) && !defined(IDEMPOTENCY_HASH_WITH_PG_CRYPTOHASH)
#include <openssl/opensslv.h>
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
#define IDEMPOTENCY_HASH_WITH_EVP 1
#endif
#endif

#ifndef FRONTEND

#if PG_VERSION_NUM < 180000
struct IndexScanInstrumentation; // PostgreSQL 18's, never used before it
#endif

// From PostgreSQL 18 on the magic block names the library and its version.
#if PG_VERSION_NUM >= 180000
#define IDEMPOTENCY_MODULE_MAGIC(library_version)                              \
  PG_MODULE_MAGIC_EXT(.name = "idempotency", .version = library_version)
#else
#define IDEMPOTENCY_MODULE_MAGIC(library_version) PG_MODULE_MAGIC
#endif

namespace idempotency::compat {

// Named wait events came with PostgreSQL 17. Takes shared memory for a new
// name: call once per process.
inline uint32 wait_event(const char *name) {
#if PG_VERSION_NUM >= 170000
  return WaitEventExtensionNew(name);
#else
  (void)name;
  return PG_WAIT_EXTENSION;
#endif
}

// PostgreSQL 18 added the instrumentation, 19 the scan options.
#if PG_VERSION_NUM >= 190000
constexpr uint32 SO_NONE = ::SO_NONE;
#else
constexpr uint32 SO_NONE = 0;
#endif
inline IndexScanDesc index_beginscan(Relation heap, Relation index,
                                     Snapshot snapshot,
                                     IndexScanInstrumentation *instrument,
                                     int nkeys, int norderbys, uint32 flags) {
#if PG_VERSION_NUM >= 190000
  return ::index_beginscan(heap, index, snapshot, instrument, nkeys, norderbys,
                           flags);
#elif PG_VERSION_NUM >= 180000
  (void)flags;
  return ::index_beginscan(heap, index, snapshot, instrument, nkeys, norderbys);
#else
  (void)instrument;
  (void)flags;
  return ::index_beginscan(heap, index, snapshot, nkeys, norderbys);
#endif
}

// PostgreSQL 19 added the scan options.
inline TableScanDesc table_beginscan(Relation rel, Snapshot snapshot, int nkeys,
                                     ScanKeyData *key, uint32 flags) {
#if PG_VERSION_NUM >= 190000
  return ::table_beginscan(rel, snapshot, nkeys, key, flags);
#else
  (void)flags;
  return ::table_beginscan(rel, snapshot, nkeys, key);
#endif
}

// The cache a syscache callback is told about (PostgreSQL 19 typed it).
#if PG_VERSION_NUM >= 190000
using SysCacheIdentifier = ::SysCacheIdentifier;
#else
using SysCacheIdentifier = int;
#endif

// post_parse_analyze_hook's jumble (PostgreSQL 19 made it const).
#if PG_VERSION_NUM >= 190000
using JumbleStateArgument = const JumbleState *;
#else
using JumbleStateArgument = JumbleState *;
#endif

// The primary key's index (PostgreSQL 18 added deferrable_ok; the older
// ones never return a deferrable primary key's index either).
inline Oid RelationGetPrimaryKeyIndex(Relation relation, bool deferrable_ok) {
#if PG_VERSION_NUM >= 180000
  return ::RelationGetPrimaryKeyIndex(relation, deferrable_ok);
#else
  (void)deferrable_ok;
  return ::RelationGetPrimaryKeyIndex(relation);
#endif
}

// A qualified name's parts (PostgreSQL 16 added the soft-error context; the
// polyfill always raises its errors).
inline List *stringToQualifiedNameList(const char *string, Node *escontext) {
#if PG_VERSION_NUM >= 160000
  return ::stringToQualifiedNameList(string, escontext);
#else
  (void)escontext;
  return ::stringToQualifiedNameList(string);
#endif
}

// A GUC check hook's extra, freed with guc_free() from PostgreSQL 16 on,
// free() before (where guc_malloc is not exported).
inline void *guc_malloc(int elevel, size_t size) {
#if PG_VERSION_NUM >= 160000
  return ::guc_malloc(elevel, size);
#else
  void *data = malloc(size == 0 ? 1 : size);
  if (data == nullptr)
    ereport(elevel, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("out of memory")));
  return data;
#endif
}

// Index 1 to pgstat_fetch_stat_numbackends() (PostgreSQL 16's name).
inline LocalPgBackendStatus *pgstat_get_local_beentry_by_index(int index) {
#if PG_VERSION_NUM >= 160000
  return ::pgstat_get_local_beentry_by_index(index);
#else
  return ::pgstat_fetch_stat_local_beentry(index);
#endif
}

// PostgreSQL 17 moved the local transaction id into PGPROC.vxid.
inline LocalTransactionId my_local_transaction_id() {
#if PG_VERSION_NUM >= 170000
  return MyProc->vxid.lxid;
#else
  return MyProc->lxid;
#endif
}

// Private internals storage/keys.cpp uses, checked on 15, 17, 18 and 19,
// where each means the same; no statement does their job:
// - a dirty snapshot (InitDirtySnapshot, systable_beginscan) on the primary
//   key: only it sees a row an open transaction is writing or deleting, and
//   that transaction's id (SnapshotData.xmin, .xmax) to wait for; its rows
//   read entry by entry (index_getnext_tid, index_fetch_heap), to know when
//   an entry's row was gone;
// - a row's raw xmin (HeapTupleHeaderGetRawXmin), naming the row version a
//   DELETE later targets, and table_tuple_satisfies_snapshot, to raise 40001
//   under REPEATABLE READ as ON CONFLICT does;
// - an index-only read of keys_expires_at_idx (index_beginscan,
//   xs_want_itup, index_getnext_tid), so that expiry resumes after the last
//   entry read even among equal expires_at, which ORDER BY ... LIMIT cannot.
// The parser's private VarParamState (parser/parse_param.c), the same in 15
// to 19; entry/untyped_parameters.cpp checks the layout at load.
struct VariableParameters {
  Oid **types;
  int *count;
};

} // namespace idempotency::compat

#endif // FRONTEND
