// Hashing (docs/architecture.md, "Hashing"): with OpenSSL 3, EVP with the
// algorithms fetched once per backend, so that OpenSSL's configuration (its
// FIPS provider) decides what runs; pg_cryptohash fetches at every
// initialisation, which costs more than hashing a key. Otherwise
// pg_cryptohash and pg_hmac. The unit tests build it with FRONTEND.
#include "idempotency/fingerprint/fingerprint.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "idempotency/compat.hpp"

#ifdef IDEMPOTENCY_HASH_WITH_EVP
#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#endif

extern "C" {
#ifndef IDEMPOTENCY_HASH_WITH_EVP
#include "common/cryptohash.h"
#include "common/hmac.h"
#endif
#include "common/sha2.h"
#include "port/pg_bswap.h"
#ifndef FRONTEND
#include "access/xact.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#endif
}

namespace idempotency::fingerprint {

static_assert(std::is_trivially_destructible_v<Sha256>);
static_assert(std::is_trivially_destructible_v<RequestFingerprint>);
static_assert(std::is_trivially_destructible_v<HmacSha256>);
static_assert(Sha256::digest_size == PG_SHA256_DIGEST_LENGTH);
static_assert(HmacSha256::block_size == PG_SHA256_BLOCK_LENGTH);

// Kept for the backend's life (creating one costs more than hashing a key);
// one an error left is taken back when its subtransaction or transaction ends.
constexpr int contexts_per_kind = 8;

// `level`: the transaction nesting level it was taken at.
template <typename Handle> struct Kept {
  bool open;
  int level;
  Handle handle;
};

#ifdef IDEMPOTENCY_HASH_WITH_EVP
struct Sha256Context : Kept<EVP_MD_CTX *> {};

// Keyed anew only for another key: keying costs less than copying a keyed
// context, and restarting with the same key less still.
struct HmacContext : Kept<EVP_MAC_CTX *> {
  std::size_t key_size; // no_key while it holds none
  std::uint8_t key[HmacSha256::block_size];
};
constexpr std::size_t no_key = HmacSha256::block_size + 1;

// The hashed prefix, copied to start each request's hash.
struct PrefixState {
  EVP_MD_CTX *evp;
#ifndef FRONTEND
  MemoryContextCallback freed_with_context;
#endif
};
#else
struct Sha256Context : Kept<pg_cryptohash_ctx *> {};
struct HmacContext : Kept<pg_hmac_ctx *> {};
#endif

namespace {

Sha256Context sha256_contexts[contexts_per_kind];
HmacContext hmac_contexts[contexts_per_kind];
// So that a transaction's end in a process that hashed nothing costs nothing.
bool taken_since_end = false;

[[noreturn]] void hashing_failed(const char *what, const char *reason) {
#ifdef FRONTEND
  fprintf(stderr, "could not compute %s: %s\n", what, reason);
  std::abort();
#else
  ereport(ERROR, (errcode(ERRCODE_SYSTEM_ERROR),
                  errmsg("could not compute %s: %s", what, reason)));
#endif
}

#ifndef FRONTEND
void take_back(int from_level) {
  if (!taken_since_end)
    return;
  auto give_back = [from_level](auto &contexts) {
    for (auto &context : contexts)
      if (context.level >= from_level)
        context.open = false;
  };
  give_back(sha256_contexts);
  give_back(hmac_contexts);
  if (from_level == 0)
    taken_since_end = false;
}
#endif

template <typename Context>
Context &take(Context (&contexts)[contexts_per_kind], const char *what) {
  taken_since_end = true;
  for (Context &context : contexts)
    if (!context.open) {
      context.open = true;
#ifdef FRONTEND
      context.level = 0;
#else
      context.level = GetCurrentTransactionNestLevel();
#endif
      return context;
    }
  hashing_failed(what, "too many hashes open at once");
}

#ifdef IDEMPOTENCY_HASH_WITH_EVP

[[noreturn]] void openssl_failed(const char *what) {
  unsigned long code = ERR_get_error();
  const char *reason = code == 0 ? nullptr : ERR_reason_error_string(code);
  ERR_clear_error();
  hashing_failed(what, reason != nullptr ? reason : "OpenSSL failure");
}

void require(bool done, const char *what) {
  if (!done)
    openssl_failed(what);
}

EVP_MD *sha256_algorithm() {
  static EVP_MD *algorithm = nullptr;
  if (algorithm == nullptr) {
    algorithm = EVP_MD_fetch(nullptr, "SHA2-256", nullptr);
    require(algorithm != nullptr, "SHA-256");
  }
  return algorithm;
}

Sha256Context *open_sha256(const PrefixState *from = nullptr) {
  EVP_MD *algorithm = sha256_algorithm();
  Sha256Context &context = take(sha256_contexts, "SHA-256");
  if (context.handle == nullptr) {
    context.handle = EVP_MD_CTX_new();
    require(context.handle != nullptr, "SHA-256");
  }
  require((from != nullptr
               ? EVP_MD_CTX_copy_ex(context.handle, from->evp)
               : EVP_DigestInit_ex2(context.handle, algorithm, nullptr)) == 1,
          "SHA-256");
  return &context;
}

HmacContext *open_hmac(const std::uint8_t *key, std::size_t key_size) {
  HmacContext &context = take(hmac_contexts, "HMAC-SHA256");
  if (context.handle != nullptr && context.key_size == key_size &&
      std::memcmp(context.key, key, key_size) == 0) {
    // A NULL key restarts with the key set before, even after an error.
    require(EVP_MAC_init(context.handle, nullptr, 0, nullptr) == 1,
            "HMAC-SHA256");
    return &context;
  }
  if (context.handle == nullptr) {
    static EVP_MAC *algorithm = nullptr;
    if (algorithm == nullptr) {
      algorithm = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
      require(algorithm != nullptr, "HMAC-SHA256");
    }
    EVP_MAC_CTX *evp = EVP_MAC_CTX_new(algorithm);
    require(evp != nullptr, "HMAC-SHA256");
    char digest[] = "SHA2-256";
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
        OSSL_PARAM_construct_end()};
    if (EVP_MAC_CTX_set_params(evp, params) != 1) {
      EVP_MAC_CTX_free(evp);
      openssl_failed("HMAC-SHA256");
    }
    context.handle = evp;
  }
  context.key_size = no_key;
  // A NULL key would mean "the key set before".
  require(EVP_MAC_init(context.handle, key, key_size, nullptr) == 1,
          "HMAC-SHA256");
  std::memcpy(context.key, key, key_size);
  context.key_size = key_size;
  return &context;
}

#ifndef FRONTEND
void free_prefix_state(void *state) {
  EVP_MD_CTX_free(static_cast<PrefixState *>(state)->evp);
}
#endif

#else // PostgreSQL's pg_cryptohash and pg_hmac

// Made in TopMemoryContext, for a resource owner no transaction releases.
template <typename Create> auto create_kept(Create create, const char *what) {
#ifdef FRONTEND
  auto *context = create(PG_SHA256);
#else
  static ResourceOwner kept_owner = nullptr;
  if (kept_owner == nullptr)
    kept_owner = ResourceOwnerCreate(nullptr, "idempotency hashing");
  // An error leaves both set; error recovery resets them.
  ResourceOwner owner = CurrentResourceOwner;
  MemoryContext memory = MemoryContextSwitchTo(TopMemoryContext);
  CurrentResourceOwner = kept_owner;
  auto *context = create(PG_SHA256);
  CurrentResourceOwner = owner;
  MemoryContextSwitchTo(memory);
#endif
  if (context == nullptr)
    hashing_failed(what, "out of memory");
  return context;
}

Sha256Context *open_sha256() {
  Sha256Context &context = take(sha256_contexts, "SHA-256");
  if (context.handle == nullptr)
    context.handle = create_kept(pg_cryptohash_create, "SHA-256");
  if (pg_cryptohash_init(context.handle) < 0)
    hashing_failed("SHA-256", pg_cryptohash_error(context.handle));
  return &context;
}

HmacContext *open_hmac(const std::uint8_t *key, std::size_t key_size) {
  HmacContext &context = take(hmac_contexts, "HMAC-SHA256");
  if (context.handle == nullptr)
    context.handle = create_kept(pg_hmac_create, "HMAC-SHA256");
  if (pg_hmac_init(context.handle, key, key_size) < 0)
    hashing_failed("HMAC-SHA256", pg_hmac_error(context.handle));
  return &context;
}

#endif

void finish_into(Sha256 &hash, std::uint8_t *out, std::size_t size) noexcept {
  std::uint8_t digest[Sha256::digest_size];
  hash.finish(digest);
  std::memcpy(out, digest, size);
}

void digest_into(const void *data, std::size_t length, std::uint8_t *out,
                 std::size_t kept) noexcept {
  Sha256 hash;
  hash.update(data, length);
  finish_into(hash, out, kept);
}

// 16 for any other character.
unsigned hex_digit(char c) noexcept {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return 16;
}

bool is_uuid7_text(const char *key, std::size_t key_size) noexcept {
  if (key_size != 36)
    return false;
  for (std::size_t i = 0; i < key_size; i++) {
    bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? key[i] != '-' : hex_digit(key[i]) > 15)
      return false;
  }
  // The version nibble, and the variant's two high bits (10).
  return key[14] == '7' && (hex_digit(key[19]) & 0xC) == 0x8;
}

