// Unit tests for the check of the running server's minor release against
// the library's minimum (_PG_init refuses an older one).
#include "idempotency/entry/server_version.hpp"

#include <gtest/gtest.h>

namespace {

using idempotency::entry::check_server_version;
using idempotency::entry::ServerVersionCheck;

TEST(ServerVersion, TheMinimumItselfIsSupported) {
  int running = -1;
  EXPECT_EQ(check_server_version("150010", 150010, &running),
            ServerVersionCheck::supported);
  EXPECT_EQ(running, 150010);
  EXPECT_EQ(check_server_version("190000", 190000, nullptr),
            ServerVersionCheck::supported);
}

TEST(ServerVersion, TheMinorBeforeTheMinimumIsTooOld) {
  int running = -1;
  EXPECT_EQ(check_server_version("150009", 150010, &running),
            ServerVersionCheck::too_old);
  EXPECT_EQ(running, 150009);
  EXPECT_EQ(check_server_version("170001", 170002, nullptr),
            ServerVersionCheck::too_old);
  EXPECT_EQ(check_server_version("170000", 170002, nullptr),
            ServerVersionCheck::too_old);
}

TEST(ServerVersion, LaterMinorsAreSupported) {
  EXPECT_EQ(check_server_version("150011", 150010, nullptr),
            ServerVersionCheck::supported);
  EXPECT_EQ(check_server_version("170012", 170002, nullptr),
            ServerVersionCheck::supported);
  EXPECT_EQ(check_server_version("160099", 160006, nullptr),
            ServerVersionCheck::supported);
}

TEST(ServerVersion, OtherMajorsAreNeitherOldNorSupported) {
  EXPECT_EQ(check_server_version("160000", 150010, nullptr),
            ServerVersionCheck::other_major);
  EXPECT_EQ(check_server_version("140099", 150010, nullptr),
            ServerVersionCheck::other_major);
}

TEST(ServerVersion, MalformedTextIsNoVersion) {
  int running = -1;
  EXPECT_EQ(check_server_version(nullptr, 150010, &running),
            ServerVersionCheck::malformed);
  EXPECT_EQ(running, 0);
  for (const char *text :
       {"", "15.10", "15010", "1500100", "015010", "15001x", "150010 "})
    EXPECT_EQ(check_server_version(text, 150010, nullptr),
              ServerVersionCheck::malformed)
        << text;
}

} // namespace
