// SHA-256 written from FIPS 180-4, HMAC-SHA256 over it (RFC 2104), and the
// framed request encoding fed to SHA-256.
//
// No PostgreSQL header: this unit is linked into the unit tests as well as
// the extension. Nothing here allocates or throws.
#include "idempotency/fingerprint/fingerprint.hpp"

#include <cstring>
#include <type_traits>

#include "idempotency/server_free.hpp" // must be the last include

namespace idempotency::fingerprint {

// PostgreSQL code may hold these across an ereport() longjmp, which runs no
// destructors; that is only safe if there is nothing to destroy.
static_assert(std::is_trivially_destructible_v<Sha256>);
static_assert(std::is_trivially_destructible_v<RequestFingerprint>);
static_assert(std::is_trivially_destructible_v<HmacSha256>);

namespace {

constexpr std::size_t block_size = 64;

// FIPS 180-4 section 4.2.2: first 32 bits of the fractional parts of the
// cube roots of the first 64 primes.
constexpr std::uint32_t round_constants[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
    0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
    0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
    0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
    0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

// FIPS 180-4 section 5.3.3: first 32 bits of the fractional parts of the
// square roots of the first 8 primes.
constexpr std::uint32_t initial_state[8] = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

constexpr std::uint32_t rotr(std::uint32_t x, unsigned n) noexcept {
  return (x >> n) | (x << (32 - n));
}

// The six logical functions of FIPS 180-4 section 4.1.2.
constexpr std::uint32_t ch(std::uint32_t x, std::uint32_t y,
                           std::uint32_t z) noexcept {
  return (x & y) ^ (~x & z);
}
constexpr std::uint32_t maj(std::uint32_t x, std::uint32_t y,
                            std::uint32_t z) noexcept {
  return (x & y) ^ (x & z) ^ (y & z);
}
constexpr std::uint32_t big_sigma0(std::uint32_t x) noexcept {
  return rotr(x, 2) ^ rotr(x, 13) ^ rotr(x, 22);
}
constexpr std::uint32_t big_sigma1(std::uint32_t x) noexcept {
  return rotr(x, 6) ^ rotr(x, 11) ^ rotr(x, 25);
}
constexpr std::uint32_t small_sigma0(std::uint32_t x) noexcept {
  return rotr(x, 7) ^ rotr(x, 18) ^ (x >> 3);
}
constexpr std::uint32_t small_sigma1(std::uint32_t x) noexcept {
  return rotr(x, 17) ^ rotr(x, 19) ^ (x >> 10);
}

// SHA-256 reads and writes words big-endian whatever the host order is;
// assembling bytes by shifting keeps that portable.
std::uint32_t load_be32(const std::uint8_t *p) noexcept {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) |
         (std::uint32_t{p[2]} << 8) | std::uint32_t{p[3]};
}

void store_be32(std::uint32_t v, std::uint8_t *p) noexcept {
  for (int i = 3; i >= 0; --i) {
    p[i] = static_cast<std::uint8_t>(v);
    v >>= 8;
  }
}

void store_be64(std::uint64_t v, std::uint8_t *p) noexcept {
  for (int i = 7; i >= 0; --i) {
    p[i] = static_cast<std::uint8_t>(v);
    v >>= 8;
  }
}

// Frame lengths are little-endian (a choice of this encoding, not of
// SHA-256); fixed width so a length can never run into the bytes after it.
void store_le64(std::uint64_t v, std::uint8_t *p) noexcept {
  for (int i = 0; i < 8; ++i) {
    p[i] = static_cast<std::uint8_t>(v);
    v >>= 8;
  }
}

} // namespace

Sha256::Sha256() noexcept : state_{}, total_bytes_(0), buffer_{}, buffered_(0) {
  std::memcpy(state_, initial_state, sizeof state_);
}

// FIPS 180-4 section 6.2.2: one 512-bit block into the running state.
void Sha256::compress(const std::uint8_t *block) noexcept {
  std::uint32_t w[64];
  for (int t = 0; t < 16; ++t)
    w[t] = load_be32(block + 4 * t);
  for (int t = 16; t < 64; ++t)
    w[t] =
        small_sigma1(w[t - 2]) + w[t - 7] + small_sigma0(w[t - 15]) + w[t - 16];

  std::uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
  std::uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
  for (int t = 0; t < 64; ++t) {
    const std::uint32_t t1 =
        h + big_sigma1(e) + ch(e, f, g) + round_constants[t] + w[t];
    const std::uint32_t t2 = big_sigma0(a) + maj(a, b, c);
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state_[0] += a;
  state_[1] += b;
  state_[2] += c;
  state_[3] += d;
  state_[4] += e;
  state_[5] += f;
  state_[6] += g;
  state_[7] += h;
}

void Sha256::update(const void *data, std::size_t size) noexcept {
  // A zero-length update may come with a null pointer (an empty value).
  if (size == 0)
    return;
  auto *in = static_cast<const std::uint8_t *>(data);
  total_bytes_ += size;

  // Top up a partially filled block first.
  if (buffered_ > 0) {
    const std::size_t take =
        size < block_size - buffered_ ? size : block_size - buffered_;
    std::memcpy(buffer_ + buffered_, in, take);
    buffered_ += take;
    in += take;
    size -= take;
    if (buffered_ < block_size)
      return;
    compress(buffer_);
    buffered_ = 0;
  }

  // Whole blocks straight from the input, without copying.
  for (; size >= block_size; in += block_size, size -= block_size)
    compress(in);

  if (size > 0) {
    std::memcpy(buffer_, in, size);
    buffered_ = size;
  }
}

// FIPS 180-4 section 5.1.1: append a 1 bit, zeros up to 56 mod 64 bytes,
// then the message length in bits as a big-endian 64-bit integer.
void Sha256::finish(std::uint8_t (&digest)[digest_size]) noexcept {
  const std::uint64_t bit_length = total_bytes_ * 8;

  buffer_[buffered_++] = 0x80;
  // No room for the length in this block: pad it out and start another.
  if (buffered_ > block_size - 8) {
    std::memset(buffer_ + buffered_, 0, block_size - buffered_);
    compress(buffer_);
    buffered_ = 0;
  }
  std::memset(buffer_ + buffered_, 0, block_size - 8 - buffered_);
  store_be64(bit_length, buffer_ + block_size - 8);
  compress(buffer_);
  buffered_ = 0;

  for (int i = 0; i < 8; ++i)
    store_be32(state_[i], digest + 4 * i);
}

// RFC 2104: H((K ^ opad) || H((K ^ ipad) || message)), where K is the key
// zero-padded to one block, or its digest when it is longer than a block.
HmacSha256::HmacSha256(const void *key, std::size_t key_size) noexcept {
  std::uint8_t padded[block_size] = {};
  if (key_size > block_size) {
    Sha256 long_key;
    long_key.update(key, key_size);
    std::uint8_t digest[Sha256::digest_size];
    long_key.finish(digest);
    std::memcpy(padded, digest, sizeof digest);
  } else if (key_size > 0) {
    std::memcpy(padded, key, key_size);
  }
  std::uint8_t pad[block_size];
  for (std::size_t i = 0; i < block_size; ++i)
    pad[i] = padded[i] ^ 0x36;
  inner_.update(pad, block_size);
  for (std::size_t i = 0; i < block_size; ++i)
    pad[i] = padded[i] ^ 0x5c;
  outer_.update(pad, block_size);
}

void HmacSha256::update(const void *data, std::size_t size) noexcept {
  inner_.update(data, size);
}

void HmacSha256::finish(std::uint8_t (&mac)[mac_size]) noexcept {
  std::uint8_t inner_digest[Sha256::digest_size];
  inner_.finish(inner_digest);
  outer_.update(inner_digest, sizeof inner_digest);
  outer_.finish(mac);
}

namespace {

// One tag per kind of field; distinct tags keep a NULL from ever encoding
// like a value, a type name like a value, and fn like either.
constexpr std::uint8_t tag_function = 0x01;
constexpr std::uint8_t tag_null_value = 0x03;
constexpr std::uint8_t tag_type_name = 0x04;
constexpr std::uint8_t tag_value = 0x05;
constexpr std::uint8_t tag_client_hash = 0x06;
constexpr std::uint8_t tag_claim_api = 0x07;

constexpr std::size_t frame_header_size = 1 + 8;

void write_frame_header(std::uint8_t tag, std::uint64_t size,
                        std::uint8_t (&out)[frame_header_size]) noexcept {
  out[0] = tag;
  store_le64(size, out + 1);
}

} // namespace

RequestFingerprint::RequestFingerprint(const char *fn,
                                       std::size_t fn_size) noexcept {
  add_field(tag_function, fn, fn_size);
}

RequestFingerprint RequestFingerprint::for_claim() noexcept {
  RequestFingerprint fingerprint;
  fingerprint.add_field(tag_claim_api, nullptr, 0);
  return fingerprint;
}

void RequestFingerprint::add_client_hash(const char *hash,
                                         std::size_t hash_size) noexcept {
  add_field(tag_client_hash, hash, hash_size);
}

void RequestFingerprint::add_field(std::uint8_t tag, const void *data,
                                   std::size_t size) noexcept {
  std::uint8_t header[frame_header_size];
  write_frame_header(tag, size, header);
  hash_.update(header, sizeof header);
  hash_.update(data, size);
}

void RequestFingerprint::add_type(const char *type_name,
                                  std::size_t type_name_size) noexcept {
  add_field(tag_type_name, type_name, type_name_size);
}

void RequestFingerprint::add_value(const void *value,
                                   std::size_t value_size) noexcept {
  add_field(tag_value, value, value_size);
}

void RequestFingerprint::add_null() noexcept {
  add_field(tag_null_value, nullptr, 0);
}

void RequestFingerprint::finish(Fingerprint &out) noexcept {
  hash_.finish(out);
}

namespace {

void finish_key_digest(Sha256 &hash,
                       std::uint8_t (&out)[key_digest_size]) noexcept {
  std::uint8_t digest[Sha256::digest_size];
  hash.finish(digest);
  std::memcpy(out, digest, key_digest_size);
}

} // namespace

void key_digest(const char *key, std::size_t key_size,
                std::uint8_t (&out)[key_digest_size]) noexcept {
  Sha256 hash;
  hash.update(key, key_size);
  finish_key_digest(hash, out);
}

void unconverted_key_digest(const char *key, std::size_t key_size,
                            std::uint8_t (&out)[key_digest_size]) noexcept {
  constexpr std::uint8_t not_utf8 = 0xFF;
  Sha256 hash;
  hash.update(&not_utf8, 1);
  hash.update(key, key_size);
  finish_key_digest(hash, out);
}

namespace {

int hex_digit(char c) noexcept {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

bool is_uuid7_text(const char *key, std::size_t key_size) noexcept {
  constexpr std::size_t uuid_text_size = 36;
  if (key_size != uuid_text_size)
    return false;
  for (std::size_t i = 0; i < key_size; i++) {
    bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? key[i] != '-' : hex_digit(key[i]) < 0)
      return false;
  }
  // The version nibble, and the variant's two high bits (10).
  return key[14] == '7' && (hex_digit(key[19]) & 0xC) == 0x8;
}

// The 48-bit timestamp of a UUIDv7's text, big-endian.
void put_uuid7_timestamp(const char *key, std::uint8_t *out) noexcept {
  constexpr int timestamp_digits[12] = {0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12};
  for (int i = 0; i < 6; i++)
    out[i] =
        static_cast<std::uint8_t>(hex_digit(key[timestamp_digits[2 * i]]) << 4 |
                                  hex_digit(key[timestamp_digits[2 * i + 1]]));
}

void put_sha256_prefix(Sha256 &hash, std::uint8_t *out,
                       std::size_t size) noexcept {
  std::uint8_t digest[Sha256::digest_size];
  hash.finish(digest);
  std::memcpy(out, digest, size);
}

constexpr std::size_t min_sequence_digits = 6;
// 10^18 - 1 fits in 63 bits.
constexpr std::size_t max_sequence_digits = 18;

// Whether what precedes a key's trailing digits names a series: it is empty
// (a plain number), or it holds a character that is neither a hex digit nor
// '-'. The end of a random UUID or hex string is digits often enough (6 of
// them in 6% of UUIDv4 keys) and belongs to no series.
bool names_a_series(const char *prefix, std::size_t prefix_size) noexcept {
  if (prefix_size == 0)
    return true;
  for (std::size_t i = 0; i < prefix_size; i++)
    if (prefix[i] != '-' && hex_digit(prefix[i]) < 0)
      return true;
  return false;
}

std::size_t trailing_digits(const char *key, std::size_t key_size) noexcept {
  std::size_t digits = 0;
  while (digits < key_size && key[key_size - 1 - digits] >= '0' &&
         key[key_size - 1 - digits] <= '9')
    digits++;
  return digits;
}

} // namespace

void key_digests(const char *key, std::size_t key_size,
                 KeyDigests &out) noexcept {
  constexpr std::size_t hash_bytes = 8;
  std::uint8_t key_hash[Sha256::digest_size];
  Sha256 hash;
  hash.update(key, key_size);
  hash.finish(key_hash);
  std::memcpy(out.unordered, key_hash, key_digest_size);

  if (is_uuid7_text(key, key_size)) {
    constexpr std::size_t timestamp_bytes = 6;
    put_uuid7_timestamp(key, out.ordered);
    std::memcpy(out.ordered + timestamp_bytes, key_hash, hash_bytes);
    out.ordered_size = timestamp_bytes + hash_bytes;
    return;
  }
  std::size_t digits = trailing_digits(key, key_size);
  std::size_t prefix_size = key_size - digits;
  if (digits >= min_sequence_digits && digits <= max_sequence_digits &&
      names_a_series(key, prefix_size)) {
    // The digit count keeps "order-0001234" and "order-001234" apart.
    std::uint8_t digit_count = static_cast<std::uint8_t>(digits);
    Sha256 prefix_hash;
    prefix_hash.update(key, prefix_size);
    prefix_hash.update(&digit_count, 1);
    put_sha256_prefix(prefix_hash, out.ordered, hash_bytes);
    std::uint64_t number = 0;
    for (std::size_t i = prefix_size; i < key_size; i++)
      number = number * 10 + static_cast<std::uint64_t>(key[i] - '0');
    for (std::size_t i = 0; i < 8; i++)
      out.ordered[hash_bytes + i] =
          static_cast<std::uint8_t>(number >> (56 - 8 * i));
    out.ordered_size = hash_bytes + 8;
    return;
  }
  std::memcpy(out.ordered, key_hash, key_digest_size);
  out.ordered_size = key_digest_size;
}

namespace {

int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  return -1;
}

bool decode_lower_hex(const char *text, std::size_t size,
                      Fingerprint &out) noexcept {
  if (size != 2 * fingerprint_size)
    return false;
  for (std::size_t i = 0; i < fingerprint_size; ++i) {
    int high = hex_value(text[2 * i]);
    int low = hex_value(text[2 * i + 1]);
    if (high < 0 || low < 0)
      return false;
    out[i] = static_cast<std::uint8_t>(high << 4 | low);
  }
  return true;
}

} // namespace

void legacy_fingerprint(const char *client_hash, std::size_t size,
                        Fingerprint &out) noexcept {
  if (decode_lower_hex(client_hash, size, out))
    return;
  Sha256 hash;
  hash.update(client_hash, size);
  hash.finish(out);
}

} // namespace idempotency::fingerprint
