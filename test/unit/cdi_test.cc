#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "cdi/cdi_spec.h"
#include "cdi/device_metadata.h"

namespace vfio_dra::cdi {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

unsigned Mode(const std::string& path) {
  struct stat st {};
  ::stat(path.c_str(), &st);
  return st.st_mode & 0777;
}

class CdiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vfio-dra-cdi-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  size_t FilesUnder(const std::string& root) {
    size_t n = 0;
    for (const auto& e : fs::recursive_directory_iterator(root)) n += e.is_regular_file();
    return n;
  }
  std::string dir_;
};

TEST_F(CdiTest, VfioSpecUsesOnlySchemaKeysAndTheLowestVersion) {
  Spec spec;
  spec.kind = "vfio.dra.io/vfio";
  spec.devices.push_back(Device{"5d7e1c0a-0000-4000-8000-000000000001-gpu-0000-3b-00-0",
                                {{"/dev/vfio/vfio", "", 10, 196}, {"/dev/vfio/30", "", 511, 3}},
                                {}});
  SpecDirectory cdi(dir_ + "/cdi");
  const std::string file = TransientSpecFileName(spec.kind, "5d7e1c0a-0000-4000-8000-000000000001");
  EXPECT_EQ(file, "vfio.dra.io-vfio_5d7e1c0a-0000-4000-8000-000000000001.json");
  ASSERT_TRUE(cdi.Write(file, spec).ok());
  const auto json = nlohmann::json::parse(ReadAll(cdi.PathOf(file)));
  EXPECT_EQ(json, nlohmann::json::parse(R"({
    "cdiVersion": "0.5.0", "kind": "vfio.dra.io/vfio",
    "devices": [{"name": "5d7e1c0a-0000-4000-8000-000000000001-gpu-0000-3b-00-0",
                 "containerEdits": {"deviceNodes": [
                   {"path": "/dev/vfio/vfio", "type": "c", "major": 10, "minor": 196},
                   {"path": "/dev/vfio/30", "type": "c", "major": 511, "minor": 3}]}}]})"));
  EXPECT_EQ(Mode(cdi.PathOf(file)), 0644u);
  EXPECT_EQ(FilesUnder(dir_ + "/cdi"), 1u);  // no temporary file left behind
  EXPECT_EQ(QualifiedDeviceId(spec.kind, spec.devices[0].name),
            "vfio.dra.io/vfio=5d7e1c0a-0000-4000-8000-000000000001-gpu-0000-3b-00-0");
  ASSERT_TRUE(cdi.Remove(file).ok());
  EXPECT_TRUE(cdi.Remove(file).ok());  // idempotent
  EXPECT_FALSE(fs::exists(cdi.PathOf(file)));
}

TEST_F(CdiTest, SpecsTheLoaderWouldRejectAreRefused) {
  SpecDirectory cdi(dir_);
  Spec empty;
  empty.kind = "vfio.dra.io/vfio";
  EXPECT_THAT(cdi.Write("a.json", empty).error().message, HasSubstr("has no devices"));
  Spec no_edits = empty;
  no_edits.devices.push_back(Device{"d", {}, {}});
  EXPECT_THAT(cdi.Write("a.json", no_edits).error().message, HasSubstr("no container edits"));
  Spec bad_kind = empty;
  bad_kind.kind = "1vendor/class";
  bad_kind.devices.push_back(Device{"d", {{"/dev/x", "", std::nullopt, std::nullopt}}, {}});
  EXPECT_THAT(cdi.Write("a.json", bad_kind).error().message, HasSubstr("vendor/class"));
  Spec letters = bad_kind;
  letters.kind = "vfio.dra.io/vfio";
  EXPECT_EQ(nlohmann::json::parse(SpecText(letters))["cdiVersion"], "0.3.0");
}