// Empty, or holding a character other than hex digits and '-': a random
// UUID ends in 6 digits often enough (6% of UUIDv4 keys).
bool names_a_series(const char *prefix, std::size_t prefix_size) noexcept {
  if (prefix_size == 0)
    return true;
  for (std::size_t i = 0; i < prefix_size; i++)
    if (prefix[i] != '-' && hex_digit(prefix[i]) > 15)
      return true;
  return false;
}

} // namespace

void Sha256::update(const void *data, std::size_t size) noexcept {
  if (context_ == nullptr)
    context_ = open_sha256();
  // A zero-length update may come with a null pointer (an empty value).
  if (size == 0)
    return;
#ifdef IDEMPOTENCY_HASH_WITH_EVP
  require(EVP_DigestUpdate(context_->handle, data, size) == 1, "SHA-256");
#else
  if (pg_cryptohash_update(context_->handle, static_cast<const uint8 *>(data),
                           size) < 0)
    hashing_failed("SHA-256", pg_cryptohash_error(context_->handle));
#endif
}

void Sha256::finish(std::uint8_t (&digest)[digest_size]) noexcept {
  if (context_ == nullptr)
    context_ = open_sha256();
#ifdef IDEMPOTENCY_HASH_WITH_EVP
  require(EVP_DigestFinal_ex(context_->handle, digest, nullptr) == 1,
          "SHA-256");
#else
  if (pg_cryptohash_final(context_->handle, digest, digest_size) < 0)
    hashing_failed("SHA-256", pg_cryptohash_error(context_->handle));
#endif
  context_->open = false;
  context_ = nullptr;
}

