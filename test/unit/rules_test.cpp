// Unit tests for the server-free call rules.
#include "protocol/rules.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace {

using idempotency::check_key_size;
using idempotency::KeyCheck;
using idempotency::max_key_bytes;
using idempotency::result_shape;
using idempotency::ResultShape;
using idempotency::row_is_object;

// --- key size --------------------------------------------------------------

TEST(CheckKeySize, ZeroBytesIsEmpty) {
  EXPECT_EQ(check_key_size(0), KeyCheck::empty);
}

TEST(CheckKeySize, OneByteIsOk) { EXPECT_EQ(check_key_size(1), KeyCheck::ok); }

TEST(CheckKeySize, MaxBytesIsOk) {
  ASSERT_EQ(max_key_bytes, 255u);
  EXPECT_EQ(check_key_size(254), KeyCheck::ok);
  EXPECT_EQ(check_key_size(255), KeyCheck::ok);
}

TEST(CheckKeySize, OnePastMaxIsTooLong) {
  EXPECT_EQ(check_key_size(256), KeyCheck::too_long);
}

TEST(CheckKeySize, HugeIsTooLong) {
  EXPECT_EQ(check_key_size(std::numeric_limits<std::size_t>::max()),
            KeyCheck::too_long);
}

// --- result shape ----------------------------------------------------------

TEST(ResultShape, NoRowsIsNoResponse) {
  EXPECT_EQ(result_shape(0, 1), ResultShape::no_response);
  EXPECT_EQ(result_shape(0, 3), ResultShape::no_response);
}

TEST(ResultShape, NoColumnsIsNoResponse) {
  EXPECT_EQ(result_shape(0, 0), ResultShape::no_response);
  EXPECT_EQ(result_shape(1, 0), ResultShape::no_response);
  EXPECT_EQ(result_shape(5, 0), ResultShape::no_response);
}

TEST(ResultShape, NegativeColumnsIsNoResponse) {
  EXPECT_EQ(result_shape(1, -1), ResultShape::no_response);
  EXPECT_EQ(result_shape(2, std::numeric_limits<int>::min()),
            ResultShape::no_response);
}

TEST(ResultShape, OneRowOneColumnIsValue) {
  EXPECT_EQ(result_shape(1, 1), ResultShape::value);
}

TEST(ResultShape, OneRowSeveralColumnsIsObject) {
  EXPECT_EQ(result_shape(1, 2), ResultShape::object);
  EXPECT_EQ(result_shape(1, 1600), ResultShape::object);
}

TEST(ResultShape, SeveralRowsIsArray) {
  EXPECT_EQ(result_shape(2, 1), ResultShape::array);
  EXPECT_EQ(result_shape(2, 3), ResultShape::array);
  EXPECT_EQ(result_shape(std::numeric_limits<std::uint64_t>::max(), 1),
            ResultShape::array);
}

TEST(RowIsObject, OnlyForSeveralColumns) {
  EXPECT_FALSE(row_is_object(1));
  EXPECT_TRUE(row_is_object(2));
}

} // namespace