TEST_F(CdiTest, FileNamesCannotLeaveTheDirectory) {
  SpecDirectory cdi(dir_ + "/cdi");
  Spec spec;
  spec.kind = "vfio.dra.io/vfio";
  spec.devices.push_back(Device{"d", {{"/dev/vfio/vfio", "", 10, 196}}, {}});
  const std::vector<std::string> bad_names = {
      "../escape.json",      "a/b.json",     "..", ".", "", std::string("a\0b", 3),
      std::string(300, 'a'), "\xff\xfe.json"};
  for (const std::string& bad : bad_names) {
    EXPECT_FALSE(cdi.Write(bad, spec).ok()) << bad;
    EXPECT_FALSE(cdi.Remove(bad).ok()) << bad;
  }
  EXPECT_FALSE(fs::exists(dir_ + "/escape.json"));
}

// A value that is not UTF-8 (a host path can hold any bytes) is written as U+FFFD, so the file
// is still JSON a runtime loads; it must not make writing fail or throw out of a prepare.
TEST_F(CdiTest, BytesThatAreNotUtf8AreWrittenAsReplacementCharacters) {
  Spec spec;
  spec.kind = "vfio.dra.io/vfio";
  spec.devices.push_back(Device{"d", {{"/dev/vfio/12", "/dev/vfio/12\xff", 243, 12}}, {}});
  const std::string text = SpecText(spec);
  const auto parsed = nlohmann::json::parse(text, nullptr, false);
  ASSERT_FALSE(parsed.is_discarded()) << text;
  EXPECT_EQ(parsed["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"],
            "/dev/vfio/12\xEF\xBF\xBD");
  EXPECT_TRUE(SpecDirectory(dir_ + "/cdi").Write("a.json", spec).ok());
}

RequestMetadata GpuRequest() {
  RequestMetadata m;
  m.claim_namespace = "vms";
  m.claim_name = "vm1-gpu-x7k2p";
  m.claim_uid = "5d7e1c0a-0000-4000-8000-000000000001";
  m.pod_claim_name = "gpu";
  m.request = "gpu";
  m.devices.push_back(
      MetadataDevice{"vfio.dra.io",
                     "node-1",
                     "gpu-0000-3b-00-0",
                     {{"resource.kubernetes.io/pciBusID", {{"string", "0000:3b:00.0"}}},
                      {"resource.kubernetes.io/pcieRoot", {{"string", "pci0000:3a"}}},
                      {"type", {{"string", "gpu"}}}}});
  return m;
}

// The same for the metadata file: an attribute that is not UTF-8 goes out as U+FFFD.
TEST_F(CdiTest, MetadataBytesThatAreNotUtf8AreWrittenAsReplacementCharacters) {
  RequestMetadata m = GpuRequest();
  m.devices[0].attributes["productName"] = {{"string", "GH100\xff"}};
  const std::string text = DeviceMetadataText(m);
  const auto parsed = nlohmann::json::parse(text, nullptr, false);
  ASSERT_FALSE(parsed.is_discarded()) << text;
  EXPECT_EQ(parsed["requests"][0]["devices"][0]["attributes"]["productName"]["string"],
            "GH100\xEF\xBF\xBD");
}

