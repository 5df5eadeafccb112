#include "kube/claim_status_writer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <regex>

#include "kube/claim_status_queue.h"
#include "unit/fake_clock.h"

namespace vfio_dra::kube {
namespace {

using nlohmann::json;
using std::chrono::system_clock;

// 2026-11-25T10:00:00Z.
system_clock::time_point Nov25() {
  return std::chrono::sys_days(std::chrono::year(2026) / std::chrono::November / 25) +
         std::chrono::hours(10);
}

ClaimStatusTarget Target(const std::string& api_version = "resource.k8s.io/v1") {
  return {api_version, "vms", "sriov-claim", "claim-uid-1", ""};
}

AllocatedDeviceStatus ReadyVf(const std::string& mac = "de:ad:00:00:be:ef") {
  AllocatedDeviceStatus device;
  device.driver = "vfio.dra.io";
  device.pool = "node1";
  device.device = "vf-0000-3b-02-1";
  device.conditions.push_back({"Ready", "True", "VfConfigured", "MAC set", 3, ""});
  device.network_data = NetworkDeviceData{"", {}, mac};
  return device;
}

TEST(ClaimStatusApplyBody, HasTheApplyShape) {
  AllocatedDeviceStatus full = ReadyVf();
  full.share_id = "7c1d8f8e-6a51-4b43-9a27-3f7f0c4b5a11";
  full.conditions.push_back({"Healthy", "Unknown", "NotChecked", "", 3, "2026-01-01T00:00:00Z"});
  full.data = json{{"vlan", 100}};
  full.network_data = NetworkDeviceData{"eth1", {"10.0.0.5/24"}, "de:ad:00:00:be:ef"};
  AllocatedDeviceStatus bare;
  bare.driver = "vfio.dra.io";
  bare.pool = "node1";
  bare.device = "gpu-0000-65-00-0";
  bare.network_data = NetworkDeviceData{};  // all empty: left out

  const json body = ClaimStatusApplyBody(Target("resource.k8s.io/v1beta1"), {full, bare}, Nov25());
  const json expected = json::parse(R"({
    "apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim",
    "metadata": {"name": "sriov-claim", "namespace": "vms", "uid": "claim-uid-1"},
    "status": {"devices": [
      {"driver": "vfio.dra.io", "pool": "node1", "device": "vf-0000-3b-02-1",
       "shareID": "7c1d8f8e-6a51-4b43-9a27-3f7f0c4b5a11",
       "conditions": [
         {"type": "Ready", "status": "True", "reason": "VfConfigured", "message": "MAC set",
          "observedGeneration": 3, "lastTransitionTime": "2026-11-25T10:00:00Z"},
         {"type": "Healthy", "status": "Unknown", "reason": "NotChecked", "message": "",
          "observedGeneration": 3, "lastTransitionTime": "2026-01-01T00:00:00Z"}],
       "data": {"vlan": 100},
       "networkData": {"interfaceName": "eth1", "ips": ["10.0.0.5/24"],
                       "hardwareAddress": "de:ad:00:00:be:ef"}},
      {"driver": "vfio.dra.io", "pool": "node1", "device": "gpu-0000-65-00-0"}]}
  })");
  EXPECT_EQ(body, expected) << body.dump(2);
}

TEST(ClaimStatusApplyBody, DefaultsToV1AndTheCurrentTime) {
  ClaimStatusTarget target = Target("");
  const json body = ClaimStatusApplyBody(target, {ReadyVf()});
  EXPECT_EQ(body["apiVersion"], "resource.k8s.io/v1");
  EXPECT_EQ(body["status"]["devices"][0]["networkData"],
            json({{"hardwareAddress", "de:ad:00:00:be:ef"}}));
  const std::string time = body["status"]["devices"][0]["conditions"][0]["lastTransitionTime"];
  EXPECT_TRUE(std::regex_match(time, std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)"))) << time;
  EXPECT_GE(time, FormatRfc3339(system_clock::now() - std::chrono::minutes(1)));
}

TEST(ClaimStatusApplyBody, EmptySetIsAnEmptyList) {
  // An apply of no entries must still name status.devices, or the server would keep ours.
  const json body = ClaimStatusApplyBody(Target(), {}, Nov25());
  EXPECT_EQ(body["status"], json({{"devices", json::array()}}));
}

TEST(ClaimStatusApplyBody, FormatsUtcRfc3339) {
  EXPECT_EQ(FormatRfc3339(Nov25()), "2026-11-25T10:00:00Z");
  EXPECT_EQ(FormatRfc3339(Nov25() + std::chrono::milliseconds(999)), "2026-11-25T10:00:00Z");
}

TEST(ClaimStatusPath, UsesTheClaimsApiVersion) {
  EXPECT_EQ(ClaimStatusPath(Target("resource.k8s.io/v1beta1")).value(),
            "/apis/resource.k8s.io/v1beta1/namespaces/vms/resourceclaims/sriov-claim/status");
  EXPECT_EQ(ClaimStatusPath(Target("")).value(),
            "/apis/resource.k8s.io/v1/namespaces/vms/resourceclaims/sriov-claim/status");
  for (const char* bad : {"v1", "apps/v1", "resource.k8s.io/", "resource.k8s.io/v1/x"}) {
    auto path = ClaimStatusPath(Target(bad));
    ASSERT_FALSE(path.ok()) << bad;
    EXPECT_NE(path.error().message.find("ResourceClaim vms/sriov-claim"), std::string::npos);
  }
  ClaimStatusTarget unnamed = Target();
  unnamed.name.clear();
  EXPECT_FALSE(ClaimStatusPath(unnamed).ok());
}

void ExpectInvalid(const AllocatedDeviceStatus& device, const std::string& text) {
  Status status = ValidateAllocatedDeviceStatuses({device});
  ASSERT_FALSE(status.ok()) << text;
  EXPECT_EQ(status.error().kind, ErrorKind::kInvalidArgument);
  EXPECT_NE(status.error().message.find(text), std::string::npos) << status.error().message;
  EXPECT_NE(status.error().message.find("vfio.dra.io/node1/vf-0000-3b-02-1"), std::string::npos)
      << status.error().message;
}

TEST(ValidateAllocatedDeviceStatuses, EnforcesTheServersLimits) {
  EXPECT_TRUE(ValidateAllocatedDeviceStatuses({ReadyVf()}).ok());

  AllocatedDeviceStatus many = ReadyVf();
  many.conditions.clear();
  for (int i = 0; i < 9; ++i) {
    many.conditions.push_back({"C" + std::to_string(i), "True", "R", "", 0, ""});
  }
  ExpectInvalid(many, "9 conditions, the API server accepts at most 8");
  many.conditions.pop_back();
  EXPECT_TRUE(ValidateAllocatedDeviceStatuses({many}).ok());

  AllocatedDeviceStatus device = ReadyVf();
  device.conditions[0].status = "Yes";
  ExpectInvalid(device, "status \"Yes\" is not True, False or Unknown");
  device = ReadyVf();
  device.conditions[0].reason = "vf configured";
  ExpectInvalid(device, "reason \"vf configured\"");
  device.conditions[0].reason = "";
  ExpectInvalid(device, "reason \"\"");
  device = ReadyVf();
  device.conditions.push_back(device.conditions[0]);
  ExpectInvalid(device, "condition Ready: type is listed twice");

  device = ReadyVf();
  device.data = json::array({1});
  ExpectInvalid(device, "data must be a JSON object");
  device.data = json{{"blob", std::string(size_t{10} * 1024, 'x')}};
  ExpectInvalid(device, "data is larger than 10 KiB");

  device = ReadyVf(std::string(129, 'a'));
  ExpectInvalid(device, "networkData.hardwareAddress is longer than 128 bytes");
  EXPECT_TRUE(ValidateAllocatedDeviceStatuses({ReadyVf(std::string(128, 'a'))}).ok());
  device = ReadyVf();
  device.network_data->interface_name = std::string(257, 'i');
  ExpectInvalid(device, "networkData.interfaceName is longer than 256 bytes");
  device = ReadyVf();
  for (int i = 0; i < 17; ++i) {
    device.network_data->ips.push_back("10.0.0." + std::to_string(i) + "/24");
  }
  ExpectInvalid(device, "networkData.ips has 17 entries, at most 16");
  device = ReadyVf();
  device.network_data->ips = {"10.0.0.1/24", "10.0.0.1/24"};
  ExpectInvalid(device, "networkData.ips lists 10.0.0.1/24 twice");

  device = ReadyVf();
  device.pool.clear();
  EXPECT_FALSE(ValidateAllocatedDeviceStatuses({device}).ok());
  Status twice = ValidateAllocatedDeviceStatuses({ReadyVf(), ReadyVf()});
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.error().message.find("is listed twice"), std::string::npos);
  AllocatedDeviceStatus shared = ReadyVf();
  shared.share_id = "a";
  EXPECT_TRUE(ValidateAllocatedDeviceStatuses({ReadyVf(), shared}).ok());  // another key
}

// Answers from a script and records what it was sent.
class ScriptedTransport final : public HttpTransport {
 public:
  void Respond(int status, std::string body) { script_.push_back({status, {}, std::move(body)}); }
  Result<HttpResponse> Send(const HttpRequest& request) override {
    sent.push_back(request);
    if (script_.empty()) return MakeError(ErrorKind::kInternal, "script exhausted");
    HttpResponse next = script_.front();
    script_.pop_front();
    return next;
  }
  Result<HttpResponse> Stream(const HttpRequest& request, const BodyChunkHandler&,
                              std::stop_token) override {
    return Send(request);
  }
  std::vector<HttpRequest> sent;