// RFC 2104: a key longer than a block is replaced by its digest.
HmacSha256::HmacSha256(const void *key, std::size_t key_size) noexcept
    : key_{}, key_size_(0) {
  if (key_size > block_size) {
    digest_into(key, key_size, key_, Sha256::digest_size);
    key_size_ = Sha256::digest_size;
  } else if (key_size > 0) {
    std::memcpy(key_, key, key_size);
    key_size_ = key_size;
  }
}

void HmacSha256::update(const void *data, std::size_t size) noexcept {
  if (context_ == nullptr)
    context_ = open_hmac(key_, key_size_);
  if (size == 0)
    return;
#ifdef IDEMPOTENCY_HASH_WITH_EVP
  require(EVP_MAC_update(context_->handle,
                         static_cast<const unsigned char *>(data), size) == 1,
          "HMAC-SHA256");
#else
  if (pg_hmac_update(context_->handle, static_cast<const uint8 *>(data), size) <
      0)
    hashing_failed("HMAC-SHA256", pg_hmac_error(context_->handle));
#endif
}

void HmacSha256::finish(std::uint8_t (&mac)[mac_size]) noexcept {
  if (context_ == nullptr)
    context_ = open_hmac(key_, key_size_);
#ifdef IDEMPOTENCY_HASH_WITH_EVP
  std::size_t written = 0;
  require(EVP_MAC_final(context_->handle, mac, &written, mac_size) == 1,
          "HMAC-SHA256");
  if (written != mac_size)
    hashing_failed("HMAC-SHA256", "unexpected MAC size");
#else
  if (pg_hmac_final(context_->handle, mac, mac_size) < 0)
    hashing_failed("HMAC-SHA256", pg_hmac_error(context_->handle));
#endif
  context_->open = false;
  context_ = nullptr;
}

// `used` bytes of `capacity` follow. A copy owns its first prefix_size_
// bytes, and may append in place only where they end.
struct RequestFingerprint::Prefix {
  std::size_t used;
  std::size_t capacity;

  std::uint8_t *bytes() noexcept {
    return reinterpret_cast<std::uint8_t *>(this + 1);
  }
};

void RequestFingerprint::append_to_prefix(const void *data,
                                          std::size_t size) noexcept {
  prefix_state_ = nullptr;
  if (prefix_ == nullptr || prefix_->used != prefix_size_ ||
      prefix_->capacity - prefix_size_ < size) {
    std::size_t capacity =
        std::max<std::size_t>(2 * (prefix_size_ + size), 128);
    auto *copy = static_cast<Prefix *>(palloc(sizeof(Prefix) + capacity));
    copy->capacity = capacity;
    if (prefix_ != nullptr && prefix_size_ > 0)
      std::memcpy(copy->bytes(), prefix_->bytes(), prefix_size_);
    prefix_ = copy;
  }
  if (size > 0)
    std::memcpy(prefix_->bytes() + prefix_size_, data, size);
  prefix_size_ += size;
  prefix_->used = prefix_size_;
}

