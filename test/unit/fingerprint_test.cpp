// Unit tests for SHA-256, HMAC-SHA256 and the request fingerprint encoding.
//
// Expected digests are NIST FIPS 180-4 example vectors, RFC 4231 HMAC
// vectors, or values computed with coreutils `sha256sum` (noted at each use).
#include "idempotency/fingerprint/fingerprint.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace {

using idempotency::fingerprint::Fingerprint;
using idempotency::fingerprint::HmacSha256;
using idempotency::fingerprint::key_digest;
using idempotency::fingerprint::key_digest_size;
using idempotency::fingerprint::ordered_key_digest;
using idempotency::fingerprint::OrderedKeyDigest;
using idempotency::fingerprint::RequestFingerprint;
using idempotency::fingerprint::Sha256;
using idempotency::fingerprint::unconverted_key_digest;

std::string to_hex(const std::uint8_t (&digest)[Sha256::digest_size]) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (std::uint8_t byte : digest) {
    out += digits[byte >> 4];
    out += digits[byte & 0x0f];
  }
  return out;
}

std::string sha256_hex(const std::string &message) {
  Sha256 hash;
  hash.update(message.data(), message.size());
  std::uint8_t digest[Sha256::digest_size];
  hash.finish(digest);
  return to_hex(digest);
}

// --- SHA-256 ---------------------------------------------------------------