 private:
  std::deque<HttpResponse> script_;
};

std::string StatusJson(int code, const std::string& reason, const std::string& message,
                       const std::string& details_kind = "") {
  json status = {{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Failure"},
                 {"code", code},     {"reason", reason},   {"message", message}};
  if (!details_kind.empty()) status["details"] = {{"kind", details_kind}, {"name", "sriov-claim"}};
  return status.dump();
}

class ApiClaimStatusWriterTest : public ::testing::Test {
 protected:
  ApiClaimStatusWriterTest() {
    ApiClientOptions options;
    options.qps = 0;
    options.max_retries = 0;
    client_ = std::make_unique<ApiClient>(transport_, tokens_, clock_, Logger::Discard(), options);
    versions_ = std::make_unique<ResourceApiVersions>(*client_);
    writer_ = std::make_unique<ApiClaimStatusWriter>(*client_, *versions_, "vfio.dra.io");
  }
  Status Apply(const std::vector<AllocatedDeviceStatus>& devices,
               const ClaimStatusTarget& target = Target()) {
    return writer_->Apply(target, devices, Deadline());
  }

  testing::FakeClock clock_;
  TokenSource tokens_{"", "", clock_};
  ScriptedTransport transport_;
  std::unique_ptr<ApiClient> client_;
  std::unique_ptr<ResourceApiVersions> versions_;
  std::unique_ptr<ApiClaimStatusWriter> writer_;
};

// A claim read in v1beta2 is written in v1beta2 while the server (discovery first) still serves it.
TEST_F(ApiClaimStatusWriterTest, SendsAForcedApplyOfTheStatusSubresource) {
  transport_.Respond(200, R"({"versions": [{"version": "v1"}, {"version": "v1beta2"}]})");
  transport_.Respond(200, R"({"kind": "ResourceClaim"})");
  Status status = Apply({ReadyVf()}, Target("resource.k8s.io/v1beta2"));
  ASSERT_TRUE(status.ok()) << status.error().message;
  ASSERT_EQ(transport_.sent.size(), 2u);
  EXPECT_EQ(transport_.sent[0].path_and_query, "/apis/resource.k8s.io");
  const HttpRequest& request = transport_.sent[1];
  EXPECT_EQ(request.method, "PATCH");
  EXPECT_EQ(request.path_and_query,
            "/apis/resource.k8s.io/v1beta2/namespaces/vms/resourceclaims/sriov-claim/status"
            "?fieldManager=vfio.dra.io&force=true");
  EXPECT_EQ(request.headers.at("Content-Type"), "application/apply-patch+yaml");
  const json body = json::parse(request.body);
  EXPECT_EQ(body["apiVersion"], "resource.k8s.io/v1beta2");
  EXPECT_EQ(body["metadata"]["uid"], "claim-uid-1");
  EXPECT_EQ(body["status"]["devices"][0]["networkData"]["hardwareAddress"], "de:ad:00:00:be:ef");
}

TEST_F(ApiClaimStatusWriterTest, RefusesWhatItMustNotSend) {
  AllocatedDeviceStatus other = ReadyVf();
  other.driver = "sriov.example.com";
  Status status = Apply({other});
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().kind, ErrorKind::kInvalidArgument);
  EXPECT_NE(status.error().message.find("is not of driver vfio.dra.io"), std::string::npos);

  ClaimStatusTarget no_uid = Target();
  no_uid.uid.clear();
  status = Apply({ReadyVf()}, no_uid);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("uid is unknown"), std::string::npos);