TEST_F(CdiTest, MetadataFileAndItsCdiMountFollowTheKep5304Layout) {
  MetadataStore store(dir_ + "/plugin", SpecDirectory(dir_ + "/cdi"), "vfio.dra.io");
  const RequestMetadata m = GpuRequest();
  auto id = store.Write(m);
  ASSERT_TRUE(id.ok()) << id.error().message;
  EXPECT_EQ(*id, "vfio.dra.io/metadata=5d7e1c0a-0000-4000-8000-000000000001_gpu");
  const std::string host =
      dir_ + "/plugin/dra-device-metadata/5d7e1c0a-0000-4000-8000-000000000001_gpu.json";
  ASSERT_EQ(store.HostPath(m), host);
  const std::string text = ReadAll(host);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');  // a JSON stream: the object, then a newline
  EXPECT_EQ(text.find('\n'), text.size() - 1);
  EXPECT_EQ(nlohmann::json::parse(text), nlohmann::json::parse(R"({
    "apiVersion": "metadata.resource.k8s.io/v1alpha1", "kind": "DeviceMetadata",
    "metadata": {"name": "vm1-gpu-x7k2p", "namespace": "vms",
                 "uid": "5d7e1c0a-0000-4000-8000-000000000001", "generation": 1},
    "podClaimName": "gpu",
    "requests": [{"name": "gpu", "devices": [{"driver": "vfio.dra.io", "pool": "node-1",
      "name": "gpu-0000-3b-00-0", "attributes": {
        "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:3a"},
        "type": {"string": "gpu"}}}]}]})"));
  EXPECT_EQ(Mode(host), 0644u);
  EXPECT_EQ(Mode(dir_ + "/plugin/dra-device-metadata"), 0755u);
  const std::string spec_file =
      dir_ + "/cdi/vfio.dra.io_metadata_5d7e1c0a-0000-4000-8000-000000000001_gpu.json";
  EXPECT_EQ(nlohmann::json::parse(ReadAll(spec_file)), nlohmann::json::parse(R"({
    "cdiVersion": "0.5.0", "kind": "vfio.dra.io/metadata",
    "devices": [{"name": "5d7e1c0a-0000-4000-8000-000000000001_gpu", "containerEdits": {"mounts": [{
      "hostPath": ")" + host + R"(",
      "containerPath": "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu/gpu/vfio.dra.io-metadata.json",
      "options": ["ro", "bind"]}]}}]})"));
}

TEST_F(CdiTest, AClaimByNameIsMountedUnderResourceclaims) {
  MetadataStore store(dir_ + "/plugin", SpecDirectory(dir_ + "/cdi"), "vfio.dra.io");
  RequestMetadata m = GpuRequest();
  m.pod_claim_name.reset();
  EXPECT_EQ(store.ContainerPath(m),
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm1-gpu-x7k2p/gpu/"
            "vfio.dra.io-metadata.json");
  ASSERT_TRUE(store.Write(m).ok());
  EXPECT_FALSE(nlohmann::json::parse(ReadAll(store.HostPath(m))).contains("podClaimName"));
}

TEST_F(CdiTest, RemovingAClaimRemovesItsFilesAndIsIdempotent) {
  MetadataStore store(dir_ + "/plugin", SpecDirectory(dir_ + "/cdi"), "vfio.dra.io");
  RequestMetadata gpu = GpuRequest();
  RequestMetadata nic = GpuRequest();
  nic.request = "nic";
  RequestMetadata other = GpuRequest();
  other.claim_name = "other";
  other.claim_uid = "aaaaaaaa-0000-4000-8000-000000000009";
  ASSERT_TRUE(store.Write(gpu).ok());
  ASSERT_TRUE(store.Write(nic).ok());
  ASSERT_TRUE(store.Write(other).ok());
  // A file of the previous layout (<uid>/<request>/metadata.json), from before an upgrade, and
  // the temporary file of a write of this claim cut short by a kill.
  const std::string base = dir_ + "/plugin/dra-device-metadata/";
  fs::create_directories(base + gpu.claim_uid + "/gpu");
  std::ofstream(base + gpu.claim_uid + "/gpu/metadata.json") << "{}\n";
  std::ofstream(base + "." + gpu.claim_uid + "_vm.json.tmp-42") << "{";
  ASSERT_TRUE(store.RemoveClaim("vms", gpu.claim_name, gpu.claim_uid).ok());
  EXPECT_FALSE(fs::exists(store.HostPath(gpu)));
  EXPECT_FALSE(fs::exists(store.HostPath(nic)));
  EXPECT_FALSE(fs::exists(base + gpu.claim_uid));
  EXPECT_EQ(FilesUnder(base), 1u);           // only the other claim's file remains
  EXPECT_EQ(FilesUnder(dir_ + "/cdi"), 1u);  // and its spec
  EXPECT_TRUE(fs::exists(store.HostPath(other)));
  EXPECT_TRUE(store.RemoveClaim("vms", gpu.claim_name, gpu.claim_uid).ok());
}

