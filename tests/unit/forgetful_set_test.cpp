// common/forgetful_set.h: the bound on remembered answers that a long-running agent keeps seeing
// new keys for (files without a runtime, a process's mapped files, refused occasional signatures).
#include "common/forgetful_set.h"

#include <gtest/gtest.h>

#include <string>

namespace strata {
namespace {

TEST(ForgetfulSet, RemembersUpToItsCapThenForgetsEverything) {
  ForgetfulSet<std::string> s(3);
  s.insert("a");
  s.insert("b");
  s.insert("c");
  EXPECT_TRUE(s.contains("a") && s.contains("b") && s.contains("c"));
  EXPECT_EQ(s.forgets(), 0u);
  s.insert("b");  // already there: no room needed
  EXPECT_EQ(s.size(), 3u);
  EXPECT_EQ(s.forgets(), 0u);
  s.insert("d");  // full: forgets a, b and c, keeps d
  EXPECT_EQ(s.size(), 1u);
  EXPECT_TRUE(s.contains("d"));
  EXPECT_FALSE(s.contains("a"));
  EXPECT_EQ(s.forgets(), 1u);
}

TEST(ForgetfulSet, NeverHoldsMoreThanItsCapWhateverItIsFed) {
  ForgetfulSet<int> s(100);
  for (int i = 0; i < 100000; ++i) {
    s.insert(i);
    ASSERT_LE(s.size(), 100u);
    ASSERT_TRUE(s.contains(i)) << "the latest entry is always remembered";
  }
  EXPECT_EQ(s.forgets(), 100000u / 100 - 1);
}

TEST(ForgetfulSet, KeepIfPrunesToTheEntriesThatStillMatter) {
  ForgetfulSet<int> s(10);
  for (int i = 0; i < 8; ++i) s.insert(i);
  s.keep_if([](int v) { return v % 2 == 0; });
  EXPECT_EQ(s.size(), 4u);
  EXPECT_TRUE(s.contains(6));
  EXPECT_FALSE(s.contains(7));
  EXPECT_EQ(s.forgets(), 0u);
}

TEST(ForgetfulSet, ACapOfZeroStillRemembersTheLatest) {
  ForgetfulSet<int> s(0);
  s.insert(1);
  s.insert(2);
  EXPECT_TRUE(s.contains(2));
  EXPECT_EQ(s.size(), 1u);
}

}  // namespace
}  // namespace strata