  status = Apply({ReadyVf(std::string(200, 'a'))});
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("cannot write status.devices of ResourceClaim vms/"),
            std::string::npos);
  EXPECT_TRUE(transport_.sent.empty());
}

TEST_F(ApiClaimStatusWriterTest, GoneOrReplacedClaimIsNotFound) {
  transport_.Respond(
      404, StatusJson(404, "NotFound", "resourceclaims.resource.k8s.io \"sriov-claim\" not found",
                      "resourceclaims"));
  Status gone = Apply({ReadyVf()});
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.error().kind, ErrorKind::kNotFound);
  EXPECT_NE(gone.error().message.find("no longer exists"), std::string::npos);

  transport_.Respond(409, StatusJson(409, "Conflict",
                                     "Operation cannot be fulfilled on resourceclaims: "
                                     "Precondition failed: UID in precondition: claim-uid-1"));
  Status replaced = Apply({ReadyVf()});
  ASSERT_FALSE(replaced.ok());
  EXPECT_EQ(replaced.error().kind, ErrorKind::kNotFound);
  EXPECT_NE(replaced.error().message.find("was replaced (its uid is no longer claim-uid-1)"),
            std::string::npos)
      << replaced.error().message;

  transport_.Respond(404, "404 page not found\n");
  Status unserved = Apply({ReadyVf()});
  ASSERT_FALSE(unserved.ok());
  EXPECT_EQ(unserved.error().kind, ErrorKind::kFailedPrecondition);
  EXPECT_NE(unserved.error().message.find("does not serve"), std::string::npos);
}

