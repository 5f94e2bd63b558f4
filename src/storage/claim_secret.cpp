#include "idempotency/storage/claim_secret.hpp"

extern "C" {
#include "access/transam.h"
#include "common/file_perm.h"
#include "miscadmin.h"
#include "storage/fd.h"
}

namespace idempotency::storage {

namespace {

// In the data directory, the working directory of every backend.
constexpr const char *secret_file = "idempotency_claim_secret";
constexpr std::size_t secret_bytes = claim_secret_bytes;
using Secret = ClaimSecret;

// Reads the secret file; false if it does not exist yet.
bool read_secret(Secret *secret) {
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
  int read_errno = errno;
  CloseTransientFile(fd);
  if (got < 0) {
    errno = read_errno;
    ereport(ERROR, (errcode_for_file_access(),
                    errmsg("could not read file \"%s\": %m", secret_file)));
  }
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

// Writes a new secret to a file of this backend's own and links it to the
// final name, unless another backend got there first.
void create_secret() {
  char temporary[MAXPGPATH];
  snprintf(temporary, sizeof temporary, "%s.%d.tmp", secret_file, MyProcPid);
  // Left over by a backend of the same pid that failed halfway.
  unlink(temporary);

  Secret secret;
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
}

} // namespace

ClaimSecret read_claim_secret() {
  Secret secret;
  if (!read_secret(&secret)) {
    create_secret();
    if (!read_secret(&secret))
      ereport(ERROR, (errcode_for_file_access(),
                      errmsg("could not open file \"%s\": %m", secret_file)));
  }
  return secret;
}

} // namespace idempotency::storage