// A process killed between creating a spec's temporary file and renaming it leaves the temporary
// file behind (seen with two prepares in flight at a kill): removing the claim removes it too,
// whether or not the spec itself was ever written, and never another claim's.
TEST_F(CdiTest, RemovingAClaimRemovesTheTemporaryFilesOfWritesCutShort) {
  MetadataStore store(dir_ + "/plugin", SpecDirectory(dir_ + "/cdi"), "vfio.dra.io");
  RequestMetadata gpu = GpuRequest();
  ASSERT_TRUE(store.Write(gpu).ok());
  const std::string uid = gpu.claim_uid;
  const std::string metadata_spec = "vfio.dra.io_metadata_" + uid + "_gpu.json";
  ASSERT_TRUE(fs::exists(dir_ + "/cdi/" + metadata_spec));
  std::ofstream(dir_ + "/cdi/." + metadata_spec + ".tmp-123") << "{";
  // A second request whose first write never reached its rename.
  std::ofstream(dir_ + "/cdi/.vfio.dra.io_metadata_" + uid + "_nic.json.tmp-7") << "";
  std::ofstream(dir_ +
                "/cdi/.vfio.dra.io_metadata_aaaaaaaa-0000-4000-8000-000000000009_gpu.json.tmp-1")
      << "";
  auto listed = SpecDirectory(dir_ + "/cdi").List("vfio.dra.io_metadata_" + uid + "_");
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(*listed,
            (std::vector<std::string>{metadata_spec, "vfio.dra.io_metadata_" + uid + "_nic.json"}));
  ASSERT_TRUE(store.RemoveClaim("vms", gpu.claim_name, uid).ok());
  EXPECT_EQ(FilesUnder(dir_ + "/cdi"), 1u) << "only the other claim's leftover remains";
}