TEST_F(ApiClaimStatusWriterTest, CarriesTheServersMessage) {
  transport_.Respond(403, StatusJson(403, "Forbidden",
                                     "resourceclaims.resource.k8s.io \"sriov-claim\" is "
                                     "forbidden: cannot patch resource \"resourceclaims/status\""));
  Status forbidden = Apply({ReadyVf()});
  ASSERT_FALSE(forbidden.ok());
  EXPECT_EQ(forbidden.error().kind, ErrorKind::kPermissionDenied);
  EXPECT_NE(forbidden.error().message.find("cannot patch resource \"resourceclaims/status\""),
            std::string::npos);
  EXPECT_NE(forbidden.error().message.find("needs patch on resourceclaims/status"),
            std::string::npos)
      << forbidden.error().message;

  transport_.Respond(422, StatusJson(422, "Invalid",
                                     "ResourceClaim.resource.k8s.io \"sriov-claim\" is invalid: "
                                     "status.devices[0]: must be an allocated device"));
  Status invalid = Apply({ReadyVf()});
  ASSERT_FALSE(invalid.ok());
  EXPECT_EQ(invalid.error().kind, ErrorKind::kInvalidArgument);
  EXPECT_NE(invalid.error().message.find("must be an allocated device"), std::string::npos);

  transport_.Respond(500, "<html>proxy error</html>");  // not JSON: carried, never a crash
  Status broken = Apply({ReadyVf()});
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.error().message.find("proxy error"), std::string::npos);
}

