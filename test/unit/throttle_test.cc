#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "kube/backoff.h"
#include "kube/rate_limiter.h"
#include "kube/token_source.h"
#include "unit/fake_clock.h"

namespace vfio_dra::kube {
namespace {

using std::chrono::milliseconds;
using testing::FakeClock;

TEST(RateLimiter, AllowsTheBurstThenPacesAtQps) {
  FakeClock clock;
  RateLimiter limiter(5.0, 10, clock);
  const auto start = clock.Now();
  for (int i = 0; i < 10; ++i) EXPECT_EQ(limiter.Reserve(), start) << "burst token " << i;
  EXPECT_EQ(limiter.Reserve(), start + milliseconds(200));
  EXPECT_EQ(limiter.Reserve(), start + milliseconds(400));
  clock.Advance(std::chrono::seconds(10));  // the bucket refills, but never beyond the burst
  const auto later = clock.Now();
  for (int i = 0; i < 10; ++i) EXPECT_EQ(limiter.Reserve(), later);
  EXPECT_GT(limiter.Reserve(), later);
}

TEST(RateLimiter, AcquireSleepsUntilTheReservation) {
  FakeClock clock;
  RateLimiter limiter(2.0, 1, clock);
  limiter.Acquire();
  limiter.Acquire();
  ASSERT_EQ(clock.sleeps().size(), 1u);
  EXPECT_EQ(clock.sleeps()[0], milliseconds(500));
}

TEST(Backoff, GrowsExponentiallyWithJitterAndCaps) {
  Backoff backoff(milliseconds(100), milliseconds(1000), 0.2, 42);
  const long expected[] = {100, 200, 400, 800, 1000, 1000};
  for (long base : expected) {
    const long got = backoff.Next().count();
    EXPECT_GE(got, base * 8 / 10);
    EXPECT_LE(got, base * 12 / 10);
  }
  backoff.Reset();
  EXPECT_LE(backoff.Next().count(), 120);
}

TEST(Backoff, FullJitterSpreadsManyInstancesOverTheWholeWindow) {
  // 200 plugins whose watches broke at the same moment: their first delays cover [0, 2 x 500 ms]
  // instead of a band around 500 ms.
  long lowest = 1000000;
  long highest = 0;
  for (unsigned seed = 0; seed < 200; ++seed) {
    const long delay =
        Backoff(milliseconds(500), milliseconds(10000), kFullJitter, seed).Next().count();
    EXPECT_LE(delay, 1000);
    lowest = std::min(lowest, delay);
    highest = std::max(highest, delay);
  }
  EXPECT_LT(lowest, 100);
  EXPECT_GT(highest, 900);
}

class TokenSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vfio-dra-token-XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/token";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void WriteToken(const std::string& token) { std::ofstream(path_) << token << "\n"; }
  std::string dir_;
  std::string path_;
};

TEST_F(TokenSourceTest, RereadsTheFileAfterThePeriodAndAfterInvalidate) {
  FakeClock clock;
  WriteToken("one");
  TokenSource tokens("", path_, clock, std::chrono::seconds(50));
  EXPECT_EQ(*tokens.Token(), "one");
  WriteToken("two");
  EXPECT_EQ(*tokens.Token(), "one");  // cached within the period
  clock.Advance(std::chrono::seconds(51));
  EXPECT_EQ(*tokens.Token(), "two");
  WriteToken("three");
  tokens.Invalidate();  // after a 401
  EXPECT_EQ(*tokens.Token(), "three");
}

TEST_F(TokenSourceTest, KeepsTheLastGoodTokenWhenTheFileVanishes) {
  FakeClock clock;
  WriteToken("good");
  TokenSource tokens("", path_, clock);
  EXPECT_EQ(*tokens.Token(), "good");
  std::filesystem::remove(path_);
  clock.Advance(std::chrono::minutes(5));
  EXPECT_EQ(*tokens.Token(), "good");
}

TEST_F(TokenSourceTest, FailsClearlyWhenTheFileWasNeverReadable) {
  FakeClock clock;
  TokenSource tokens("", path_, clock);
  auto token = tokens.Token();
  ASSERT_FALSE(token.ok());
  EXPECT_NE(token.error().message.find(path_), std::string::npos);
}

TEST_F(TokenSourceTest, StaticTokenWinsOverTheFile) {
  FakeClock clock;
  WriteToken("file");
  TokenSource tokens("literal", path_, clock);
  EXPECT_EQ(*tokens.Token(), "literal");
}

}  // namespace
}  // namespace vfio_dra::kube
