#include "server/utf8.h"

#include <gtest/gtest.h>

namespace kvd {
namespace {

TEST(IsValidUtf8Test, AcceptsWellFormedText) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));  // é € 😀
  EXPECT_TRUE(IsValidUtf8("\xf4\x8f\xbf\xbf"));                           // U+10FFFF
  EXPECT_TRUE(IsValidUtf8(std::string("a\0b", 3)));                       // NUL is a character
}

TEST(IsValidUtf8Test, RefusesMalformedText) {
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // U+110000
  EXPECT_FALSE(IsValidUtf8("\xe0\x80\xaf"));      // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // overlong lead byte
  EXPECT_FALSE(IsValidUtf8("\xed\xbf\xbf"));      // surrogate
  EXPECT_FALSE(IsValidUtf8("\xc3"));              // truncated
  EXPECT_FALSE(IsValidUtf8("ab\xa9"));            // lone continuation byte
  EXPECT_FALSE(IsValidUtf8("\xff"));
}

TEST(ToValidUtf8Test, KeepsValidTextAndReplacesBadRuns) {
  EXPECT_EQ(ToValidUtf8("caf\xc3\xa9"), "caf\xc3\xa9");
  EXPECT_EQ(ToValidUtf8("a\xff\xfe"
                        "b"),
            "a\xef\xbf\xbd"
            "b");
  EXPECT_EQ(ToValidUtf8("\xe2\x82"), "\xef\xbf\xbd");
  EXPECT_TRUE(IsValidUtf8(ToValidUtf8("x\xc3\xe2\x82\xac\xed\xa0\x80y")));
  EXPECT_EQ(ToValidUtf8("x\xc3\xe2\x82\xac"), "x\xef\xbf\xbd\xe2\x82\xac");
}

}  // namespace
}  // namespace kvd