TEST_F(ApiClaimStatusWriterTest, AResourceVersionIsSentAsAPreconditionAndItsFailureIsAConflict) {
  transport_.Respond(409, StatusJson(409, "Conflict",
                                     "Operation cannot be fulfilled on resourceclaims: the object "
                                     "has been modified"));
  ClaimStatusTarget as_read = Target();
  as_read.resource_version = "417";
  Status status = Apply({ReadyVf()}, as_read);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().kind, ErrorKind::kConflict);
  EXPECT_NE(status.error().message.find("changed since resourceVersion 417"), std::string::npos)
      << status.error().message;
  ASSERT_EQ(transport_.sent.size(), 1u);
  EXPECT_EQ(json::parse(transport_.sent[0].body)["metadata"]["resourceVersion"], "417");
}

// A claim whose version is not known (or no longer served) is read in the newest one served;
// the reading has the claim's resourceVersion and this driver's entries only.
TEST_F(ApiClaimStatusWriterTest, ReadFindsAServedVersionAndOurEntries) {
  transport_.Respond(404, "404 page not found\n");
  transport_.Respond(200, R"({"kind": "APIGroup", "versions": [{"version": "v1beta2"}]})");
  json claim = {
      {"apiVersion", "resource.k8s.io/v1beta2"},
      {"kind", "ResourceClaim"},
      {"metadata", {{"name", "sriov-claim"}, {"uid", "claim-uid-1"}, {"resourceVersion", "88"}}},
      {"status",
       {{"devices",
         {ClaimStatusApplyBody(Target(), {ReadyVf()}, Nov25())["status"]["devices"][0],
          {{"driver", "sriov.example.com"}, {"pool", "node1"}, {"device", "eth1"}}}}}}};
  transport_.Respond(200, claim.dump());
  auto reading = writer_->Read(Target(""), Deadline());
  ASSERT_TRUE(reading.ok()) << reading.error().message;
  EXPECT_EQ(reading->api_version, "resource.k8s.io/v1beta2");
  EXPECT_EQ(reading->resource_version, "88");
  AllocatedDeviceStatus ours = ReadyVf();
  ours.conditions[0].last_transition_time = "2026-11-25T10:00:00Z";
  EXPECT_TRUE(SameDeviceStatuses(reading->ours, {ours}));
  ASSERT_EQ(transport_.sent.size(), 3u);
  EXPECT_EQ(transport_.sent[0].path_and_query,
            "/apis/resource.k8s.io/v1/namespaces/vms/resourceclaims/sriov-claim");
  EXPECT_EQ(transport_.sent[1].path_and_query, "/apis/resource.k8s.io");
  EXPECT_EQ(transport_.sent[2].path_and_query,
            "/apis/resource.k8s.io/v1beta2/namespaces/vms/resourceclaims/sriov-claim");

  claim["metadata"]["uid"] = "claim-uid-2";  // re-created under the name
  transport_.Respond(200, claim.dump());
  auto replaced = writer_->Read(Target("resource.k8s.io/v1beta2"), Deadline());
  ASSERT_FALSE(replaced.ok());
  EXPECT_EQ(replaced.error().kind, ErrorKind::kNotFound);
}

