#include "plugin/node_service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

namespace vfio_dra::plugin {
namespace {

using ::testing::HasSubstr;

constexpr const char* kDriver = "vfio.dra.io";

class FakeClaims final : public ClaimSource {
 public:
  void Add(kube::ResourceClaim claim) {
    std::lock_guard<std::mutex> lock(mu_);
    claims_[claim.namespace_ + "/" + claim.name] = std::move(claim);
  }
  Result<kube::ResourceClaim> Get(const std::string& ns, const std::string& name,
                                  Deadline /*deadline*/) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = claims_.find(ns + "/" + name);
    if (it == claims_.end()) {
      return MakeError(ErrorKind::kNotFound, "ResourceClaim " + ns + "/" + name + " not found");
    }
    return it->second;
  }

 private:
  std::mutex mu_;
  std::map<std::string, kube::ResourceClaim> claims_;
};

// Prepares every result as one device and checks that calls never overlap.
class RecordingPreparer final : public prepare::DevicePreparer {
 public:
  Result<std::vector<prepare::PreparedDevice>> Prepare(
      const kube::ResourceClaim& claim,
      const std::vector<kube::DeviceRequestAllocationResult>& ours,
      Deadline /*deadline*/) override {
    if (in_call_.exchange(true)) overlapped_ = true;
    std::vector<prepare::PreparedDevice> out;
    for (const auto& r : ours) {
      if (r.driver != kDriver) foreign_results_seen_ = true;
      out.push_back(
          prepare::PreparedDevice{{r.request},
                                  r.pool,
                                  r.device,
                                  {std::string(kDriver) + "/vfio=" + claim.uid + "-" + r.device},
                                  std::nullopt});
    }
    ++prepares_;
    in_call_ = false;
    return out;
  }
  Status Unprepare(const prepare::ClaimRef& /*claim*/, Deadline /*deadline*/) override {
    if (in_call_.exchange(true)) overlapped_ = true;
    ++unprepares_;
    in_call_ = false;
    return Status::Ok();
  }
  std::atomic<bool> in_call_{false};
  std::atomic<bool> overlapped_{false};
  std::atomic<bool> foreign_results_seen_{false};
  std::atomic<int> prepares_{0};
  std::atomic<int> unprepares_{0};
};

kube::ResourceClaim Claim(const std::string& name, const std::string& uid,
                          std::vector<kube::DeviceRequestAllocationResult> results,
                          bool allocated = true) {
  kube::ResourceClaim claim;
  claim.namespace_ = "vms";
  claim.name = name;
  claim.uid = uid;
  if (allocated) claim.allocation = kube::AllocationResult{std::move(results), {}};
  return claim;
}

kube::DeviceRequestAllocationResult Alloc(const std::string& request, const std::string& driver,
                                          const std::string& device) {
  return kube::DeviceRequestAllocationResult{request, driver, "node1", device, std::nullopt, false};
}

class NodeServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vfio-dra-node-XXXXXX";
    dir_ = mkdtemp(tmpl);
    serializer_ = CallSerializer::Open(dir_ + "/serialize.lock").value();
    service_ = std::make_unique<DraNodeService>(kDriver, claims_, preparer_, serializer_.get(),
                                                Logger::Discard());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
  FakeClaims claims_;
  RecordingPreparer preparer_;
  std::unique_ptr<CallSerializer> serializer_;
  std::unique_ptr<DraNodeService> service_;
};

