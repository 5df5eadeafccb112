#include "kube/api_client.h"

#include <gtest/gtest.h>

#include <deque>
#include <stop_token>

#include "unit/fake_clock.h"

namespace vfio_dra::kube {
namespace {

using testing::FakeClock;

// A transport that answers from a script and records what it was sent.
class ScriptedTransport final : public HttpTransport {
 public:
  void Respond(int status, std::string body, std::map<std::string, std::string> headers = {}) {
    HttpResponse r;
    r.status = status;
    r.body = std::move(body);
    r.headers = std::move(headers);
    script_.push_back(r);
  }
  void FailConnection() { script_.push_back(MakeError(ErrorKind::kUnavailable, "refused")); }

  Result<HttpResponse> Send(const HttpRequest& request) override {
    sent.push_back(request);
    if (script_.empty()) return MakeError(ErrorKind::kInternal, "script exhausted");
    auto next = script_.front();
    script_.pop_front();
    return next;
  }
  Result<HttpResponse> Stream(const HttpRequest& request, const BodyChunkHandler& on_chunk,
                              std::stop_token /*stop*/) override {
    sent.push_back(request);
    for (const std::string& chunk : stream_chunks) {
      if (!on_chunk(chunk)) break;
    }
    HttpResponse r;
    r.status = stream_status;
    return r;
  }

  std::vector<HttpRequest> sent;
  std::vector<std::string> stream_chunks;
  int stream_status = 200;

 private:
  std::deque<Result<HttpResponse>> script_;
};

std::string StatusJson(int code, const std::string& reason, const std::string& message) {
  return nlohmann::json({{"kind", "Status"},
                         {"apiVersion", "v1"},
                         {"status", "Failure"},
                         {"code", code},
                         {"reason", reason},
                         {"message", message}})
      .dump();
}

class ApiClientTest : public ::testing::Test {
 protected:
  ApiClientTest() : tokens_("secret", "", clock_) {}
  ApiClient Client(int max_retries = 5) {
    ApiClientOptions options;
    options.qps = 0;  // unlimited: these tests count retries, not pacing
    options.max_retries = max_retries;
    return ApiClient(transport_, tokens_, clock_, Logger::Discard(), options);
  }
  FakeClock clock_;
  TokenSource tokens_;
  ScriptedTransport transport_;
};

TEST_F(ApiClientTest, SendsBearerTokenAndJsonHeaders) {
  transport_.Respond(200, R"({"kind":"Node"})");
  auto client = Client();
  auto got = client.Get("/api/v1/nodes/n1");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)["kind"], "Node");
  ASSERT_EQ(transport_.sent.size(), 1u);
  EXPECT_EQ(transport_.sent[0].headers.at("Authorization"), "Bearer secret");
  EXPECT_EQ(transport_.sent[0].headers.at("Accept"), "application/json");
}

TEST_F(ApiClientTest, SendsBodiesAsJsonOrWithTheGivenContentType) {
  transport_.Respond(201, "{}");
  transport_.Respond(200, "{}");
  auto client = Client();
  const nlohmann::json body = {{"kind", "ResourceClaim"}};
  ASSERT_TRUE(client.Create("/apis/x", body).ok());
  auto applied = client.Call("PATCH", "/apis/x/status?fieldManager=m", &body, Deadline(),
                             kApplyPatchContentType);
  ASSERT_TRUE(applied.ok());
  EXPECT_EQ(applied->status, 200);
  ASSERT_EQ(transport_.sent.size(), 2u);
  EXPECT_EQ(transport_.sent[0].headers.at("Content-Type"), "application/json");
  EXPECT_EQ(transport_.sent[1].method, "PATCH");
  EXPECT_EQ(transport_.sent[1].headers.at("Content-Type"), "application/apply-patch+yaml");
  EXPECT_EQ(nlohmann::json::parse(transport_.sent[1].body), body);
}

TEST_F(ApiClientTest, Retries429HonouringRetryAfter) {
  transport_.Respond(429, StatusJson(429, "TooManyRequests", "slow down"), {{"retry-after", "3"}});
  transport_.Respond(200, "{}");
  auto client = Client();
  ASSERT_TRUE(client.Get("/x").ok());
  ASSERT_EQ(clock_.sleeps().size(), 1u);
  EXPECT_EQ(clock_.sleeps()[0], std::chrono::seconds(3));
}

TEST_F(ApiClientTest, RetryAfterIsCappedSoABadServerCannotStallUs) {
  transport_.Respond(429, "", {{"retry-after", "100000"}});
  transport_.Respond(200, "{}");
  auto client = Client();
  ASSERT_TRUE(client.Get("/x").ok());
  EXPECT_EQ(clock_.sleeps().at(0), std::chrono::seconds(30));
}

TEST_F(ApiClientTest, Retries5xxAndConnectionErrorsWithGrowingBackoff) {
  transport_.Respond(503, "");
  transport_.FailConnection();
  transport_.Respond(500, "");
  transport_.Respond(200, "{}");
  auto client = Client();
  ASSERT_TRUE(client.Get("/x").ok());
  const auto sleeps = clock_.sleeps();
  ASSERT_EQ(sleeps.size(), 3u);
  EXPECT_LT(sleeps[0], sleeps[2]);
}