void RequestFingerprint::add_field(std::uint8_t tag, const void *data,
                                   std::size_t size) noexcept {
  // A fixed-width length never runs into the bytes after it.
  std::uint8_t header[1 + 8] = {tag};
  for (int i = 0; i < 8; ++i)
    header[1 + i] = static_cast<std::uint8_t>(std::uint64_t{size} >> (8 * i));
  if (!started_ &&
      (tag == tag_function || tag == tag_claim_api || tag == tag_type_name)) {
    append_to_prefix(header, sizeof header);
    append_to_prefix(data, size);
    return;
  }
  if (!started_)
    start();
  hash_.update(header, sizeof header);
  hash_.update(data, size);
}

void RequestFingerprint::keep_prefix_state() noexcept {
#ifdef IDEMPOTENCY_HASH_WITH_EVP
  if (started_)
    return;
  // Whatever may fail runs before the EVP context exists or once the memory
  // context owns it.
  EVP_MD *algorithm = sha256_algorithm();
  auto *state = static_cast<PrefixState *>(palloc(sizeof(PrefixState)));
  state->evp = EVP_MD_CTX_new();
  require(state->evp != nullptr, "SHA-256");
#ifndef FRONTEND
  state->freed_with_context.func = free_prefix_state;
  state->freed_with_context.arg = state;
  MemoryContextRegisterResetCallback(CurrentMemoryContext,
                                     &state->freed_with_context);
#endif
  require(
      EVP_DigestInit_ex2(state->evp, algorithm, nullptr) == 1 &&
          (prefix_size_ == 0 ||
           EVP_DigestUpdate(state->evp, prefix_->bytes(), prefix_size_) == 1),
      "SHA-256");
  prefix_state_ = state;
#endif
}

void RequestFingerprint::start() noexcept {
#ifdef IDEMPOTENCY_HASH_WITH_EVP
  if (prefix_state_ != nullptr) {
    hash_.context_ = open_sha256(prefix_state_);
    started_ = true;
    return;
  }
#endif
  hash_.update(prefix_ == nullptr ? nullptr : prefix_->bytes(), prefix_size_);
  started_ = true;
}

void RequestFingerprint::finish(Fingerprint &out) noexcept {
  if (!started_)
    start();
  hash_.finish(out);
}

void key_digest(const char *key, std::size_t key_size,
                std::uint8_t (&out)[key_digest_size]) noexcept {
  digest_into(key, key_size, out, key_digest_size);
}

void unconverted_key_digest(const char *key, std::size_t key_size,
                            std::uint8_t (&out)[key_digest_size]) noexcept {
  constexpr std::uint8_t not_utf8 = 0xFF;
  Sha256 hash;
  hash.update(&not_utf8, 1);
  hash.update(key, key_size);
  finish_into(hash, out, key_digest_size);
}

void ordered_key_digest(const char *key, std::size_t key_size,
                        OrderedKeyDigest &out) noexcept {
  constexpr std::size_t hash_bytes = 8;
  if (is_uuid7_text(key, key_size)) {
    // The 48-bit timestamp: 12 hex digits, a dash after the 8th.
    for (std::size_t i = 0; i < 6; i++) {
      std::size_t at = 2 * i < 8 ? 2 * i : 2 * i + 1;
      out.bytes[i] = static_cast<std::uint8_t>(hex_digit(key[at]) << 4 |
                                               hex_digit(key[at + 1]));
    }
    digest_into(key, key_size, out.bytes + 6, hash_bytes);
    out.size = 6 + hash_bytes;
    return;
  }
  std::size_t digits = 0;
  while (digits < key_size && key[key_size - 1 - digits] >= '0' &&
         key[key_size - 1 - digits] <= '9')
    digits++;
  std::size_t prefix_size = key_size - digits;
  // 18 digits: 10^18 - 1 fits in 63 bits.
  if (digits >= 6 && digits <= 18 && names_a_series(key, prefix_size)) {
    // The digit count keeps "order-0001234" and "order-001234" apart.
    std::uint8_t digit_count = static_cast<std::uint8_t>(digits);
    Sha256 prefix_hash;
    prefix_hash.update(key, prefix_size);
    prefix_hash.update(&digit_count, 1);
    finish_into(prefix_hash, out.bytes, hash_bytes);
    std::uint64_t number = 0;
    for (std::size_t i = prefix_size; i < key_size; i++)
      number = number * 10 + static_cast<std::uint64_t>(key[i] - '0');
    number = pg_hton64(number);
    std::memcpy(out.bytes + hash_bytes, &number, sizeof number);
    out.size = hash_bytes + 8;
    return;
  }
  digest_into(key, key_size, out.bytes, key_digest_size);
  out.size = key_digest_size;
}

#ifndef FRONTEND
void at_transaction_end() noexcept { take_back(0); }

void at_subtransaction_abort() noexcept {
  take_back(GetCurrentTransactionNestLevel());
}
#endif

} // namespace idempotency::fingerprint