TEST_F(NodeServiceTest, AnswersEveryClaimWithPerClaimErrors) {
  claims_.Add(Claim("good", "u-good", {Alloc("gpu", kDriver, "gpu-0")}));
  claims_.Add(Claim("replaced", "u-new", {Alloc("gpu", kDriver, "gpu-1")}));
  claims_.Add(Claim("pending", "u-pending", {}, /*allocated=*/false));
  auto out = service_->Prepare({{"vms", "good", "u-good"},
                                {"vms", "replaced", "u-old"},
                                {"vms", "pending", "u-pending"},
                                {"vms", "missing", "u-missing"}});
  ASSERT_TRUE(out.ok());
  ASSERT_EQ(out->size(), 4u);
  EXPECT_EQ(out->at("u-good").error, "");
  ASSERT_EQ(out->at("u-good").devices.size(), 1u);
  EXPECT_NE(out->at("u-old").error.find("vms/replaced"), std::string::npos);
  EXPECT_NE(out->at("u-old").error.find("was replaced"), std::string::npos);
  EXPECT_NE(out->at("u-pending").error.find("not allocated"), std::string::npos);
  EXPECT_NE(out->at("u-missing").error.find("vms/missing"), std::string::npos);
  EXPECT_NE(out->at("u-missing").error.find("not found"), std::string::npos);
}

TEST_F(NodeServiceTest, HandsOnlyOurDriversResultsAndStripsSubrequests) {
  claims_.Add(Claim("mixed", "u-1",
                    {Alloc("gpu/large", kDriver, "gpu-0"), Alloc("nic", "other.io", "nic-0")}));
  auto out = service_->Prepare({{"vms", "mixed", "u-1"}});
  ASSERT_TRUE(out.ok());
  const auto& result = out->at("u-1");
  ASSERT_EQ(result.error, "");
  ASSERT_EQ(result.devices.size(), 1u);
  EXPECT_EQ(result.devices[0].request_names, std::vector<std::string>{"gpu"});
  EXPECT_FALSE(preparer_.foreign_results_seen_);
}

TEST_F(NodeServiceTest, ClaimOfAnotherDriverSucceedsWithoutDeviceWork) {
  claims_.Add(Claim("theirs", "u-2", {Alloc("nic", "other.io", "nic-0")}));
  auto out = service_->Prepare({{"vms", "theirs", "u-2"}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->at("u-2").error, "");
  EXPECT_TRUE(out->at("u-2").devices.empty());
  EXPECT_EQ(preparer_.prepares_, 0);
}

TEST_F(NodeServiceTest, MalformedRequestsAreWholeCallErrors) {
  auto empty_uid = service_->Prepare({{"vms", "a", ""}});
  ASSERT_FALSE(empty_uid.ok());
  EXPECT_NE(empty_uid.error().message.find("empty uid"), std::string::npos);
  auto duplicate = service_->Unprepare({{"vms", "a", "u"}, {"vms", "b", "u"}});
  ASSERT_FALSE(duplicate.ok());
  EXPECT_NE(duplicate.error().message.find("more than once"), std::string::npos);
  std::vector<prepare::ClaimRef> many;
  for (int i = 0; i < 10000; ++i) many.push_back({"vms", "c", "u-" + std::to_string(i)});
  auto too_many = service_->Prepare(many);
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.error().message.find("10000 claims"), std::string::npos);
  EXPECT_EQ(preparer_.prepares_, 0);
}

TEST_F(NodeServiceTest, BadNamesAreRefusedPerClaimWithoutAnyLookup) {
  const std::vector<prepare::ClaimRef> bad = {
      {"vms", "a/b", "u-1"},  {"vms", "..", "u-2"},
      {"../etc", "a", "u-3"}, {"vms", std::string("a\0b", 3), "u-4"},
      {"vms", "ok", "u/5"},   {"vms", std::string(300, 'a'), "u-6"}};
  auto out = service_->Prepare(bad);
  ASSERT_TRUE(out.ok());
  ASSERT_EQ(out->size(), bad.size());
  for (const auto& [uid, result] : *out) {
    EXPECT_NE(result.error.find("invalid"), std::string::npos) << uid << ": " << result.error;
    EXPECT_EQ(result.error.find('\0'), std::string::npos);
  }
  EXPECT_NE(out->at("u-4").error.find("a\\x00b"), std::string::npos);
  auto unprep = service_->Unprepare(bad);
  ASSERT_TRUE(unprep.ok());
  EXPECT_EQ(unprep->size(), bad.size());
  EXPECT_EQ(preparer_.unprepares_, 0);
}

