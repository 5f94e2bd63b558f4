#include "protocol/plan_cache.hpp"

extern "C" {
#include "common/hashfn.h"
}

namespace idempotency::protocol {

namespace {

// Past this many distinct statements the cache starts afresh; applications
// have a handful of fn texts, so this only bounds a pathological caller.
constexpr long max_plans = 1024;

struct PlanEntry {
  uint64 hash; // the hash table key
  char *sql;
  int nargs;
  Oid *types;
  SPIPlanPtr plan;
};

HTAB *plans = nullptr;
MemoryContext plans_context = nullptr;

uint64 hash_of(const char *sql, size_t sql_size, const FnArgs &args) {
  uint64 hash =
      hash_bytes_extended(reinterpret_cast<const unsigned char *>(sql),
                          (int)sql_size, (uint64)args.count);
  return hash_bytes_extended(
      reinterpret_cast<const unsigned char *>(args.types),
      (int)(sizeof(Oid) * args.count), hash);
}

bool entry_matches(const PlanEntry &entry, const char *sql, size_t sql_size,
                   const FnArgs &args) {
  return entry.nargs == args.count && strlen(entry.sql) == sql_size &&
         memcmp(entry.sql, sql, sql_size) == 0 &&
         memcmp(entry.types, args.types, sizeof(Oid) * args.count) == 0;
}

void create_table() {
  plans_context = AllocSetContextCreate(
      TopMemoryContext, "idempotency fn plans", ALLOCSET_DEFAULT_SIZES);
  HASHCTL ctl;
  memset(&ctl, 0, sizeof(ctl));
  ctl.keysize = sizeof(uint64);
  ctl.entrysize = sizeof(PlanEntry);
  ctl.hcxt = plans_context;
  plans = hash_create("idempotency fn plans", 64, &ctl,
                      HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

void forget_all() {
  HASH_SEQ_STATUS status;
  hash_seq_init(&status, plans);
  PlanEntry *entry;
  while ((entry = static_cast<PlanEntry *>(hash_seq_search(&status))) !=
         nullptr)
    SPI_freeplan(entry->plan);
  MemoryContextDelete(plans_context);
  plans = nullptr;
}

SPIPlanPtr prepare_kept(const char *sql, const FnArgs &args) {
  SPIPlanPtr plan = SPI_prepare(sql, args.count, args.types);
  if (plan == nullptr)
    elog(ERROR, "SPI_prepare failed for fn: %s",
         SPI_result_code_string(SPI_result));
  if (list_length(SPI_plan_get_plan_sources(plan)) != 1)
    ereport(ERROR, (errcode(ERRCODE_SYNTAX_ERROR),
                    errmsg("fn must be exactly one SQL statement")));
  if (SPI_keepplan(plan) != 0)
    elog(ERROR, "SPI_keepplan failed for fn");
  return plan;
}

// Records a kept plan; an entry that merely shares the hash is replaced.
void remember(uint64 hash, const char *sql, size_t sql_size, const FnArgs &args,
              SPIPlanPtr plan) {
  if (hash_get_num_entries(plans) >= max_plans) {
    forget_all();
    create_table();
  }
  bool found;
  auto *entry =
      static_cast<PlanEntry *>(hash_search(plans, &hash, HASH_ENTER, &found));
  if (found) {
    SPI_freeplan(entry->plan);
    pfree(entry->sql);
    pfree(entry->types);
  }
  entry->sql =
      static_cast<char *>(MemoryContextAlloc(plans_context, sql_size + 1));
  memcpy(entry->sql, sql, sql_size);
  entry->sql[sql_size] = '\0';
  entry->nargs = args.count;
  entry->types = static_cast<Oid *>(
      MemoryContextAlloc(plans_context, sizeof(Oid) * Max(args.count, 1)));
  memcpy(entry->types, args.types, sizeof(Oid) * args.count);
  entry->plan = plan;
}

} // namespace

SPIPlanPtr fn_plan(text *fn, const FnArgs &args) {
  if (plans == nullptr)
    create_table();
  const char *sql = VARDATA_ANY(fn);
  size_t sql_size = VARSIZE_ANY_EXHDR(fn);
  uint64 hash = hash_of(sql, sql_size, args);

  auto *entry =
      static_cast<PlanEntry *>(hash_search(plans, &hash, HASH_FIND, nullptr));
  if (entry != nullptr && entry_matches(*entry, sql, sql_size, args))
    return entry->plan;

  SPIPlanPtr plan = prepare_kept(text_to_cstring(fn), args);
  remember(hash, sql, sql_size, args, plan);
  return plan;
}

} // namespace idempotency::protocol