// A writer for the queue's worker that stands in for one claim on the server: it records what it
// is asked to read and apply, answers applies from a script (then as the claim would), and can
// hold an apply in flight until the test lets it go. An apply whose precondition is not the
// claim's resourceVersion is a conflict; one that lands replaces the entries and bumps it.
class ScriptedStatusWriter final : public ClaimStatusWriter {
 public:
  Status Apply(const ClaimStatusTarget& claim, const std::vector<AllocatedDeviceStatus>& devices,
               Deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    calls_.push_back(devices);
    targets_.push_back(claim);
    changed_.notify_all();
    changed_.wait(lock, [&] { return !hold_; });
    if (!answers_.empty()) {
      Status answer = answers_.front();
      answers_.pop_front();
      if (!answer.ok()) return answer;
    }
    if (!claim.resource_version.empty() && claim.resource_version != std::to_string(rv_)) {
      return MakeError(ErrorKind::kConflict, "the claim changed since " + claim.resource_version);
    }
    entries_ = devices;
    ++rv_;
    return Status::Ok();
  }
  Result<ClaimStatusReading> Read(const ClaimStatusTarget& claim, Deadline) override {
    std::lock_guard<std::mutex> lock(mu_);
    reads_.push_back(claim);
    return ClaimStatusReading{claim.api_version.empty() ? "resource.k8s.io/v1" : claim.api_version,
                              std::to_string(rv_), entries_};
  }
  void Answer(Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    answers_.push_back(std::move(status));
  }
  void Hold(bool hold) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = hold;
    changed_.notify_all();
  }
  // Another writer changes the claim (its own entries: ours stay as they are).
  void ChangeClaim() {
    std::lock_guard<std::mutex> lock(mu_);
    ++rv_;
  }
  // Another instance of this driver replaces our entries.
  void ReplaceEntries(std::vector<AllocatedDeviceStatus> entries) {
    std::lock_guard<std::mutex> lock(mu_);
    entries_ = std::move(entries);
    ++rv_;
  }
  std::string ResourceVersion() const {
    std::lock_guard<std::mutex> lock(mu_);
    return std::to_string(rv_);
  }
  bool WaitForCalls(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, std::chrono::seconds(60), [&] { return calls_.size() >= n; });
  }
  std::vector<std::vector<AllocatedDeviceStatus>> calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  std::vector<ClaimStatusTarget> targets() const {
    std::lock_guard<std::mutex> lock(mu_);
    return targets_;
  }
  std::vector<ClaimStatusTarget> reads() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reads_;
  }
  std::vector<AllocatedDeviceStatus> entries() const {
    std::lock_guard<std::mutex> lock(mu_);
    return entries_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Status> answers_;
  bool hold_ = false;
  std::vector<std::vector<AllocatedDeviceStatus>> calls_;
  std::vector<ClaimStatusTarget> targets_;
  std::vector<ClaimStatusTarget> reads_;
  std::vector<AllocatedDeviceStatus> entries_;
  long long rv_ = 10;
};

class ClaimStatusQueueTest : public ::testing::Test {
 protected:
  ClaimStatusQueueTest() {
    ClaimStatusQueueOptions options;
    options.jitter_seed = 7;
    queue_ = std::make_unique<ClaimStatusQueue>(writer_, clock_, Logger::Discard(), options);
  }
  void Settle() { ASSERT_TRUE(queue_->WaitUntilSettled(std::chrono::seconds(60))); }
  // How long the worker waits for the next retry.
  std::chrono::milliseconds NextRetryIn() const {
    const auto waits = clock_.waiting_until();
    if (waits.size() != 1) return std::chrono::milliseconds(-1);
    return std::chrono::duration_cast<std::chrono::milliseconds>(waits[0] - clock_.Now());
  }
  static Status Unavailable() {
    return MakeError(ErrorKind::kUnavailable, "PATCH .../status: HTTP 503");
  }

  testing::FakeClock clock_;
  ScriptedStatusWriter writer_;
  std::unique_ptr<ClaimStatusQueue> queue_;
};

TEST_F(ClaimStatusQueueTest, AFailedWriteIsRetriedWithGrowingBackOffUntilItLands) {
  writer_.Answer(Unavailable());
  writer_.Answer(Unavailable());
  queue_->Submit(Target(), {ReadyVf()});
  Settle();
  EXPECT_EQ(writer_.calls().size(), 1u);
  EXPECT_EQ(queue_->Stats().pending, 1u);
  const auto first = NextRetryIn();
  EXPECT_GE(first, std::chrono::milliseconds(800));
  EXPECT_LE(first, std::chrono::milliseconds(1200));
  clock_.Advance(first);
  ASSERT_TRUE(writer_.WaitForCalls(2));
  Settle();
  const auto second = NextRetryIn();
  EXPECT_GE(second, std::chrono::milliseconds(1600));
  EXPECT_LE(second, std::chrono::milliseconds(2400));
  clock_.Advance(second);
  ASSERT_TRUE(writer_.WaitForCalls(3));
  Settle();
  const ClaimStatusQueueStats stats = queue_->Stats();
  EXPECT_EQ(stats.pending, 0u);
  EXPECT_EQ(stats.written, 1u);
  EXPECT_EQ(stats.failed, 2u);
  EXPECT_TRUE(queue_->MayHaveWritten("claim-uid-1"));
  EXPECT_TRUE(clock_.waiting_until().empty());
}

