#include "storage/citus.hpp"

namespace idempotency::storage::citus {

namespace {

// --- Citus's transaction manager ---------------------------------------------
//
// Two functions Citus exports (transaction/transaction_management.c):
// InCoordinatedTransaction() says whether the transaction has opened
// transactions on other nodes, which Citus will finish from its callback at
// XACT_EVENT_PRE_COMMIT; Use2PCForCoordinatedTransaction() makes that
// callback PREPARE every remote transaction that wrote something before the
// local commit, and COMMIT PREPARED them after it, instead of committing
// them with a plain COMMIT before the local commit. Citus resets the flag
// when the transaction ends; on its own it sets it only for writes it
// executes (on more than one node, or on a shard of this node), never for
// a write to a table outside its metadata such as idempotency.keys.

using InCoordinatedTransaction = bool (*)();
using Use2PCForCoordinatedTransaction = void (*)();

struct TransactionManager {
  InCoordinatedTransaction in_coordinated_transaction;
  Use2PCForCoordinatedTransaction use_two_phase_commit;
};

enum class Presence { unknown, absent, present };

Presence presence = Presence::unknown;
TransactionManager manager{};

// Whether the current transaction wrote idempotency.keys.
bool wrote_keys = false;

// The entry of shared_preload_libraries that loaded Citus, or nullptr. Citus
// refuses to be loaded any other way, and shared_preload_libraries cannot
// change while the server runs, so this entry is what the server loaded.
char *citus_library_entry() {
  if (!process_shared_preload_libraries_done ||
      shared_preload_libraries_string == nullptr)
    return nullptr;
  // SplitDirectoriesString splits as the server did when it loaded them.
  char *list = pstrdup(shared_preload_libraries_string);
  List *entries = NIL;
  if (!SplitDirectoriesString(list, ',', &entries))
    return nullptr;
  ListCell *cell;
  foreach (cell, entries) {
    char *entry = static_cast<char *>(lfirst(cell));
    const char *separator = last_dir_separator(entry);
    const char *name = separator != nullptr ? separator + 1 : entry;
    size_t length = strlen(name);
    size_t suffix = strlen(DLSUFFIX);
    if (length > suffix && strcmp(name + length - suffix, DLSUFFIX) == 0)
      length -= suffix;
    if (length == strlen("citus") && strncmp(name, "citus", length) == 0)
      return entry;
  }
  return nullptr;
}

// Looks Citus's functions up once per backend. load_external_function
// finds the library among those already loaded (same name, same file), so
// it never loads Citus here - which, outside shared_preload_libraries,
// Citus would refuse with an error.
bool citus_loaded() {
  if (presence != Presence::unknown)
    return presence == Presence::present;
  char *entry = citus_library_entry();
  if (entry == nullptr) {
    presence = Presence::absent;
    return false;
  }
  TransactionManager found{};
  found.in_coordinated_transaction = reinterpret_cast<InCoordinatedTransaction>(
      load_external_function(entry, "InCoordinatedTransaction", true, nullptr));
  found.use_two_phase_commit =
      reinterpret_cast<Use2PCForCoordinatedTransaction>(load_external_function(
          entry, "Use2PCForCoordinatedTransaction", true, nullptr));
  manager = found;
  presence = Presence::present;
  return true;
}

void use_two_phase_commit_if_coordinated() {
  if (manager.in_coordinated_transaction())
    manager.use_two_phase_commit();
}

// Remote work may come after the key is written - claim() and complete()
// followed by an UPDATE of a distributed table, or deferred triggers - so
// the decision is made again when the transaction commits.
//
// Order at PRE_COMMIT: deferred triggers have fired by then (they fire
// before the callbacks), and this callback must run before Citus's own,
// which prepares or commits the remote transactions. PostgreSQL calls
// transaction callbacks newest first. Citus registers its callback in its
// _PG_init, in the postmaster: it can only be preloaded, and it refuses to
// load after another library has set ProcessUtility_hook, which this
// extension's _PG_init does, so Citus always comes first in
// shared_preload_libraries. This callback is registered later, in the
// backend, at the first write of a key - so it is newer and runs first.
void on_transaction_event(XactEvent event, void *) {
  switch (event) {
  case XACT_EVENT_PRE_COMMIT:
    if (wrote_keys)
      use_two_phase_commit_if_coordinated();
    break;
  case XACT_EVENT_COMMIT:
  case XACT_EVENT_ABORT:
  case XACT_EVENT_PREPARE:
  case XACT_EVENT_PARALLEL_COMMIT:
  case XACT_EVENT_PARALLEL_ABORT:
    wrote_keys = false;
    break;
  default:
    // PRE_PREPARE: Citus refuses PREPARE TRANSACTION in a coordinated
    // transaction itself.
    break;
  }
}

} // namespace

void note_key_write() {
  if (!citus_loaded())
    return;
  static bool registered = false;
  if (!registered) {
    RegisterXactCallback(on_transaction_event, nullptr);
    registered = true;
  }
  // A write in a subtransaction that rolls back keeps the flag: the
  // transaction then uses two-phase commit where one-phase would have done,
  // which costs time, never correctness.
  wrote_keys = true;
  // Asked now as well: the work done so far (fn, for idempotent_call) is
  // covered even if another callback were to run before this one.
  use_two_phase_commit_if_coordinated();
}

} // namespace idempotency::storage::citus