TEST(Sha256, NistEmptyString) {
  EXPECT_EQ(sha256_hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Sha256, NistAbc) {
  EXPECT_EQ(sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256, Nist448Bits) {
  EXPECT_EQ(
      sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
      "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, NistOneMillionA) {
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, OneMillionAInOddChunks) {
  // Chunks of 997 bytes never line up with the 64-byte block.
  const std::string chunk(997, 'a');
  Sha256 hash;
  std::size_t left = 1000000;
  while (left > 0) {
    const std::size_t n = left < chunk.size() ? left : chunk.size();
    hash.update(chunk.data(), n);
    left -= n;
  }
  std::uint8_t digest[Sha256::digest_size];
  hash.finish(digest);
  EXPECT_EQ(to_hex(digest),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Lengths around the padding boundaries: 55 bytes is the longest message
// whose padding fits in one block, 56 needs a second block, 64 is exactly
// one block. Expected values from `head -c N /dev/zero | tr '\0' a |
// sha256sum`.
struct BoundaryCase {
  std::size_t length;
  const char *hex;
};

// Readable test names in ctest output instead of a raw byte dump.
void PrintTo(const BoundaryCase &c, std::ostream *os) {
  *os << c.length << " bytes";
}

class Sha256Boundary : public ::testing::TestWithParam<BoundaryCase> {};

TEST_P(Sha256Boundary, MatchesSha256sum) {
  const BoundaryCase &c = GetParam();
  EXPECT_EQ(sha256_hex(std::string(c.length, 'a')), c.hex);
}

INSTANTIATE_TEST_SUITE_P(
    BlockEdges, Sha256Boundary,
    ::testing::Values(
        BoundaryCase{55,
                     "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e"
                     "910f734318"},
        BoundaryCase{56,
                     "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970"
                     "686ec6738a"},
        BoundaryCase{63,
                     "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da"
                     "457ddc2f34"},
        BoundaryCase{64,
                     "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337"
                     "df154668eb"},
        BoundaryCase{65,
                     "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d"
                     "4f17eb0ae0"}),
    [](const ::testing::TestParamInfo<BoundaryCase> &info) {
      return "Length" + std::to_string(info.param.length);
    });

TEST(Sha256, IncrementalSplitAtEveryOffsetMatchesOneShot) {
  // 150 bytes of varied content: spans more than two blocks, so splits land
  // before, on and after both block boundaries.
  std::string message;
  for (int i = 0; i < 150; ++i)
    message += static_cast<char>((i * 37 + 11) & 0xff);
  const std::string expected = sha256_hex(message);

  for (std::size_t split = 0; split <= message.size(); ++split) {
    Sha256 hash;
    hash.update(message.data(), split);
    hash.update(message.data() + split, message.size() - split);
    std::uint8_t digest[Sha256::digest_size];
    hash.finish(digest);
    EXPECT_EQ(to_hex(digest), expected) << "split at " << split;
  }
}

TEST(Sha256, ByteAtATimeMatchesOneShot) {
  const std::string message =
      "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  Sha256 hash;
  for (char ch : message)
    hash.update(&ch, 1);
  std::uint8_t digest[Sha256::digest_size];
  hash.finish(digest);
  EXPECT_EQ(to_hex(digest),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, EmptyUpdateWithNullPointerIsANoOp) {
  Sha256 hash;
  hash.update(nullptr, 0);
  hash.update("abc", 3);
  hash.update(nullptr, 0);
  std::uint8_t digest[Sha256::digest_size];
  hash.finish(digest);
  EXPECT_EQ(to_hex(digest),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

// --- HMAC-SHA256 (RFC 4231 test cases) ---------------------------------------

std::string hmac_hex(const std::string &key, const std::string &message) {
  HmacSha256 mac(key.data(), key.size());
  mac.update(message.data(), message.size());
  std::uint8_t digest[HmacSha256::mac_size];
  mac.finish(digest);
  return to_hex(digest);
}

TEST(HmacSha256, Rfc4231Case1) {
  EXPECT_EQ(hmac_hex(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
}

TEST(HmacSha256, Rfc4231Case2KeyShorterThanTheDigest) {
  EXPECT_EQ(hmac_hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(HmacSha256, Rfc4231Case6KeyLongerThanABlock) {
  EXPECT_EQ(hmac_hex(std::string(131, '\xaa'),
                     "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(HmacSha256, Rfc4231Case7MessageLongerThanABlock) {
  EXPECT_EQ(
      hmac_hex(std::string(131, '\xaa'),
               "This is a test using a larger than block-size key and a larger "
               "than block-size data. The key needs to be hashed before being "
               "used by the HMAC algorithm."),
      "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST(HmacSha256, CopyOfAKeyedObjectStartsAFreshMessage) {
  // Each claim copies one keyed object; the copy must not share state.
  const HmacSha256 keyed("Jefe", 4);
  for (int round = 0; round < 2; ++round) {
    HmacSha256 mac = keyed;
    const std::string message = "what do ya want for nothing?";
    mac.update(message.data(), 10);
    mac.update(message.data() + 10, message.size() - 10);
    std::uint8_t digest[HmacSha256::mac_size];
    mac.finish(digest);
    EXPECT_EQ(
        to_hex(digest),
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  }
}

TEST(HmacSha256, KeysInTurnEachGetTheirOwnMac) {
  // The backend keeps two keyed contexts (claims' secret, derived keys'):
  // alternating two keys, or three, must never MAC under another's key.
  const std::string case1 =
      "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7";
  const std::string case2 =
      "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
  const std::string case6 =
      "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54";
  for (int round = 0; round < 3; ++round) {
    EXPECT_EQ(hmac_hex(std::string(20, '\x0b'), "Hi There"), case1);
    EXPECT_EQ(hmac_hex("Jefe", "what do ya want for nothing?"), case2);
  }
  for (int round = 0; round < 3; ++round) {
    EXPECT_EQ(hmac_hex(std::string(20, '\x0b'), "Hi There"), case1);
    EXPECT_EQ(hmac_hex("Jefe", "what do ya want for nothing?"), case2);
    EXPECT_EQ(
        hmac_hex(std::string(131, '\xaa'),
                 "Test Using Larger Than Block-Size Key - Hash Key First"),
        case6);
  }
}

// --- RequestFingerprint ----------------------------------------------------

std::string hex_of(RequestFingerprint &fp) {
  Fingerprint out;
  fp.finish(out);
  return to_hex(out);
}

struct Arg {
  std::string type;
  std::optional<std::string> value; // nullopt: SQL NULL
};

// Builds a fingerprint the way the extension does: fn, every type, every
// value.
std::string fingerprint(const std::string &fn, const std::vector<Arg> &args) {
  RequestFingerprint fp(fn.data(), fn.size());
  for (const Arg &arg : args)
    fp.add_type(arg.type.data(), arg.type.size());
  for (const Arg &arg : args) {
    if (arg.value)
      fp.add_value(arg.value->data(), arg.value->size());
    else
      fp.add_null();
  }
  return hex_of(fp);
}

std::string bytes_of(const void *data, std::size_t size) {
  return std::string(static_cast<const char *>(data), size);
}

TEST(KeyDigest, IsTheFirstElevenBytesOfSha256) {
  // sha256("abc") = ba7816bf8f01cfea414140de5dae2223b00361a3...
  std::uint8_t out[key_digest_size];
  key_digest("abc", 3, out);
  ASSERT_EQ(key_digest_size, 11u);
  std::string hex;
  for (std::uint8_t byte : out) {
    static constexpr char digits[] = "0123456789abcdef";
    hex += digits[byte >> 4];
    hex += digits[byte & 0x0f];
  }
  EXPECT_EQ(hex, "ba7816bf8f01cfea414140");
}

TEST(KeyDigest, UnconvertedKeyIsMarkedApartFromEveryUtf8Key) {
  // SHA-256 over 0xFF then the bytes: no UTF-8 text holds the byte 0xFF.
  std::uint8_t marked[key_digest_size];
  unconverted_key_digest("abc", 3, marked);
  std::uint8_t plain[key_digest_size];
  key_digest("\xff"
             "abc",
             4, plain);
  EXPECT_EQ(bytes_of(marked, sizeof marked), bytes_of(plain, sizeof plain));
  key_digest("abc", 3, plain);
  EXPECT_NE(bytes_of(marked, sizeof marked), bytes_of(plain, sizeof plain));
}

OrderedKeyDigest digests_of(const std::string &key) {
  OrderedKeyDigest out;
  ordered_key_digest(key.data(), key.size(), out);
  return out;
}

std::string ordered(const std::string &key) {
  OrderedKeyDigest digests = digests_of(key);
  return bytes_of(digests.bytes, digests.size);
}

TEST(OrderedKeyDigest, RandomKeyKeepsItsUnorderedDigest) {
  for (const std::string &key : std::vector<std::string>{
           "abc", "4b2f9a8e-3c1d-4e5f-9a0b-1c2d3e4f5a6b", "order-12345",
           // A random UUID or hex string that happens to end in digits.
           "4b2f9a8e-3c1d-4e5f-9a0b-1c2d3e123456",
           "4b2f9a8e-3c1d-4e5f-9a0b-123456789012",
           "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff6123456789",
           "order-1234567890123456789", std::string(255, 'x')}) {
    OrderedKeyDigest digests = digests_of(key);
    std::uint8_t plain[key_digest_size];
    key_digest(key.data(), key.size(), plain);
    EXPECT_EQ(digests.size, key_digest_size) << key;
    EXPECT_EQ(ordered(key), bytes_of(plain, sizeof plain)) << key;
  }
}

TEST(OrderedKeyDigest, Uuid7BeginsWithItsTimestamp) {
  const std::string key("0190a4b2-7c3d-7123-8456-0123456789ab");
  OrderedKeyDigest digests = digests_of(key);
  ASSERT_NE(digests.size, key_digest_size);
  ASSERT_EQ(digests.size, 14u);
  EXPECT_EQ(bytes_of(digests.bytes, 6),
            std::string("\x01\x90\xa4\xb2\x7c\x3d", 6));
  std::uint8_t plain[key_digest_size];
  key_digest(key.data(), key.size(), plain);
  // Then SHA-256 of the key, whose first 11 bytes are key_digest(key).
  EXPECT_EQ(bytes_of(digests.bytes + 6, 8), bytes_of(plain, 8));
  // Upper-case hex digits are the same timestamp, another key.
  const std::string upper("0190A4B2-7C3D-7123-8456-0123456789AB");
  EXPECT_EQ(ordered(upper).substr(0, 6), ordered(key).substr(0, 6));
  EXPECT_NE(ordered(upper), ordered(key));
}

TEST(OrderedKeyDigest, OtherUuidVersionsAreRandomKeys) {
  EXPECT_EQ(digests_of("0190a4b2-7c3d-4123-8456-0123456789ab").size,
            key_digest_size);
  // The variant must be RFC 9562's (10xx).
  EXPECT_EQ(digests_of("0190a4b2-7c3d-7123-c456-0123456789ab").size,
            key_digest_size);
  EXPECT_EQ(digests_of("0190a4b2-7c3d-7123-8456-0123456789a").size,
            key_digest_size);
}

TEST(OrderedKeyDigest, LaterKeysOfASeriesSortAfter) {
  EXPECT_LT(ordered("0190a4b2-7c3d-7fff-bfff-ffffffffffff"),
            ordered("0190a4b2-7c3e-7000-8000-000000000000"));
  EXPECT_LT(ordered("order-000000999"), ordered("order-000001000"));
  EXPECT_LT(ordered("inv-2026-000123"), ordered("inv-2026-000124"));
  EXPECT_LT(ordered("999999999999999998"), ordered("999999999999999999"));
}

TEST(OrderedKeyDigest, SequentialIdIsItsPrefixHashThenItsNumber) {
  OrderedKeyDigest digests = digests_of("order-000000123");
  ASSERT_NE(digests.size, key_digest_size);
  ASSERT_EQ(digests.size, 16u);
  EXPECT_EQ(bytes_of(digests.bytes + 8, 8),
            std::string("\0\0\0\0\0\0\0\x7b", 8));
  // sha256("order-" 0x09), the prefix and the number of digits.
  Sha256 hash;
  hash.update("order-\x09", 7);
  std::uint8_t prefix_hash[Sha256::digest_size];
  hash.finish(prefix_hash);
  EXPECT_EQ(bytes_of(digests.bytes, 8), bytes_of(prefix_hash, 8));
}

TEST(OrderedKeyDigest, PlainNumbersAndNamedPrefixesAreSeries) {
  EXPECT_EQ(digests_of("000000123456").size, 16u);
  EXPECT_EQ(digests_of("ORD123456").size, 16u);
  EXPECT_EQ(digests_of("inv-2026-000123").size, 16u);
  EXPECT_EQ(digests_of("abc-123456").size, key_digest_size);
}

TEST(OrderedKeyDigest, SameNumberUnderAnotherPrefixOrLengthIsAnotherKey) {
  EXPECT_NE(ordered("order-000123"), ordered("order-0000123"));
  EXPECT_NE(ordered("order-000123"), ordered("refund-000123"));
  EXPECT_EQ(ordered("order-000123").substr(8),
            ordered("refund-000123").substr(8));
}

TEST(RequestFingerprint, EncodingIsStable) {
  const std::uint8_t int4_300[] = {0x2c, 0x01, 0x00, 0x00};
  EXPECT_EQ(fingerprint("f", {{"int4", bytes_of(int4_300, sizeof int4_300)},
                              {"text", std::nullopt}}),
            "92f114a23ade7df6438f750ae3fb6d1bd1b69123be76401504bff1b1bd767bd6");
}

TEST(RequestFingerprint, EmptyFunctionNameIsFramed) {
  // printf '\x01\x00\x00\x00\x00\x00\x00\x00\x00' | sha256sum
  EXPECT_EQ(fingerprint("", {}),
            "a536aa3cede6ea3c1f3e0357c3c60e0f216a8c89b853df13b29daa8f85065dfb");
}

TEST(RequestFingerprint, SameInputsGiveSameHex) {
  const std::vector<Arg> args = {{"text", "order-17"}, {"text", std::nullopt}};
  EXPECT_EQ(fingerprint("public.charge", args),
            fingerprint("public.charge", args));
}

TEST(RequestFingerprint, ArgumentBoundariesMatter) {
  EXPECT_NE(fingerprint("f", {{"text", "ab"}, {"text", "c"}}),
            fingerprint("f", {{"text", "a"}, {"text", "bc"}}));
}

TEST(RequestFingerprint, FunctionAndTypeBoundaryMatters) {
  EXPECT_NE(fingerprint("fa", {{"b", "x"}}), fingerprint("f", {{"ab", "x"}}));
}

TEST(RequestFingerprint, TypeNameAndValueBoundaryMatters) {
  EXPECT_NE(fingerprint("f", {{"text", "xy"}}),
            fingerprint("f", {{"textx", "y"}}));
}

TEST(RequestFingerprint, NullDiffersFromEmptyValue) {
  EXPECT_NE(fingerprint("f", {{"text", std::nullopt}}),
            fingerprint("f", {{"text", ""}}));
}

TEST(RequestFingerprint, NullDiffersFromNoArgument) {
  EXPECT_NE(fingerprint("f", {}), fingerprint("f", {{"text", std::nullopt}}));
}

TEST(RequestFingerprint, NullTypeNameMatters) {
  EXPECT_NE(fingerprint("f", {{"int4", std::nullopt}}),
            fingerprint("f", {{"int8", std::nullopt}}));
}

TEST(RequestFingerprint, TypeNameMattersForSameBytes) {
  // 300 as the same little-endian bytes under two type names: only the type
  // name tells them apart.
  const std::uint8_t bytes[] = {0x2c, 0x01, 0x00, 0x00};
  EXPECT_NE(fingerprint("f", {{"int4", bytes_of(bytes, sizeof bytes)}}),
            fingerprint("f", {{"int8", bytes_of(bytes, sizeof bytes)}}));
}

TEST(RequestFingerprint, Int4AndInt8Of300Differ) {
  const std::int32_t v4 = 300;
  const std::int64_t v8 = 300;
  EXPECT_NE(fingerprint("f", {{"int4", bytes_of(&v4, sizeof v4)}}),
            fingerprint("f", {{"int8", bytes_of(&v8, sizeof v8)}}));
}

TEST(RequestFingerprint, ArgumentOrderMatters) {
  EXPECT_NE(fingerprint("f", {{"text", "x"}, {"text", "y"}}),
            fingerprint("f", {{"text", "y"}, {"text", "x"}}));
}

TEST(RequestFingerprint, TypesAreTiedToTheirValuesByPosition) {
  EXPECT_NE(fingerprint("f", {{"int4", "a"}, {"text", "b"}}),
            fingerprint("f", {{"text", "a"}, {"int4", "b"}}));
}

TEST(RequestFingerprint, FunctionNameMatters) {
  EXPECT_NE(fingerprint("f", {}), fingerprint("g", {}));
}

TEST(RequestFingerprint, LargeValueCrossesBlocks) {
  // A value longer than several SHA-256 blocks, and one byte different.
  std::string big(1000, 'v');
  const std::string a = fingerprint("f", {{"bytea", big}});
  big[999] = 'w';
  EXPECT_NE(a, fingerprint("f", {{"bytea", big}}));
}

TEST(RequestFingerprint, CopyOfThePrefixFinishesLikeAFreshBuild) {
  // The extension hashes fn and the types once per statement and copies
  // that state for every call; a copy must go on exactly like the original.
  RequestFingerprint prefix("f", 1);
  prefix.add_type("int4", 4);
  prefix.add_type("text", 4);
  for (const char *value : {"1", "22", "333"}) {
    RequestFingerprint copy = prefix;
    copy.add_value(value, std::strlen(value));
    copy.add_null();
    EXPECT_EQ(hex_of(copy),
              fingerprint("f", {{"int4", value}, {"text", std::nullopt}}));
  }
}

TEST(RequestFingerprint, KeptPrefixStateFinishesLikeAFreshBuild) {
  // The statement cache keeps the prefix's hash state; every copy starts
  // from it, and one that adds a type first drops it.
  RequestFingerprint prefix("f", 1);
  prefix.add_type("int4", 4);
  prefix.keep_prefix_state();
  for (const char *value : {"1", "22", "333"}) {
    RequestFingerprint copy = prefix;
    copy.add_value(value, std::strlen(value));
    EXPECT_EQ(hex_of(copy), fingerprint("f", {{"int4", value}}));
    RequestFingerprint longer = prefix;
    longer.add_type("text", 4);
    longer.add_value(value, std::strlen(value));
    longer.add_null();
    EXPECT_EQ(hex_of(longer),
              fingerprint("f", {{"int4", value}, {"text", std::nullopt}}));
  }
  RequestFingerprint nothing_more = prefix;
  RequestFingerprint fresh("f", 1);
  fresh.add_type("int4", 4);
  EXPECT_EQ(hex_of(nothing_more), hex_of(fresh));
}

TEST(Sha256, OverlappingHashesEachFinishRight) {
  // Hashes open at once each hold a context of their own.
  Sha256 outer;
  outer.update("a", 1);
  Sha256 inner;
  inner.update("abc", 3);
  outer.update("bc", 2);
  std::uint8_t digest[Sha256::digest_size];
  inner.finish(digest);
  EXPECT_EQ(to_hex(digest),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  outer.finish(digest);
  EXPECT_EQ(to_hex(digest),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  HmacSha256 first("Jefe", 4);
  HmacSha256 second(std::string(20, '\x0b').data(), 20);
  first.update("what do ya want ", 16);
  second.update("Hi There", 8);
  first.update("for nothing?", 12);
  std::uint8_t mac[HmacSha256::mac_size];
  second.finish(mac);
  EXPECT_EQ(to_hex(mac),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  first.finish(mac);
  EXPECT_EQ(to_hex(mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

// --- Client hashes ----------------------------------------------------------

std::string client_fingerprint(const std::string &fn, const std::string &hash) {
  RequestFingerprint fp(fn.data(), fn.size());
  fp.add_client_hash(hash.data(), hash.size());
  return hex_of(fp);
}

std::string claim_fingerprint(const std::optional<std::string> &hash) {
  RequestFingerprint fp = RequestFingerprint::for_claim();
  if (hash)
    fp.add_client_hash(hash->data(), hash->size());
  else
    fp.add_null();
  return hex_of(fp);
}

TEST(ClientHash, FnIsPartOfTheFingerprint) {
  EXPECT_NE(client_fingerprint("SELECT 1", "h"),
            client_fingerprint("SELECT 2", "h"));
  EXPECT_EQ(client_fingerprint("SELECT 1", "h"),
            client_fingerprint("SELECT 1", "h"));
  EXPECT_NE(client_fingerprint("SELECT 1", "h"),
            client_fingerprint("SELECT 1", "h2"));
}

TEST(ClientHash, FramingKeepsFnAndHashApart) {
  EXPECT_NE(client_fingerprint("ab", "c"), client_fingerprint("a", "bc"));
}

TEST(ClientHash, DiffersFromTheComputedFingerprint) {
  // A client hash that spells a value is not that value.
  EXPECT_NE(client_fingerprint("f", "x"), fingerprint("f", {{"text", "x"}}));
  EXPECT_NE(client_fingerprint("f", ""), fingerprint("f", {}));
}

TEST(ClientHash, ClaimsAreMarked) {
  EXPECT_NE(claim_fingerprint(std::string("h")), client_fingerprint("", "h"));
  EXPECT_NE(claim_fingerprint(std::nullopt),
            claim_fingerprint(std::string("")));
  EXPECT_EQ(claim_fingerprint(std::string("h")),
            claim_fingerprint(std::string("h")));
  EXPECT_NE(claim_fingerprint(std::string("h")),
            claim_fingerprint(std::string("i")));
}

} // namespace

// --- Pinned outputs ---------------------------------------------------------
//
// Every digest the extension stores or locks on, computed once by the
// hand-written SHA-256 and HMAC of versions up to 1.0 and pinned here: rows
// stored by those versions must be found again, byte for byte, whatever
// implementation computes them now.

std::string hex_bytes(const std::uint8_t *data, std::size_t size) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < size; ++i) {
    out += digits[data[i] >> 4];
    out += digits[data[i] & 0x0f];
  }
  return out;
}

TEST(Pinned, UnorderedKeyDigest) {
  std::uint8_t out[key_digest_size];
  key_digest("4b2f9a8e-3c1d-4e5f-9a0b-1c2d3e4f5a6b", 36, out);
  EXPECT_EQ(hex_bytes(out, sizeof out), "ffb1f8110573980eda58a7");
  unconverted_key_digest("caf\xe9", 4, out);
  EXPECT_EQ(hex_bytes(out, sizeof out), "3a3b2136c3fdbadfaab3bf");
}

TEST(Pinned, OrderedOrderedKeyDigest) {
  OrderedKeyDigest uuid7 = digests_of("0190a4b2-7c3d-7123-8456-0123456789ab");
  EXPECT_EQ(hex_bytes(uuid7.bytes, uuid7.size), "0190a4b27c3d6fb9fd663c70b531");
  std::uint8_t plain[key_digest_size];
  key_digest("0190a4b2-7c3d-7123-8456-0123456789ab", 36, plain);
  EXPECT_EQ(hex_bytes(plain, sizeof plain), "6fb9fd663c70b5317cd837");
  OrderedKeyDigest series = digests_of("order-000000123");
  EXPECT_EQ(hex_bytes(series.bytes, series.size),
            "6189c143ed707b12000000000000007b");
  key_digest("order-000000123", 15, plain);
  EXPECT_EQ(hex_bytes(plain, sizeof plain), "aac5785ea0f67b26728ee2");
  OrderedKeyDigest random = digests_of(std::string(200, 'k'));
  EXPECT_EQ(hex_bytes(random.bytes, random.size), "6de3c28869103736196204");
}

TEST(Pinned, RequestFingerprints) {
  // Several blocks: a long fn, qualified type names, a 1000-byte value.
  const std::string fn =
      "SELECT bench.withdraw($1, $2, $3) -- " + std::string(100, 'c');
  EXPECT_EQ(fingerprint(fn, {{"pg_catalog.int4", std::string("\0\0\1\x2c", 4)},
                             {"pg_catalog.text", std::string(1000, 'v')},
                             {"pg_catalog.numeric", std::nullopt}}),
            "c8b047aa6e343d214c9fb5cae9f7a54390fc62ed229def1a12ff662de159b211");
  EXPECT_EQ(client_fingerprint("SELECT 1", "client-hash"),
            "9614ec6e115aee7ae2aea1aedbd8e478f9d147ab52a9ed43a9adcf26400aa236");
  EXPECT_EQ(claim_fingerprint(std::string("claim-hash")),
            "5450ab74595361acff96faa1abc9a9c859b63964d86a35ab06445a9dcdb599dd");
}

TEST(Pinned, ClaimTagMac) {
  // A claim's message under a 32-byte secret: database and role (8 bytes),
  // the key, a separator, a tenant's bytes; fed in pieces as claim_for does.
  std::uint8_t secret[32];
  for (int i = 0; i < 32; ++i)
    secret[i] = static_cast<std::uint8_t>(i * 7 + 1);
  const HmacSha256 keyed(secret, sizeof secret);
  HmacSha256 mac = keyed;
  const std::uint8_t prefix[8] = {0, 0, 0x40, 0x01, 0, 0, 0x27, 0x10};
  mac.update(prefix, sizeof prefix);
  mac.update("order-000000123", 15);
  const std::uint8_t separator = 0;
  mac.update(&separator, 1);
  mac.update("tenant-a", 8);
  std::uint8_t digest[HmacSha256::mac_size];
  mac.finish(digest);
  EXPECT_EQ(to_hex(digest),
            "7e047c6eaa0eaaf9410c16b1a29d9144433b9dda031a1951130f20ddf0f401d9");
}
