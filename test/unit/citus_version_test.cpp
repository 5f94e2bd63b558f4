// Unit tests for the check of citus.version (the Citus versions the
// integration was tested with).
#include "idempotency/storage/citus_version.hpp"

#include <gtest/gtest.h>

namespace {

using idempotency::storage::citus::check_citus_version;
using idempotency::storage::citus::CitusVersionCheck;

TEST(CitusVersion, ThirteenIsTested) {
  int major = -1;
  EXPECT_EQ(check_citus_version("13.2.2", &major), CitusVersionCheck::tested);
  EXPECT_EQ(major, 13);
}

TEST(CitusVersion, FourteenIsTested) {
  int major = -1;
  EXPECT_EQ(check_citus_version("14.0.1", &major), CitusVersionCheck::tested);
  EXPECT_EQ(major, 14);
  EXPECT_EQ(check_citus_version("14.1devel", nullptr),
            CitusVersionCheck::tested);
}

TEST(CitusVersion, OtherMajorsAreUntested) {
  int major = -1;
  EXPECT_EQ(check_citus_version("12.1.6", &major), CitusVersionCheck::untested);
  EXPECT_EQ(major, 12);
  EXPECT_EQ(check_citus_version("15.0.0", &major), CitusVersionCheck::untested);
  EXPECT_EQ(major, 15);
  EXPECT_EQ(check_citus_version("1.3", nullptr), CitusVersionCheck::untested);
  EXPECT_EQ(check_citus_version("113.0", nullptr), CitusVersionCheck::untested);
  EXPECT_EQ(check_citus_version("140.1", nullptr), CitusVersionCheck::untested);
}

TEST(CitusVersion, NotAVersionIsMalformed) {
  int major = -1;
  EXPECT_EQ(check_citus_version(nullptr, &major), CitusVersionCheck::malformed);
  EXPECT_EQ(major, 0);
  EXPECT_EQ(check_citus_version("", nullptr), CitusVersionCheck::malformed);
  EXPECT_EQ(check_citus_version("14", nullptr), CitusVersionCheck::malformed);
  EXPECT_EQ(check_citus_version("v14.0", nullptr),
            CitusVersionCheck::malformed);
  EXPECT_EQ(check_citus_version(".14", nullptr), CitusVersionCheck::malformed);
  EXPECT_EQ(check_citus_version("99999999999999999999.0", nullptr),
            CitusVersionCheck::malformed);
}

} // namespace
