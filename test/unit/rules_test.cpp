// Unit tests for the server-free call rules.
#include "idempotency/protocol/rules.hpp"
#include "idempotency/settings/sqlstate_list.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

namespace {

using idempotency::check_key_size;
using idempotency::KeyCheck;
using idempotency::max_key_bytes;
using idempotency::parse_sqlstate_list;
using idempotency::result_shape;
using idempotency::ResultShape;
using idempotency::row_is_object;
using idempotency::sqlstate_listed;
using idempotency::sqlstate_transient;
using idempotency::SqlstateList;
using idempotency::SqlstateListCheck;

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

SqlstateListCheck check_of(const char *text) {
  SqlstateList list;
  return parse_sqlstate_list(text, list).check;
}

TEST(SqlstateList, EmptyAndBlankAreTheEmptyList) {
  SqlstateList list;
  EXPECT_EQ(parse_sqlstate_list("", list).check, SqlstateListCheck::ok);
  EXPECT_EQ(list.count, 0);
  EXPECT_EQ(parse_sqlstate_list("  \t", list).check, SqlstateListCheck::ok);
  EXPECT_EQ(list.count, 0);
  EXPECT_FALSE(sqlstate_listed(list, "P0001"));
}

TEST(SqlstateList, CodesAndClassesWithBlanksAndLowerCase) {
  SqlstateList list;
  ASSERT_EQ(parse_sqlstate_list(" p0001 ,23,\t22012 ", list).check,
            SqlstateListCheck::ok);
  ASSERT_EQ(list.count, 3);
  EXPECT_STREQ(list.entries[0], "P0001");
  EXPECT_STREQ(list.entries[1], "23");
  EXPECT_TRUE(sqlstate_listed(list, "P0001"));
  EXPECT_TRUE(sqlstate_listed(list, "23505"));
  EXPECT_TRUE(sqlstate_listed(list, "22012"));
  EXPECT_FALSE(sqlstate_listed(list, "P0002"));
  EXPECT_FALSE(sqlstate_listed(list, "22003"));
}

TEST(SqlstateList, MalformedEntriesAreRefusedWithTheirPlace) {
  SqlstateList list;
  auto result = parse_sqlstate_list("P0001, P001", list);
  EXPECT_EQ(result.check, SqlstateListCheck::malformed);
  EXPECT_EQ(result.entry_start, 7u);
  EXPECT_EQ(result.entry_size, 4u);
  EXPECT_EQ(check_of("P0001,"), SqlstateListCheck::malformed);
  EXPECT_EQ(check_of(",P0001"), SqlstateListCheck::malformed);
  EXPECT_EQ(check_of("P0001 23"), SqlstateListCheck::malformed);
  EXPECT_EQ(check_of("P0-01"), SqlstateListCheck::malformed);
  EXPECT_EQ(check_of("2"), SqlstateListCheck::malformed);
  EXPECT_EQ(check_of("P00011"), SqlstateListCheck::malformed);
}

TEST(SqlstateList, TransientAndNonErrorClassesAreRefused) {
  for (const char *text :
       {"40001", "40", "57014", "53", "08006", "58", "XX000", "IK409", "ik",
        "72", "55P03", "55p03", "55006", "25P03", "25P04", "HV00N"})
    EXPECT_EQ(check_of(text), SqlstateListCheck::transient) << text;
  for (const char *text : {"00000", "01", "02000"})
    EXPECT_EQ(check_of(text), SqlstateListCheck::not_an_error) << text;
}

// The classes holding a transient condition may be listed; the transient
// conditions in them are still never stored.
TEST(SqlstateList, TransientConditionsInListableClasses) {
  for (const char *text : {"55", "25", "HV", "55000", "25001", "HV000"})
    EXPECT_EQ(check_of(text), SqlstateListCheck::ok) << text;
  for (const char *sqlstate :
       {"55P03", "55006", "25P03", "25P04", "HV00N", "40001", "40P01",
        "40003", "57014", "57P01", "57P02", "57P03", "57P05", "53200",
        "53100", "53300", "08006", "08001", "58030", "72000", "XX000"})
    EXPECT_TRUE(sqlstate_transient(sqlstate)) << sqlstate;
  for (const char *sqlstate : {"P0001", "23505", "55000", "25001", "55P04",
                               "HV000", "22012", "54000", "42501"})
    EXPECT_FALSE(sqlstate_transient(sqlstate)) << sqlstate;
}

TEST(SqlstateList, AtMostCapacityEntries) {
  std::string text = "P0001";
  for (int i = 1; i < SqlstateList::capacity; i++)
    text += ",P0001";
  EXPECT_EQ(check_of(text.c_str()), SqlstateListCheck::ok);
  text += ",P0001";
  EXPECT_EQ(check_of(text.c_str()), SqlstateListCheck::too_many);
}

} // namespace