TEST_F(ClaimStatusQueueTest, AClaimThatIsGoneEndsItsWrite) {
  writer_.Answer(MakeError(ErrorKind::kNotFound, "the claim no longer exists"));
  queue_->Submit(Target(), {ReadyVf()});
  Settle();
  EXPECT_EQ(queue_->Stats().pending, 0u);
  EXPECT_EQ(queue_->Stats().given_up, 1u);
  clock_.Advance(std::chrono::hours(1));
  Settle();
  EXPECT_EQ(writer_.calls().size(), 1u);
}

// An unprepare's clearing replaces a pending write; the write in flight meanwhile fails and is
// not retried after the clearing (which would put the stale entry back).
TEST_F(ClaimStatusQueueTest, AClearingIsNeverOvertakenByAStaleRetry) {
  queue_->Submit(Target(), {ReadyVf()});
  ASSERT_TRUE(writer_.WaitForCalls(1));
  Settle();
  writer_.Hold(true);
  writer_.Answer(Unavailable());
  queue_->Submit(Target(), {ReadyVf("02:00:00:00:00:02")});
  ASSERT_TRUE(writer_.WaitForCalls(2));  // in flight
  queue_->Submit(Target(""), {});        // the unprepare
  writer_.Hold(false);
  ASSERT_TRUE(writer_.WaitForCalls(3));
  Settle();
  clock_.Advance(std::chrono::hours(1));
  Settle();
  const auto calls = writer_.calls();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[1].size(), 1u);
  EXPECT_TRUE(calls[2].empty());
  EXPECT_TRUE(writer_.entries().empty());
  EXPECT_EQ(queue_->Stats().pending, 0u);
  EXPECT_FALSE(queue_->MayHaveWritten("claim-uid-1"));
}

// A clearing knows no API version (an unprepare has no claim read): it keeps the version of the
// write it replaces, which may be one the server alone serves.
TEST_F(ClaimStatusQueueTest, AClearingKeepsTheApiVersionOfTheWriteItReplaces) {
  writer_.Hold(true);
  writer_.Answer(Unavailable());
  queue_->Submit(Target("resource.k8s.io/v1beta2"), {ReadyVf()});
  ASSERT_TRUE(writer_.WaitForCalls(1));  // in flight
  queue_->Submit(Target(""), {});
  writer_.Hold(false);
  Settle();
  const auto reads = writer_.reads();
  ASSERT_FALSE(reads.empty());
  EXPECT_EQ(reads.back().api_version, "resource.k8s.io/v1beta2");
  for (const ClaimStatusTarget& target : writer_.targets()) {
    EXPECT_EQ(target.api_version, "resource.k8s.io/v1beta2");
  }
  EXPECT_EQ(queue_->Stats().pending, 0u);
  EXPECT_EQ(queue_->Stats().given_up, 0u);
}

// A write carries the claim's resourceVersion as read for the decision; when the claim changed
// since (here another driver's write), it reads the claim again and decides again at once.
TEST_F(ClaimStatusQueueTest, AConflictReadsTheClaimAgainAndDecidesAgain) {
  ClaimStatusTarget as_read = Target();
  as_read.resource_version = writer_.ResourceVersion();
  writer_.ChangeClaim();
  queue_->Submit(as_read, {ReadyVf()});
  ASSERT_TRUE(writer_.WaitForCalls(2));
  Settle();
  const auto targets = writer_.targets();
  ASSERT_EQ(targets.size(), 2u);
  EXPECT_EQ(targets[0].resource_version, as_read.resource_version);
  EXPECT_NE(targets[1].resource_version, as_read.resource_version);
  EXPECT_EQ(writer_.reads().size(), 1u);
  ASSERT_EQ(writer_.entries().size(), 1u);
  EXPECT_EQ(queue_->Stats().written, 1u);
  EXPECT_EQ(queue_->Stats().failed, 0u);
}

