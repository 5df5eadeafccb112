#include "prepare/prepare_checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "base/file_lock.h"

namespace vfio_dra::prepare {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

constexpr const char* kUid = "5d7e1c0a-0000-4000-8000-000000000001";
constexpr const char* kOtherUid = "5d7e1c0a-0000-4000-8000-000000000002";

class PrepareCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vfio-dra-ckpt-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string ClaimsDir() const { return dir_ + "/claims"; }
  std::string RecordPath(const std::string& uid) const { return ClaimsDir() + "/" + uid + ".json"; }
  size_t Entries() {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(ClaimsDir())) ++n;
    return n;
  }
  PrepareCheckpoint Open(const std::string& boot = "boot-1") {
    auto checkpoint = PrepareCheckpoint::Open(dir_, boot);
    EXPECT_TRUE(checkpoint.ok()) << checkpoint.error().message;
    return std::move(*checkpoint);
  }
  std::string dir_;
};

ClaimRecord Started(const std::string& uid = kUid) {
  ClaimRecord r;
  r.uid = uid;
  r.namespace_ = "vms";
  r.name = "gpu-claim";
  r.functions = {{"0000:3b:00.0",
                  "nvidia",
                  "",
                  false,
                  {"10de", "2342", "10de", "16eb"},
                  "nvgrace-gpu-vfio-pci"},
                 {"0000:3b:00.1", "snd_hda_intel", "", false, {}}};
  r.mdevs = {{"0000:af:00.0", "nvidia-222", "4b20d080-1b54-4048-85b3-a6a62d165c01", true}};
  r.cdi_files = {"vfio.dra.io-vfio_" + uid + ".json"};
  RecordedDevice gpu;
  gpu.request = "gpu";
  gpu.pool = "node1";
  gpu.device = "gpu-0000-3b-00-0";
  gpu.address = "0000:3b:00.0";
  gpu.functions = {"0000:3b:00.0", "0000:3b:00.1"};
  gpu.iommu_group = 12;
  gpu.iommu_interface = "legacy";
  gpu.attributes["resource.kubernetes.io/pciBusID"] = {{"string", "0000:3b:00.0"}};
  RecordedDevice vgpu;
  vgpu.request = "vgpu/small";
  vgpu.pool = "node1";
  vgpu.device = "mdev-0000-af-00-0-nvidia-222-0";
  vgpu.share_id = "0e1a";
  vgpu.is_mdev = true;
  vgpu.mdev = {"0000:af:00.0", "nvidia-222", "4b20d080-1b54-4048-85b3-a6a62d165c01"};
  vgpu.mdev_created_by_driver = true;
  vgpu.iommu_interface = "both";
  r.devices = {gpu, vgpu};
  return r;
}

