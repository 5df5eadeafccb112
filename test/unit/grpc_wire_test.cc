// The gRPC wire conventions of the plugin's server: message prefix, request framing errors, the
// grpc-timeout header and grpc-message encoding (values from the gRPC over HTTP/2 protocol text).
#include "plugin/grpc_wire.h"

#include <gtest/gtest.h>

namespace vfio_dra::plugin {
namespace {

using std::chrono::nanoseconds;

TEST(GrpcWireTest, AFramedMessageHasAPlainFlagAndABigEndianLength) {
  const std::string framed = FrameMessage(std::string(258, 'a'));
  ASSERT_EQ(framed.size(), 263U);
  EXPECT_EQ(framed.substr(0, 5), std::string("\0\0\0\x01\x02", 5));
  auto message = SingleRequestMessage(framed);
  ASSERT_TRUE(message.ok()) << message.error().message;
  EXPECT_EQ(*message, std::string(258, 'a'));
  EXPECT_TRUE(SingleRequestMessage(FrameMessage("")).ok());
}

TEST(GrpcWireTest, RequestBodiesThatAreNotExactlyOnePlainMessageAreRefusedWithTheReason) {
  EXPECT_EQ(SingleRequestMessage(std::string("\0\0\0", 3)).error().kind,
            ErrorKind::kInvalidArgument);
  EXPECT_EQ(SingleRequestMessage(std::string("\x01\0\0\0\x01z", 6)).error().kind,
            ErrorKind::kUnimplemented);
  EXPECT_EQ(SingleRequestMessage(std::string("\x02\0\0\0\x01z", 6)).error().kind,
            ErrorKind::kInvalidArgument);
  const auto short_body = SingleRequestMessage(std::string("\0\0\0\0\x05z", 6));
  ASSERT_FALSE(short_body.ok());
  EXPECT_NE(short_body.error().message.find("announces 5 bytes but 1 follow"), std::string::npos)
      << short_body.error().message;
  EXPECT_FALSE(SingleRequestMessage(FrameMessage("a") + FrameMessage("b")).ok());
  EXPECT_FALSE(SingleRequestMessage(std::string("\0\xff\xff\xff\xff", 5)).ok());
}

TEST(GrpcWireTest, TimeoutsInEveryUnitAndMalformedOnes) {
  EXPECT_EQ(ParseGrpcTimeout("45S"), nanoseconds(45'000'000'000));
  EXPECT_EQ(ParseGrpcTimeout("44999m"), nanoseconds(44'999'000'000));
  EXPECT_EQ(ParseGrpcTimeout("2M"), nanoseconds(120'000'000'000));
  EXPECT_EQ(ParseGrpcTimeout("1H"), nanoseconds(3'600'000'000'000));
  EXPECT_EQ(ParseGrpcTimeout("7u"), nanoseconds(7'000));
  EXPECT_EQ(ParseGrpcTimeout("99999999n"), nanoseconds(99'999'999));
  // The largest value the protocol allows in hours still fits (capped at a year).
  EXPECT_TRUE(ParseGrpcTimeout("99999999H").has_value());
  for (const char* bad : {"", "S", "12", "1s", "-1S", "123456789S", "1.5S", " 1S"}) {
    EXPECT_FALSE(ParseGrpcTimeout(bad).has_value()) << bad;
  }
}

TEST(GrpcWireTest, GrpcMessagePercentEncodesPercentAndNonPrintableBytes) {
  EXPECT_EQ(PercentEncodeGrpcMessage("plain text: ok"), "plain text: ok");
  EXPECT_EQ(PercentEncodeGrpcMessage("100%\n"), "100%25%0A");
  EXPECT_EQ(PercentEncodeGrpcMessage("\xc3\xa9"), "%C3%A9");
}

}  // namespace
}  // namespace vfio_dra::plugin