// The older instance of a rolling update retries a prepare's status after the newer one
// unprepared the claim and cleared ours: the retry is not wanted any more and is dropped, so the
// cleared status stays cleared.
TEST_F(ClaimStatusQueueTest, ARetryTheNodeNoLongerWantsNeverPutsBackAClearedStatus) {
  queue_->Submit(Target(), {ReadyVf()});
  Settle();
  ASSERT_EQ(writer_.entries().size(), 1u);
  std::atomic<bool> prepared = true;
  writer_.Answer(Unavailable());
  queue_->Submit(Target(), {ReadyVf("02:00:00:00:00:02")}, [&] { return prepared.load(); });
  Settle();
  ASSERT_EQ(queue_->Stats().pending, 1u);  // waits for its retry
  // The other instance unprepares the claim and clears its entries.
  prepared = false;
  writer_.ReplaceEntries({});
  clock_.Advance(std::chrono::minutes(5));
  Settle();
  EXPECT_TRUE(writer_.entries().empty());
  EXPECT_EQ(writer_.calls().size(), 2u);
  EXPECT_EQ(queue_->Stats().pending, 0u);
  EXPECT_EQ(queue_->Stats().given_up, 1u);
}

TEST_F(ClaimStatusQueueTest, AConditionKeepsItsTransitionTimeUntilItsStatusChanges) {
  writer_.Hold(true);
  AllocatedDeviceStatus ready = ReadyVf();
  ready.conditions[0].last_transition_time = "2026-01-01T00:00:00Z";
  queue_->Submit(Target(), {ready});
  ASSERT_TRUE(writer_.WaitForCalls(1));
  ready.conditions[0].last_transition_time.clear();
  queue_->Submit(Target(), {ready});  // the same status again: the earlier time stays
  AllocatedDeviceStatus not_ready = ReadyVf();
  writer_.Hold(false);
  Settle();
  // The claim already shows the same: no second write.
  EXPECT_EQ(writer_.calls().size(), 1u);
  ASSERT_EQ(writer_.entries().at(0).conditions.at(0).last_transition_time, "2026-01-01T00:00:00Z");
  not_ready.conditions[0].status = "False";
  writer_.Hold(true);
  queue_->Submit(Target(), {not_ready});
  ASSERT_TRUE(writer_.WaitForCalls(2));
  queue_->Submit(Target(), {ready});  // True again: a transition, a new time
  writer_.Hold(false);
  ASSERT_TRUE(writer_.WaitForCalls(3));
  Settle();
  const auto calls = writer_.calls();
  EXPECT_NE(calls[1].at(0).conditions.at(0).last_transition_time, "2026-01-01T00:00:00Z");
  EXPECT_NE(calls[2].at(0).conditions.at(0).last_transition_time, "2026-01-01T00:00:00Z");
}

TEST_F(ClaimStatusQueueTest, StopEndsTheWorkerWaitingForARetryAndDropsThePendingWrite) {
  writer_.Answer(Unavailable());
  queue_->Submit(Target(), {ReadyVf()});
  Settle();
  ASSERT_EQ(clock_.waiting_until().size(), 1u);
  queue_->Stop();  // returns: the wait for the retry ends at once
  EXPECT_EQ(queue_->Stats().pending, 0u);
  queue_->Submit(Target(), {ReadyVf()});  // ignored once stopped
  EXPECT_EQ(queue_->Stats().pending, 0u);
  EXPECT_EQ(writer_.calls().size(), 1u);
}

}  // namespace
}  // namespace vfio_dra::kube