TEST_F(ApiClientTest, GivesUpAfterMaxRetriesWithTheLastStatus) {
  for (int i = 0; i < 3; ++i)
    transport_.Respond(503, StatusJson(503, "ServiceUnavailable", "busy"));
  auto client = Client(2);
  auto got = client.Get("/apis/x");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().kind, ErrorKind::kUnavailable);
  EXPECT_NE(got.error().message.find("HTTP 503 ServiceUnavailable: busy"), std::string::npos);
  EXPECT_EQ(transport_.sent.size(), 3u);
}

TEST_F(ApiClientTest, ClientErrorsAreNotRetriedAndCarryTheStatusMessage) {
  transport_.Respond(422, StatusJson(422, "Invalid", "spec.devices: Too many: 129"));
  auto client = Client();
  auto got = client.Create("/apis/resource.k8s.io/v1/resourceslices", nlohmann::json::object());
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().kind, ErrorKind::kInvalidArgument);
  EXPECT_NE(got.error().message.find("POST /apis/resource.k8s.io/v1/resourceslices: HTTP 422 "
                                     "Invalid: spec.devices: Too many: 129"),
            std::string::npos)
      << got.error().message;
  EXPECT_EQ(transport_.sent.size(), 1u);
}

TEST_F(ApiClientTest, ConflictAndAlreadyExistsAreDistinguished) {
  transport_.Respond(409, StatusJson(409, "Conflict", "modified"));
  transport_.Respond(409, StatusJson(409, "AlreadyExists", "exists"));
  auto client = Client();
  EXPECT_EQ(client.Update("/a", {}).error().kind, ErrorKind::kConflict);
  EXPECT_EQ(client.Create("/a", {}).error().kind, ErrorKind::kAlreadyExists);
}

TEST_F(ApiClientTest, DeleteSendsPreconditions) {
  transport_.Respond(200, "{}");
  auto client = Client();
  ASSERT_TRUE(client.Delete("/s/a", "uid-1", "42").ok());
  auto body = nlohmann::json::parse(transport_.sent[0].body);
  EXPECT_EQ(body["preconditions"]["uid"], "uid-1");
  EXPECT_EQ(body["preconditions"]["resourceVersion"], "42");
  EXPECT_EQ(transport_.sent[0].method, "DELETE");
}

TEST_F(ApiClientTest, WatchDeliversEventsSplitAcrossChunks) {
  transport_.stream_chunks = {R"({"type":"ADDED","object":{"metadata":{"name":"a"}}})"
                              "\n{\"type\":\"MODI",
                              R"(FIED","object":{"metadata":{"name":"b"}}})"
                              "\n"};
  auto client = Client();
  std::vector<std::string> seen;
  Status status = client.Watch(
      "/w?watch=1",
      [&](const WatchEvent& e) {
        seen.push_back(e.type + ":" + e.object["metadata"]["name"].get<std::string>());
        return true;
      },
      std::stop_token());
  ASSERT_TRUE(status.ok()) << status.error().message;
  EXPECT_EQ(seen, (std::vector<std::string>{"ADDED:a", "MODIFIED:b"}));
}

TEST_F(ApiClientTest, WatchErrorEventWith410IsGone) {
  transport_.stream_chunks = {
      R"({"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"too old resource version"}})"
      "\n"};
  auto client = Client();
  Status status = client.Watch(
      "/w?watch=1", [](const WatchEvent&) { return true; }, std::stop_token());
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().kind, ErrorKind::kGone);
}

TEST_F(ApiClientTest, WatchRejectsMalformedEvents) {
  transport_.stream_chunks = {"not json\n"};
  auto client = Client();
  Status status = client.Watch(
      "/w?watch=1", [](const WatchEvent&) { return true; }, std::stop_token());
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("malformed watch event"), std::string::npos);
}

// A caller with a deadline (the kubelet's) never waits past it: each attempt is bounded by what is
// left, and a retry that could not finish in time is not started.
TEST_F(ApiClientTest, RetriesStopAtTheCallersDeadline) {
  transport_.Respond(429, "", {{"retry-after", "3"}});
  transport_.Respond(200, "{}");
  auto client = Client();
  const Deadline deadline(clock_.Now() + std::chrono::seconds(2));
  auto got = client.Call("GET", "/x", nullptr, deadline);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().kind, ErrorKind::kDeadlineExceeded);
  EXPECT_NE(got.error().message.find("HTTP 429"), std::string::npos) << got.error().message;
  EXPECT_TRUE(clock_.sleeps().empty()) << "no sleep that ends after the deadline";
  ASSERT_EQ(transport_.sent.size(), 1u);
  EXPECT_LE(transport_.sent[0].timeout, std::chrono::seconds(2));
}

TEST(UrlEncode, EncodesSelectorCharacters) {
  EXPECT_EQ(UrlEncode("spec.nodeName=n1,spec.driver=a.b"),
            "spec.nodeName%3Dn1%2Cspec.driver%3Da.b");
}

}  // namespace
}  // namespace vfio_dra::kube