// Every field survives a write and a read: the format is what docs/checkpoint.md documents.
TEST_F(PrepareCheckpointTest, EveryFieldRoundTripsAndTheTwoPhasesSurviveARestart) {
  PrepareCheckpoint checkpoint = Open();
  EXPECT_TRUE(checkpoint.Load().claims.empty());
  ClaimRecord record = Started();
  // A network VF, with every setting, and an mdev the driver did not create.
  RecordedDevice vf;
  vf.request = "nic";
  vf.pool = "node1";
  vf.device = "vf-0000-3b-02-1";
  vf.address = "0000:3b:02.1";
  vf.functions = {"0000:3b:02.1"};
  vf.iommu_interface = "iommufd";
  vf.vf_link = vfio::VfLink{"0000:3b:00.0", 9};
  vf.network.mac = "02:00:00:aa:bb:cc";
  vf.network.vlan = 42;
  vf.network.qos = 3;
  vf.network.spoof_check = false;
  vf.network.trust = true;
  vf.attributes["vfio.dra.io/vfIndex"] = {{"int", 9}};
  vf.attributes["vfio.dra.io/trusted"] = {{"bool", true}};
  record.devices.push_back(vf);
  record.devices[1].mdev_created_by_driver = false;
  VfNetworkRecord network;
  network.address = "0000:3b:02.1";
  network.link = vfio::VfLink{"0000:3b:00.0", 9};
  network.previous.mac = "00:00:00:00:00:00";
  network.previous.vlan = 10;
  network.previous.qos = 5;
  network.previous.vlan_proto = vfio::VlanProtocol::k8021ad;
  network.previous.spoof_check = true;
  network.previous.trust = false;
  network.applied.mac = "02:00:00:aa:bb:cc";
  network.applied.vlan = 42;
  network.applied.qos = 3;
  record.vf_networks.push_back(network);
  ASSERT_TRUE(checkpoint.Put(record).ok());
  record.boot_id = "boot-1";  // stamped by Put
  const CheckpointView reloaded = Open().Load();
  ASSERT_NE(reloaded.Find(kUid), nullptr);
  EXPECT_EQ(*reloaded.Find(kUid), record);
  // The writer keeps what it wrote instead of parsing it again: the same record as parsed.
  const CheckpointView own = checkpoint.Load();
  ASSERT_NE(own.Find(kUid), nullptr);
  EXPECT_EQ(*own.Find(kUid), record);

  record.state = PrepareState::kPrepareCompleted;
  record.devices[0].cdi_device_ids = {"vfio.dra.io/vfio=" + std::string(kUid) + "-gpu"};
  ASSERT_TRUE(checkpoint.Put(record).ok());
  auto found = Open().Find(kUid);
  ASSERT_TRUE(found.ok());
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ(**found, record);
  EXPECT_TRUE(reloaded.problems.empty());

  struct stat st {};
  ASSERT_EQ(::stat(RecordPath(kUid).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(Entries(), 1u);  // no temporary files left

  ASSERT_TRUE(checkpoint.Remove(kUid).ok());
  EXPECT_TRUE(checkpoint.Remove(kUid).ok());
  EXPECT_TRUE(checkpoint.Load().claims.empty());
}

// Records written before variant drivers have no vfioDriver: their functions are on vfio-pci. A
// vfioDriver that is not a driver name (it becomes a sysfs path) makes the record unusable.
TEST_F(PrepareCheckpointTest, TheVfioDriverDefaultsToVfioPciAndMustBeADriverName) {
  PrepareCheckpoint checkpoint = Open();
  ASSERT_TRUE(checkpoint.Put(Started()).ok());
  nlohmann::json written = nlohmann::json::parse(std::ifstream(RecordPath(kUid)));
  ASSERT_EQ(written["claim"]["functions"][0]["vfioDriver"], "nvgrace-gpu-vfio-pci");
  written["claim"]["functions"][0].erase("vfioDriver");
  std::ofstream(RecordPath(kUid), std::ios::trunc) << written.dump();
  const CheckpointView view = Open().Load();
  ASSERT_NE(view.Find(kUid), nullptr);
  EXPECT_EQ(view.Find(kUid)->functions[0].vfio_driver, "vfio-pci");
  EXPECT_EQ(view.Find(kUid)->functions[0].Binding().vfio_driver, "vfio-pci");

  written["claim"]["functions"][0]["vfioDriver"] = "../../../../kernel/x";
  std::ofstream(RecordPath(kUid), std::ios::trunc) << written.dump();
  const CheckpointView bad = Open().Load();
  EXPECT_EQ(bad.Find(kUid), nullptr);
  ASSERT_EQ(bad.problems.size(), 1u);
  EXPECT_THAT(bad.problems[0], HasSubstr("is not a driver name"));
}

// A VF's VLAN protocol is recorded by name. Records written before it was have none, and stay
// readable: their VLAN was 802.1Q. A name this build does not know makes the record unusable.
TEST_F(PrepareCheckpointTest, TheVlanProtocolIsRecordedAndAbsentMeans8021Q) {
  PrepareCheckpoint checkpoint = Open();
  ClaimRecord record = Started();
  VfNetworkRecord network;
  network.address = "0000:3b:02.1";
  network.link = vfio::VfLink{"0000:3b:00.0", 9};
  network.previous.vlan = 10;
  network.previous.qos = 5;
  network.previous.vlan_proto = vfio::VlanProtocol::k8021ad;
  network.applied.vlan = 42;
  record.vf_networks.push_back(network);
  ASSERT_TRUE(checkpoint.Put(record).ok());
  nlohmann::json written = nlohmann::json::parse(std::ifstream(RecordPath(kUid)));
  nlohmann::json& previous = written["claim"]["vfNetworks"][0]["previous"];
  EXPECT_EQ(previous, nlohmann::json::parse(R"({"vlan":10,"qos":5,"vlanProtocol":"802.1ad"})"));
  EXPECT_EQ(written["claim"]["vfNetworks"][0]["applied"], nlohmann::json::parse(R"({"vlan":42})"));

  previous.erase("vlanProtocol");
  std::ofstream(RecordPath(kUid), std::ios::trunc) << written.dump();
  const CheckpointView old = Open().Load();
  ASSERT_NE(old.Find(kUid), nullptr);
  const VfNetworkRecord& read = old.Find(kUid)->vf_networks.at(0);
  EXPECT_EQ(read.previous.vlan_proto, std::nullopt);
  EXPECT_EQ(read.applied.RestoreFrom(read.previous).Display(), "vlan 10 qos 5");
  EXPECT_EQ(read.applied.RestoreFrom(read.previous).vlan_proto, vfio::VlanProtocol::k8021Q);

  previous["vlanProtocol"] = "qinq";
  std::ofstream(RecordPath(kUid), std::ios::trunc) << written.dump();
  const CheckpointView bad = Open().Load();
  EXPECT_EQ(bad.Find(kUid), nullptr);
  ASSERT_EQ(bad.problems.size(), 1u);
  EXPECT_THAT(bad.problems[0], HasSubstr("unknown vlanProtocol \"qinq\""));
}

// Two instances of a rolling update: each writes only its own claim's record, so neither can
// overwrite the other's work with a stale copy.
TEST_F(PrepareCheckpointTest, TwoInstancesNeverOverwriteEachOthersClaims) {
  PrepareCheckpoint a = Open();
  PrepareCheckpoint b = Open();
  ASSERT_TRUE(a.Put(Started(kUid)).ok());
  ASSERT_TRUE(b.Put(Started(kOtherUid)).ok());
  ASSERT_TRUE(a.Remove(kUid).ok());
  const CheckpointView view = b.Load();
  EXPECT_EQ(view.claims.size(), 1u);
  EXPECT_NE(view.Find(kOtherUid), nullptr);
}

TEST_F(PrepareCheckpointTest, ARebootIsNoticedPerRecord) {
  ASSERT_TRUE(Open("boot-1").Put(Started()).ok());
  PrepareCheckpoint after = Open("boot-2");
  const CheckpointView view = after.Load();
  ASSERT_NE(view.Find(kUid), nullptr);
  EXPECT_EQ(view.Find(kUid)->boot_id, "boot-1");
  EXPECT_EQ(after.boot_id(), "boot-2");
}

TEST_F(PrepareCheckpointTest, CorruptAndUnknownVersionRecordsAreMovedAsideNotFatal) {
  for (const std::string content : {"{not json", R"({"version": 0, "bootID": "b", "claim": {}})",
                                    R"({"version": 2, "bootID": "b", "claim": {"state": 3}})"}) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    PrepareCheckpoint checkpoint = Open();
    std::ofstream(RecordPath(kUid)) << content;
    ASSERT_TRUE(checkpoint.Put(Started(kOtherUid)).ok());
    const CheckpointView view = checkpoint.Load();
    EXPECT_EQ(view.claims.size(), 1u) << "the other claims are kept: " << content;
    ASSERT_EQ(view.problems.size(), 1u);
    EXPECT_THAT(view.problems[0], HasSubstr(RecordPath(kUid) + " is unusable"));
    EXPECT_THAT(view.problems[0], HasSubstr("moved it to " + RecordPath(kUid) + ".corrupt-"));
    EXPECT_FALSE(fs::exists(RecordPath(kUid)));
    EXPECT_EQ(Entries(), 2u);  // the moved-aside file, kept for a person to look at
    // The daemon can go on recording new claims.
    EXPECT_TRUE(checkpoint.Put(Started()).ok());
  }
  std::ofstream(RecordPath(kUid), std::ios::trunc) << R"({"version": 0})";
  EXPECT_THAT(Open().Load().problems.at(0), HasSubstr("unknown checkpoint version 0"));
}

// A Load holds none of a claim's locks, and the claim's owner may be replacing the record while it
// reads (a corrupt file would be a disk's doing; the owner's write is atomic). Every write holds
// the records lock shared while it lands, so a Load that meets a corrupt record while a write
// holds it must not move the file by its path: the file there may be the good record just
// written. It reports the claim unreadable instead, and the next Load reads it again.
TEST_F(PrepareCheckpointTest, ALoadNeverMovesARecordAsideWhileAWriteIsLanding) {
  PrepareCheckpoint reader = Open();
  std::ofstream(RecordPath(kUid)) << "{not json";
  auto landing = FileLock::Acquire(dir_ + "/records.lock", LockMode::kShared, Deadline(),
                                   "the test's write in progress");
  ASSERT_TRUE(landing.ok()) << landing.error().message;
  CheckpointView view = reader.Load();
  EXPECT_TRUE(fs::exists(RecordPath(kUid))) << "moved aside while a write was landing";
  EXPECT_EQ(Entries(), 1u);
  ASSERT_EQ(view.unreadable.count(kUid), 1u) << "a corrupt record not moved aside may hold devices";
  EXPECT_THAT(view.unreadable.at(kUid), HasSubstr(RecordPath(kUid) + " is unusable"));

  // The owner's write lands: the good record stays where it is.
  ASSERT_TRUE(Open().Put(Started()).ok());
  { FileLock released = std::move(*landing); }
  view = reader.Load();
  EXPECT_TRUE(view.unreadable.empty());
  ASSERT_EQ(view.claims.count(kUid), 1u);
  EXPECT_EQ(Entries(), 1u);
  EXPECT_TRUE(view.problems.empty());
}

// Each corrupt record moved aside keeps a copy of its own, even two of one claim in one second.
TEST_F(PrepareCheckpointTest, RecordsMovedAsideNeverOverwriteAnEarlierCopy) {
  PrepareCheckpoint checkpoint = Open();
  const std::vector<std::string> contents = {"{first", "{second", "{third"};
  for (const std::string& content : contents) {
    std::ofstream(RecordPath(kUid)) << content;
    const CheckpointView view = checkpoint.Load();
    ASSERT_EQ(view.problems.size(), 1u);
    EXPECT_THAT(view.problems[0], HasSubstr("moved it to " + RecordPath(kUid) + ".corrupt-"));
    EXPECT_TRUE(view.unreadable.empty());
  }
  std::set<std::string> kept;
  for (const auto& entry : fs::directory_iterator(ClaimsDir())) {
    std::ifstream in(entry.path());
    std::string content;
    std::getline(in, content);
    kept.insert(content);
  }
  EXPECT_EQ(kept, std::set<std::string>(contents.begin(), contents.end()));
}

// A record of a newer format (the other instance of a rolling update is newer, or after a
// downgrade) may hold work this build cannot undo: it is kept, and its claim left to the newer
// version, instead of being moved aside as corrupt.
TEST_F(PrepareCheckpointTest, ARecordOfANewerVersionIsKeptForThatVersion) {
  PrepareCheckpoint checkpoint = Open();
  std::ofstream(RecordPath(kUid)) << R"({"version": 4, "bootID": "b", "claim": {"new": 1}})";
  ASSERT_TRUE(checkpoint.Put(Started(kOtherUid)).ok());
  const CheckpointView view = checkpoint.Load();
  EXPECT_EQ(view.claims.size(), 1u);
  ASSERT_EQ(view.unreadable.count(kUid), 1u);
  EXPECT_THAT(view.unreadable.at(kUid),
              HasSubstr("has version 4, written by a newer vfio-dra (this build reads version 3)"));
  EXPECT_TRUE(fs::exists(RecordPath(kUid)));
  EXPECT_FALSE(checkpoint.Find(kUid).ok());
}

// A record that exists but cannot be read (EIO, EACCES) is never taken for "nothing prepared":
// the claim stays known as unreadable, and the daemon goes on.
TEST_F(PrepareCheckpointTest, AnUnreadableRecordIsReportedAndKept) {
  PrepareCheckpoint checkpoint = Open();
  // A directory where the record should be: open succeeds, read fails with EISDIR, as an I/O
  // error would (tests run as root, so permission bits do not stop reads).
  fs::create_directories(RecordPath(kUid));
  const CheckpointView view = checkpoint.Load();
  EXPECT_TRUE(view.claims.empty());
  ASSERT_EQ(view.unreadable.count(kUid), 1u);
  EXPECT_THAT(view.unreadable.at(kUid), HasSubstr(kUid));
  EXPECT_TRUE(fs::exists(RecordPath(kUid))) << "kept in place for a later retry";
  auto found = checkpoint.Find(kUid);
  EXPECT_FALSE(found.ok());
}

// Put makes a record visible at once without forcing it to disk: only a power loss can leave the
// file empty, and the reboot after it undid whatever the record said was done.
TEST_F(PrepareCheckpointTest, APutRecordIsVisibleAndAnEmptyOneIsDroppedAsNeverWritten) {
  PrepareCheckpoint checkpoint = Open();
  ASSERT_TRUE(checkpoint.Put(Started()).ok());
  auto written = Open().Find(kUid);
  ASSERT_TRUE(written.ok() && written->has_value()) << "another instance sees it at once";
  EXPECT_EQ(**written, [] {
    ClaimRecord r = Started();
    r.boot_id = "boot-1";
    return r;
  }());

  std::ofstream(RecordPath(kOtherUid)) << "";
  const CheckpointView view = checkpoint.Load();
  EXPECT_EQ(view.claims.size(), 1u);
  ASSERT_EQ(view.problems.size(), 1u);
  EXPECT_THAT(view.problems[0],
              HasSubstr("removed the empty prepare checkpoint record " + RecordPath(kOtherUid)));
  EXPECT_FALSE(fs::exists(RecordPath(kOtherUid)));
}

// Put hands back the record as written: stamped with this boot, and the very object a Load of
// the unchanged file gives (the preparer keeps it without a copy or a parse).
TEST_F(PrepareCheckpointTest, PutReturnsTheRecordThatLoadsShare) {
  PrepareCheckpoint checkpoint = Open("boot-7");
  ClaimRecord record = Started();
  record.boot_id = "an-earlier-boot";
  auto written = checkpoint.Put(record);
  ASSERT_TRUE(written.ok()) << written.error().message;
  EXPECT_EQ((*written)->boot_id, "boot-7");
  record.boot_id = "boot-7";
  EXPECT_EQ(**written, record);
  const CheckpointView view = checkpoint.Load();
  ASSERT_EQ(view.claims.count(kUid), 1u);
  EXPECT_EQ(view.claims.at(kUid).get(), written->get());
}

// A record rewritten by another instance is read again, although this one parsed it before.
TEST_F(PrepareCheckpointTest, ARecordReplacedByAnotherInstanceIsReadAfresh) {
  PrepareCheckpoint a = Open();
  PrepareCheckpoint b = Open();
  ASSERT_TRUE(a.Put(Started()).ok());
  ASSERT_EQ(b.Find(kUid)->value().state, PrepareState::kPrepareStarted);
  ClaimRecord completed = Started();
  completed.state = PrepareState::kPrepareCompleted;
  ASSERT_TRUE(a.Put(completed).ok());
  EXPECT_EQ(b.Find(kUid)->value().state, PrepareState::kPrepareCompleted);
  ASSERT_TRUE(a.Remove(kUid).ok());
  EXPECT_FALSE(b.Find(kUid)->has_value());
}

// Load follows the directory's changes: what another instance (or a person) did since the last
// Load is in the next one, while the records nobody touched are not read again.
TEST_F(PrepareCheckpointTest, ALoadSeesEveryChangeSinceTheLastOne) {
  PrepareCheckpoint a = Open();
  PrepareCheckpoint b = Open();
  ASSERT_FALSE(a.unwatched().has_value()) << *a.unwatched();
  ASSERT_TRUE(a.Put(Started(kOtherUid)).ok());
  EXPECT_EQ(a.Load().claims.size(), 1u);

  ASSERT_TRUE(b.Put(Started()).ok());
  CheckpointView view = a.Load();
  ASSERT_NE(view.Find(kUid), nullptr);
  EXPECT_EQ(view.Find(kUid)->state, PrepareState::kPrepareStarted);
  ClaimRecord completed = Started();
  completed.state = PrepareState::kPrepareCompleted;
  ASSERT_TRUE(b.Put(completed).ok());
  EXPECT_EQ(a.Load().Find(kUid)->state, PrepareState::kPrepareCompleted);
  ASSERT_TRUE(b.Remove(kUid).ok());
  view = a.Load();
  EXPECT_EQ(view.Find(kUid), nullptr);
  EXPECT_NE(view.Find(kOtherUid), nullptr);

  // Rewritten in place by hand.
  const std::string text = [&] {
    std::ifstream in(RecordPath(kOtherUid));
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  const std::string renamed = std::regex_replace(text, std::regex("gpu-claim"), "renamed");
  ASSERT_NE(renamed, text);
  std::ofstream(RecordPath(kOtherUid), std::ios::trunc) << renamed;
  EXPECT_EQ(a.Load().Find(kOtherUid)->name, "renamed");

  // Unusable records appearing later are handled as at the first Load: a corrupt one moved aside
  // once, an unreadable one reported at every Load until it can be read.
  std::ofstream(RecordPath(kUid)) << "{not json";
  view = a.Load();
  ASSERT_EQ(view.problems.size(), 1u);
  EXPECT_THAT(view.problems[0], HasSubstr("moved it to " + RecordPath(kUid) + ".corrupt-"));
  EXPECT_EQ(view.claims.size(), 1u);
  EXPECT_TRUE(a.Load().problems.empty());
  for (const auto& entry : fs::directory_iterator(ClaimsDir())) {
    if (entry.path().string().find(".corrupt-") != std::string::npos) fs::remove(entry.path());
  }
  fs::create_directories(RecordPath(kUid));
  for (int i = 0; i < 2; ++i) {
    view = a.Load();
    EXPECT_EQ(view.unreadable.count(kUid), 1u) << "Load " << i;
    EXPECT_EQ(view.problems.size(), 1u) << "Load " << i;
  }
  fs::remove(RecordPath(kUid));
  ASSERT_TRUE(b.Put(Started()).ok());
  view = a.Load();
  EXPECT_TRUE(view.unreadable.empty());
  EXPECT_NE(view.Find(kUid), nullptr);
}

// When the kernel drops change events (its queue overflowed), Load reads every record again
// rather than miss the ones whose events were lost.
TEST_F(PrepareCheckpointTest, ALoadAfterLostChangeEventsReadsEveryRecord) {
  PrepareCheckpoint a = Open();
  PrepareCheckpoint b = Open();
  EXPECT_TRUE(a.Load().claims.empty());
  long queued = 16384;
  std::ifstream("/proc/sys/fs/inotify/max_queued_events") >> queued;
  for (long i = 0; i < queued / 2 + 8; ++i) {
    std::ofstream(ClaimsDir() + "/notes.txt") << i;
    fs::remove(ClaimsDir() + "/notes.txt");
  }
  ASSERT_TRUE(b.Put(Started()).ok());  // its events come after the overflow: lost
  const CheckpointView view = a.Load();
  EXPECT_NE(view.Find(kUid), nullptr);
  ASSERT_TRUE(b.Put(Started(kOtherUid)).ok());
  EXPECT_EQ(a.Load().claims.size(), 2u) << "and follows the changes again afterwards";
}

// A value that is not UTF-8 (driver_override can hold any bytes) would be recorded as something
// else and restored wrongly: the record is refused, and nothing is written.
TEST_F(PrepareCheckpointTest, AValueThatIsNotUtf8IsRefusedNotAltered) {
  PrepareCheckpoint checkpoint = Open();
  ClaimRecord with_bad_value = Started();
  with_bad_value.functions[0].override = "drv\xFF";
  ClaimRecord with_bad_key = Started();  // a member's name is checked as strictly
  with_bad_key.devices[0].attributes["vfio.dra.io/\xC0"] = {{"string", "x"}};
  for (const ClaimRecord& record : {with_bad_value, with_bad_key}) {
    auto written = checkpoint.Put(record);
    ASSERT_FALSE(written.ok());
    EXPECT_EQ(written.error().kind, ErrorKind::kInvalidArgument);
    EXPECT_THAT(written.error().message, HasSubstr("not UTF-8"));
    EXPECT_THAT(written.error().message, HasSubstr(kUid));
    EXPECT_EQ(Entries(), 0u);
  }
}

// What Load does not follow: a change that ends no write and moves no name (here a truncate by
// path) leaves the record as it was last read, until its next write. This is also what shows
// that a Load after the first reads only what changed.
TEST_F(PrepareCheckpointTest, ALoadReadsOnlyTheRecordsThatChanged) {
  PrepareCheckpoint a = Open();
  PrepareCheckpoint b = Open();
  ASSERT_TRUE(b.Put(Started()).ok());
  ASSERT_TRUE(b.Put(Started(kOtherUid)).ok());
  ASSERT_EQ(a.Load().claims.size(), 2u);
  ASSERT_EQ(::truncate(RecordPath(kUid).c_str(), 0), 0);
  ClaimRecord completed = Started(kOtherUid);
  completed.state = PrepareState::kPrepareCompleted;
  ASSERT_TRUE(b.Put(completed).ok());
  const CheckpointView view = a.Load();
  ASSERT_NE(view.Find(kUid), nullptr) << "not read again: nothing said it changed";
  EXPECT_EQ(view.Find(kOtherUid)->state, PrepareState::kPrepareCompleted);
  EXPECT_TRUE(view.problems.empty());
  // Another checkpoint reads everything at its first Load: the empty record is dropped.
  EXPECT_EQ(Open().Load().Find(kUid), nullptr);
}

// A process killed while writing a record leaves its temporary file; removing the record takes
// it along.
TEST_F(PrepareCheckpointTest, RemovingARecordRemovesTheTemporaryFilesOfWritesCutShort) {
  PrepareCheckpoint checkpoint = Open();
  ASSERT_TRUE(checkpoint.Put(Started()).ok());
  ASSERT_TRUE(checkpoint.Put(Started(kOtherUid)).ok());
  std::ofstream(ClaimsDir() + "/." + kUid + ".json.tmp-42") << "{\"version\"";
  ASSERT_TRUE(checkpoint.Remove(kUid).ok());
  EXPECT_EQ(Entries(), 1u) << "only the other claim's record is left";
}

TEST_F(PrepareCheckpointTest, AFailedWriteIsAnError) {
  PrepareCheckpoint checkpoint = Open();
  fs::remove_all(ClaimsDir());
  auto status = checkpoint.Put(Started());
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.error().message, HasSubstr("cannot write the prepare checkpoint"));
}

TEST_F(PrepareCheckpointTest, OnlyObjectUidsNameRecords) {
  PrepareCheckpoint checkpoint = Open();
  ClaimRecord bad = Started("../../etc/passwd");
  EXPECT_FALSE(checkpoint.Put(bad).ok());
  std::ofstream(ClaimsDir() + "/README.txt") << "notes";
  std::ofstream(ClaimsDir() + "/." + std::string(kUid) + ".json.tmp-1") << "{";
  const CheckpointView view = checkpoint.Load();
  EXPECT_TRUE(view.claims.empty());
  EXPECT_TRUE(view.problems.empty()) << "temporary and foreign files are not records";
}

TEST_F(PrepareCheckpointTest, ACorruptVersion1FileIsMovedAsideOnUpgrade) {
  std::ofstream(dir_ + "/checkpoint.json") << "{not json";
  std::string problem;
  auto moved = Open().Upgrade(&problem);
  ASSERT_TRUE(moved.ok());
  EXPECT_EQ(*moved, 0);
  EXPECT_THAT(problem, HasSubstr("checkpoint.json is unusable"));
  EXPECT_FALSE(fs::exists(dir_ + "/checkpoint.json"));
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
}  // namespace vfio_dra::prepare
