#include "idempotency/storage/secrets.hpp"

#include "idempotency/compat.hpp"
#include "idempotency/storage/key_store.hpp"

extern "C" {
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "catalog/pg_type.h"
#include "common/file_perm.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "storage/fd.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
}

namespace idempotency::storage {

namespace {

// In the data directory, every backend's working directory: not in shared
// memory, since idempotent_call works without shared_preload_libraries, nor
// in a table or setting, which SQL would reach.
constexpr const char *secret_file = "idempotency_claim_secret";

bool read_secret(ClaimSecret *secret) {
  int fd = OpenTransientFile(secret_file, O_RDONLY | PG_BINARY);
  if (fd < 0) {
    if (errno == ENOENT)
      return false;
    ereport(ERROR, (errcode_for_file_access(),
                    errmsg("could not open file \"%s\": %m", secret_file)));
  }
  // One byte more than a secret, to notice a file that is too long.
  uint8 buffer[secret_bytes + 1];
  ssize_t got = read(fd, buffer, sizeof buffer);
  // The transaction's abort closes the file.
  if (got < 0)
    ereport(ERROR, (errcode_for_file_access(),
                    errmsg("could not read file \"%s\": %m", secret_file)));
  CloseTransientFile(fd);
  if (got != (ssize_t)secret_bytes)
    ereport(ERROR,
            (errcode(ERRCODE_DATA_CORRUPTED),
             errmsg("file \"%s\" holds %zd bytes, not the %zu of a claim "
                    "secret",
                    secret_file, got, secret_bytes),
             errhint("Stop the server, remove the file, and start the server "
                     "again: a new secret is made on first use.")));
  memcpy(secret->bytes, buffer, secret_bytes);
  explicit_bzero(buffer, sizeof buffer);
  return true;
}

[[noreturn]] void no_secret(const char *detail) {
  ereport(ERROR,
          (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
           errmsg("this database has no derived-key secret"),
           errdetail("%s", detail),
           errhint("A superuser can make one: INSERT INTO "
                   "idempotency.derived_key_secret SELECT "
                   "pg_catalog.sha256(pg_catalog.uuid_send(pg_catalog.gen_"
                   "random_uuid()) || pg_catalog.uuid_send(pg_catalog.gen_"
                   "random_uuid()) || pg_catalog.uuid_send(pg_catalog.gen_"
                   "random_uuid())). It changes every derived key: restore "
                   "the old secret instead if it can be found.")));
}

} // namespace

// Made on first use in a file of this backend's own, synced and linked to
// the final name: link() never replaces a name, so of racing backends the
// first wins and no reader sees a partly written file.
ClaimSecret read_claim_secret() {
  ClaimSecret secret;
  if (read_secret(&secret))
    return secret;
  char temporary[MAXPGPATH];
  snprintf(temporary, sizeof temporary, "%s.%d.tmp", secret_file, MyProcPid);
  // Left over by a backend of the same pid that failed halfway.
  unlink(temporary);
  if (!pg_strong_random(secret.bytes, secret_bytes))
    ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR),
                    errmsg("could not generate a random claim secret")));
  int fd = OpenTransientFilePerm(
      temporary, O_WRONLY | O_CREAT | O_EXCL | PG_BINARY, pg_file_create_mode);
  if (fd < 0)
    ereport(ERROR, (errcode_for_file_access(),
                    errmsg("could not create file \"%s\": %m", temporary)));
  errno = 0;
  bool written =
      write(fd, secret.bytes, secret_bytes) == (ssize_t)secret_bytes &&
      pg_fsync(fd) == 0;
  // A short write sets no errno: the disk is full.
  int write_errno = errno != 0 ? errno : ENOSPC;
  CloseTransientFile(fd);
  if (written && link(temporary, secret_file) != 0 && errno != EEXIST) {
    written = false;
    write_errno = errno;
  }
  unlink(temporary);
  if (!written) {
    errno = write_errno;
    ereport(ERROR, (errcode_for_file_access(),
                    errmsg("could not write file \"%s\": %m", secret_file)));
  }
  if (!read_secret(&secret))
    ereport(ERROR, (errcode_for_file_access(),
                    errmsg("could not open file \"%s\": %m", secret_file)));
  return secret;
}

// Read on every call (nothing can go stale) by a table scan, which checks no
// rights, in the statement's snapshot: a rotation is seen from the next
// statement on, and never by half.
DerivedKeySecret read_derived_key_secret() {
  Oid relid = schema::relation("derived_key_secret");
  if (!OidIsValid(relid))
    no_secret("Table idempotency.derived_key_secret does not exist.");
  Relation rel = table_open(relid, AccessShareLock);
  Form_pg_attribute column = find_column(RelationGetDescr(rel), "secret");
  if (column == nullptr || column->atttypid != BYTEAOID)
    no_secret("Table idempotency.derived_key_secret has no column secret of "
              "type bytea.");
  Snapshot snapshot =
      ActiveSnapshotSet() ? GetActiveSnapshot() : GetTransactionSnapshot();
  // The table is heap unless default_table_access_method said otherwise.
  TupleTableSlot *slot = table_slot_create(rel, nullptr);
  TableScanDesc scan =
      compat::table_beginscan(rel, snapshot, 0, nullptr, compat::SO_NONE);
  DerivedKeySecret secret{};
  int rows = 0;
  bool size_ok = false;
  while (table_scan_getnextslot(scan, ForwardScanDirection, slot)) {
    rows++;
    bool is_null;
    Datum value = slot_getattr(slot, column->attnum, &is_null);
    size_ok = false;
    if (is_null)
      continue;
    bytea *bytes = DatumGetByteaPP(value);
    if (VARSIZE_ANY_EXHDR(bytes) == secret_bytes) {
      memcpy(secret.bytes, VARDATA_ANY(bytes), secret_bytes);
      size_ok = true;
    }
    if (reinterpret_cast<Pointer>(bytes) != DatumGetPointer(value)) {
      explicit_bzero(VARDATA_ANY(bytes), VARSIZE_ANY_EXHDR(bytes));
      pfree(bytes);
    }
  }
  table_endscan(scan);
  ExecDropSingleTupleTableSlot(slot);
  table_close(rel, AccessShareLock);
  if (rows == 0)
    no_secret("Table idempotency.derived_key_secret holds no row.");
  if (rows > 1) {
    explicit_bzero(secret.bytes, sizeof secret.bytes);
    no_secret("Table idempotency.derived_key_secret holds more than one row.");
  }
  if (!size_ok)
    no_secret("The secret in idempotency.derived_key_secret is not 32 bytes "
              "long.");
  return secret;
}

} // namespace idempotency::storage