TEST_F(NodeServiceTest, UnprepareAnswersEveryClaimEvenWhenTheClaimIsGone) {
  auto out = service_->Unprepare({{"vms", "gone", "u-9"}, {"vms", "also-gone", "u-10"}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->size(), 2u);
  EXPECT_EQ(out->at("u-9").error, "");
  EXPECT_EQ(preparer_.unprepares_, 2);
}

TEST_F(NodeServiceTest, ConcurrentCallsNeverOverlapInDeviceWork) {
  for (int i = 0; i < 32; ++i) {
    claims_.Add(Claim("c" + std::to_string(i), "u" + std::to_string(i),
                      {Alloc("gpu", kDriver, "gpu-" + std::to_string(i))}));
  }
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < 32; ++i) {
    threads.emplace_back([&, i] {
      const prepare::ClaimRef ref{"vms", "c" + std::to_string(i), "u" + std::to_string(i)};
      auto prepared = service_->Prepare({ref});
      if (!prepared.ok() || !prepared->at(ref.uid).error.empty()) ++failures;
      auto unprepared = service_->Unprepare({ref});
      if (!unprepared.ok() || !unprepared->at(ref.uid).error.empty()) ++failures;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(preparer_.prepares_, 32);
  EXPECT_EQ(preparer_.unprepares_, 32);
  EXPECT_FALSE(preparer_.overlapped_);
}

// The other instance of a rolling update holds the node lock (its own lock file description): a
// call waits for it only until the kubelet's deadline, then answers every claim with an error
// instead of blocking the kubelet, and no device work runs without the lock.
TEST_F(NodeServiceTest, AWaitForTheNodeLockEndsAtTheKubeletsDeadline) {
  claims_.Add(Claim("good", "u-good", {Alloc("gpu", kDriver, "gpu-0")}));
  auto other_instance = CallSerializer::Open(dir_ + "/serialize.lock");
  ASSERT_TRUE(other_instance.ok());
  auto held = (*other_instance)->Acquire();
  ASSERT_TRUE(held.ok()) << held.error().message;
  auto out = service_->Prepare({{"vms", "good", "u-good"}},
                               Deadline::After(std::chrono::milliseconds(300)));
  ASSERT_TRUE(out.ok());
  EXPECT_THAT(out->at("u-good").error, HasSubstr("for the node lock"));
  EXPECT_THAT(out->at("u-good").error, HasSubstr("vms/good"));
  auto un = service_->Unprepare({{"vms", "good", "u-good"}},
                                Deadline::After(std::chrono::milliseconds(300)));
  ASSERT_TRUE(un.ok());
  EXPECT_THAT(un->at("u-good").error, HasSubstr("not unprepared"));
  EXPECT_EQ(preparer_.prepares_, 0);
  EXPECT_EQ(preparer_.unprepares_, 0);
}

TEST_F(NodeServiceTest, ClaimsWhoseTurnComesAfterTheDeadlineAreNotStarted) {
  claims_.Add(Claim("a", "u-a", {Alloc("gpu", kDriver, "gpu-0")}));
  claims_.Add(Claim("b", "u-b", {Alloc("gpu", kDriver, "gpu-1")}));
  const Deadline passed(std::chrono::steady_clock::now() - std::chrono::seconds(1));
  auto out = service_->Prepare({{"vms", "a", "u-a"}, {"vms", "b", "u-b"}}, passed);
  ASSERT_TRUE(out.ok());
  ASSERT_EQ(out->size(), 2u) << "every claim still gets an answer";
  EXPECT_THAT(out->at("u-a").error, HasSubstr("deadline"));
  EXPECT_THAT(out->at("u-b").error, HasSubstr("vms/b"));
  auto un = service_->Unprepare({{"vms", "a", "u-a"}}, passed);
  ASSERT_TRUE(un.ok());
  EXPECT_THAT(un->at("u-a").error, HasSubstr("deadline"));
  EXPECT_EQ(preparer_.prepares_, 0);
  EXPECT_EQ(preparer_.unprepares_, 0);
}

}  // namespace
}  // namespace vfio_dra::plugin