// Unprepare removes the claim's device spec and its metadata specs in one call: the named spec
// and its leftover go with the metadata files, other claims' files stay.
TEST_F(CdiTest, RemovingAClaimRemovesTheOtherSpecsItIsGivenToo) {
  MetadataStore store(dir_ + "/plugin", SpecDirectory(dir_ + "/cdi"), "vfio.dra.io");
  RequestMetadata gpu = GpuRequest();
  RequestMetadata other = GpuRequest();
  other.claim_name = "other";
  other.claim_uid = "aaaaaaaa-0000-4000-8000-000000000009";
  ASSERT_TRUE(store.Write(gpu).ok());
  ASSERT_TRUE(store.Write(other).ok());
  const std::string device_spec = "vfio.dra.io-vfio_" + gpu.claim_uid + ".json";
  std::ofstream(dir_ + "/cdi/" + device_spec) << "{}";
  std::ofstream(dir_ + "/cdi/." + device_spec + ".tmp-5") << "{";
  std::ofstream(dir_ + "/cdi/vfio.dra.io-vfio_" + other.claim_uid + ".json") << "{}";
  ASSERT_TRUE(store.RemoveClaim("vms", gpu.claim_name, gpu.claim_uid, {device_spec}).ok());
  EXPECT_FALSE(fs::exists(store.HostPath(gpu)));
  EXPECT_TRUE(fs::exists(store.HostPath(other)));
  std::set<std::string> left;
  for (const auto& e : fs::directory_iterator(dir_ + "/cdi")) {
    left.insert(e.path().filename().string());
  }
  EXPECT_EQ(left, (std::set<std::string>{"vfio.dra.io-vfio_" + other.claim_uid + ".json",
                                         "vfio.dra.io_metadata_" + other.claim_uid + "_gpu.json"}));
  // A name that is not one file of the directory (a damaged record) is refused, naming it, and
  // everything else still goes; so does everything the UID names when the claim's name is bad.
  ASSERT_TRUE(store.Write(gpu).ok());
  std::ofstream(dir_ + "/cdi/" + device_spec) << "{}";
  auto refused =
      store.RemoveClaim("vms", gpu.claim_name, gpu.claim_uid, {"../x.json", device_spec});
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.error().message, HasSubstr("\"../x.json\""));
  EXPECT_FALSE(fs::exists(store.HostPath(gpu)));
  EXPECT_FALSE(fs::exists(dir_ + "/cdi/" + device_spec));
  EXPECT_FALSE(fs::exists(dir_ + "/cdi/vfio.dra.io_metadata_" + gpu.claim_uid + "_gpu.json"));
  ASSERT_TRUE(store.Write(gpu).ok());
  EXPECT_FALSE(store.RemoveClaim("vms", "Not_A_Name", gpu.claim_uid).ok());
  EXPECT_FALSE(fs::exists(store.HostPath(gpu)));
  EXPECT_FALSE(fs::exists(dir_ + "/cdi/vfio.dra.io_metadata_" + gpu.claim_uid + "_gpu.json"));
  // Only spec files go by prefix: a directory or a file of another kind with the prefix stays.
  fs::create_directories(dir_ + "/cdi/vfio.dra.io_metadata_" + gpu.claim_uid + "_dir.json");
  std::ofstream(dir_ + "/cdi/vfio.dra.io_metadata_" + gpu.claim_uid + "_gpu.json.bak") << "{}";
  EXPECT_TRUE(store.RemoveClaim("vms", gpu.claim_name, gpu.claim_uid).ok());
  EXPECT_TRUE(fs::is_directory(dir_ + "/cdi/vfio.dra.io_metadata_" + gpu.claim_uid + "_dir.json"));
  EXPECT_TRUE(fs::exists(dir_ + "/cdi/vfio.dra.io_metadata_" + gpu.claim_uid + "_gpu.json.bak"));
}

TEST_F(CdiTest, MetadataPathsCannotLeaveTheirDirectory) {
  MetadataStore store(dir_ + "/plugin", SpecDirectory(dir_ + "/cdi"), "vfio.dra.io");
  const std::vector<std::pair<std::string, std::function<void(RequestMetadata&)>>> cases = {
      {"namespace ../", [](RequestMetadata& m) { m.claim_namespace = "../etc"; }},
      {"claim with /", [](RequestMetadata& m) { m.claim_name = "a/b"; }},
      {"claim ..", [](RequestMetadata& m) { m.claim_name = ".."; }},
      {"NUL", [](RequestMetadata& m) { m.claim_name = std::string("a\0b", 3); }},
      {"300 chars", [](RequestMetadata& m) { m.claim_name = std::string(300, 'a'); }},
      {"non-UTF-8", [](RequestMetadata& m) { m.request = "\xff\xfe"; }},
      {"uid with /", [](RequestMetadata& m) { m.claim_uid = "../../x"; }},
      {"request ..", [](RequestMetadata& m) { m.request = ".."; }},
      {"pod claim /", [](RequestMetadata& m) { m.pod_claim_name = "../x"; }},
  };
  for (const auto& [what, mutate] : cases) {
    RequestMetadata m = GpuRequest();
    mutate(m);
    auto written = store.Write(m);
    ASSERT_FALSE(written.ok()) << what;
    EXPECT_THAT(written.error().message, HasSubstr("not a valid Kubernetes name")) << what;
  }
  EXPECT_FALSE(fs::exists(dir_ + "/plugin"));
  EXPECT_FALSE(fs::exists(dir_ + "/cdi"));
  EXPECT_FALSE(store.RemoveClaim("..", "x", "u").ok());
}

}  // namespace
}  // namespace vfio_dra::cdi
