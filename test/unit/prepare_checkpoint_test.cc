#include "plugin/prepare_checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace vfio_dra::plugin {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

class PrepareCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vfio-dra-ckpt-XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/checkpoint.json";
  }
  void TearDown() override { fs::remove_all(dir_); }
  size_t Entries() {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++n;
    return n;
  }
  std::string dir_, path_;
};

ClaimRecord Started() {
  ClaimRecord r;
  r.uid = "5d7e1c0a-0000-4000-8000-000000000001";
  r.namespace_ = "vms";
  r.name = "gpu-claim";
  r.functions = {{"0000:3b:00.0", "nvidia", "", false},
                 {"0000:3b:00.1", "snd_hda_intel", "", false}};
  r.mdevs = {{"0000:af:00.0", "nvidia-222", "4b20d080-1b54-4048-85b3-a6a62d165c01", true}};
  r.cdi_files = {"vfio.dra.io-vfio_5d7e1c0a-0000-4000-8000-000000000001.json"};
  return r;
}

TEST_F(PrepareCheckpointTest, TwoPhasesSurviveARestart) {
  std::string problem;
  auto checkpoint = PrepareCheckpoint::Load(path_, "boot-1", &problem);
  ASSERT_TRUE(checkpoint.ok());
  EXPECT_TRUE(checkpoint->claims().empty());
  ClaimRecord record = Started();
  ASSERT_TRUE(checkpoint->Put(record).ok());
  auto reloaded = PrepareCheckpoint::Load(path_, "boot-1", &problem);
  ASSERT_TRUE(reloaded.ok());
  ASSERT_NE(reloaded->Find(record.uid), nullptr);
  EXPECT_EQ(*reloaded->Find(record.uid), record);
  EXPECT_EQ(reloaded->Find(record.uid)->state, PrepareState::kPrepareStarted);

  record.state = PrepareState::kPrepareCompleted;
  record.response = nlohmann::json::array({{{"deviceName", "gpu-0000-3b-00-0"}}});
  ASSERT_TRUE(reloaded->Put(record).ok());
  auto again = PrepareCheckpoint::Load(path_, "boot-1", &problem);
  EXPECT_EQ(again->Find(record.uid)->state, PrepareState::kPrepareCompleted);
  EXPECT_EQ(again->Find(record.uid)->response, record.response);
  EXPECT_FALSE(again->WrittenBeforeReboot());
  EXPECT_TRUE(problem.empty());

  struct stat st {};
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(Entries(), 1u);  // no temporary files left

  ASSERT_TRUE(again->Remove(record.uid).ok());
  EXPECT_TRUE(again->Remove(record.uid).ok());
  EXPECT_TRUE(PrepareCheckpoint::Load(path_, "boot-1", &problem)->claims().empty());
}

TEST_F(PrepareCheckpointTest, ARebootIsNoticed) {
  std::string problem;
  auto before = PrepareCheckpoint::Load(path_, "boot-1", &problem);
  ASSERT_TRUE(before->Put(Started()).ok());
  auto after = PrepareCheckpoint::Load(path_, "boot-2", &problem);
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(after->WrittenBeforeReboot());
  EXPECT_EQ(after->claims().size(), 1u);
}

TEST_F(PrepareCheckpointTest, CorruptAndUnknownVersionFilesAreMovedAsideNotFatal) {
  for (const std::string content :
       {"{not json", R"({"version": 99, "bootID": "b", "claims": {}})",
        R"({"version": 1, "bootID": "b", "claims": {"u": {"state": 3}}})"}) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(path_) << content;
    std::string problem;
    auto checkpoint = PrepareCheckpoint::Load(path_, "boot-1", &problem);
    ASSERT_TRUE(checkpoint.ok()) << content;
    EXPECT_TRUE(checkpoint->claims().empty());
    EXPECT_THAT(problem, HasSubstr(path_ + " is unusable"));
    EXPECT_THAT(problem, HasSubstr("moved it to " + path_ + ".corrupt-"));
    EXPECT_FALSE(fs::exists(path_));
    ASSERT_EQ(Entries(), 1u);  // the moved-aside file, kept for a person to look at
    // The daemon can go on recording new claims.
    EXPECT_TRUE(checkpoint->Put(Started()).ok());
  }
  std::string problem;
  std::ofstream(path_, std::ios::trunc) << R"({"version": 99})";
  PrepareCheckpoint::Load(path_, "b", &problem).ok();
  EXPECT_THAT(problem, HasSubstr("unknown checkpoint version 99"));
}

TEST_F(PrepareCheckpointTest, AFailedWriteChangesNothingInMemory) {
  std::string problem;
  auto checkpoint = PrepareCheckpoint::Load(dir_ + "/missing-dir/checkpoint.json", "b", &problem);
  ASSERT_TRUE(checkpoint.ok());
  Status status = checkpoint->Put(Started());
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.error().message, HasSubstr("cannot write the prepare checkpoint"));
  EXPECT_TRUE(checkpoint->claims().empty());
}

TEST(BootId, IsReadAndTrimmed) {
  char tmpl[] = "/tmp/vfio-dra-boot-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::ofstream(dir + "/boot_id") << "0f3a-42\n";
  EXPECT_EQ(*ReadBootId(dir + "/boot_id"), "0f3a-42");
  EXPECT_FALSE(ReadBootId(dir + "/none").ok());
  fs::remove_all(dir);
  EXPECT_TRUE(ReadBootId().ok());  // this machine's /proc (read only)
}

}  // namespace
}  // namespace vfio_dra::plugin
