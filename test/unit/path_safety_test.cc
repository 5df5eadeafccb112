// Path safety: claim namespaces, names, UIDs and request names come from the kubelet and the API
// server and end up in file names (CDI specs, metadata files). Hostile values (traversal, absolute
// paths, NUL, overlong or non-UTF-8 names) must be refused with a message naming the field, and
// nothing may be written or removed outside the plugin's own directories.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "cdi/cdi_spec.h"
#include "cdi/device_metadata.h"
#include "prepare/claim_ref.h"

namespace vfio_dra::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr const char* kUid = "4f1c2a9e-0000-4000-8000-000000000001";

const std::vector<std::string>& HostileNames() {
  static const std::vector<std::string> kNames = {
      "..",
      ".",
      "../../../../etc",
      "a/../../b",
      "/etc/passwd",
      "a/b",
      std::string("ab\0../x", 7),
      std::string(300, 'a'),
      "\xff\xfe\xfd",
      "caf\xc3\xa9",
      "name\n",
      "UPPER",
      "",
      "-leading",
      "a..b",
  };
  return kNames;
}

// Every file and directory under `root`, relative to it.
std::set<std::string> Tree(const fs::path& root) {
  std::set<std::string> out;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    out.insert(fs::relative(entry.path(), root).string());
  }
  return out;
}

class PathSafetyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vfio-dra-paths-XXXXXX";
    root_ = mkdtemp(tmpl);
    // The plugin's directories sit two levels down, so a traversal has somewhere to land.
    fs::create_directories(root_ / "a" / "data");
    fs::create_directories(root_ / "a" / "cdi");
    std::ofstream(root_ / "victim") << "keep me\n";
    std::ofstream(root_ / "a" / "victim.json") << "keep me\n";
  }
  void TearDown() override { fs::remove_all(root_); }

  cdi::SpecDirectory Cdi() const { return cdi::SpecDirectory((root_ / "a" / "cdi").string()); }
  cdi::MetadataStore Metadata() const {
    return cdi::MetadataStore((root_ / "a" / "data").string(), Cdi(), "vfio.dra.io");
  }
  static cdi::RequestMetadata Good() {
    cdi::RequestMetadata m;
    m.claim_namespace = "vms";
    m.claim_name = "vm-gpu";
    m.claim_uid = kUid;
    m.request = "gpu";
    m.devices.push_back({"vfio.dra.io", "node1", "gpu-0000-3b-00-0", {}});
    return m;
  }

  fs::path root_;
};

TEST_F(PathSafetyTest, ClaimRefsWithHostileFieldsAreRefusedNamingTheField) {
  ASSERT_TRUE(prepare::ValidateClaimRef({"vms", "vm-gpu", kUid}).ok());
  for (const std::string& bad : HostileNames()) {
    SCOPED_TRACE(::testing::PrintToString(bad));
    Status ns = prepare::ValidateClaimRef({bad, "vm-gpu", kUid});
    ASSERT_FALSE(ns.ok());
    EXPECT_THAT(ns.error().message, HasSubstr("invalid namespace"));
    Status name = prepare::ValidateClaimRef({"vms", bad, kUid});
    ASSERT_FALSE(name.ok());
    EXPECT_THAT(name.error().message, HasSubstr("invalid name"));
    Status uid = prepare::ValidateClaimRef({"vms", "vm-gpu", bad});
    if (bad == "UPPER" || bad == "-leading") continue;  // letters, digits and '-' are UID-safe
    ASSERT_FALSE(uid.ok());
    EXPECT_THAT(uid.error().message, HasSubstr("invalid uid"));
    // Whatever the bytes, the message is printable text.
    for (char c : uid.error().message) {
      EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "unescaped byte " << int(c);
    }
  }
}

TEST_F(PathSafetyTest, MetadataWithHostileNamesIsRefusedAndWritesNothing) {
  const std::set<std::string> before = Tree(root_);
  for (const std::string& bad : HostileNames()) {
    SCOPED_TRACE(::testing::PrintToString(bad));
    struct Field {
      const char* name;
      std::function<void(cdi::RequestMetadata&)> set;
    };
    const std::vector<Field> fields = {
        {"namespace", [&](cdi::RequestMetadata& m) { m.claim_namespace = bad; }},
        {"claim", [&](cdi::RequestMetadata& m) { m.claim_name = bad; }},
        {"claim uid", [&](cdi::RequestMetadata& m) { m.claim_uid = bad; }},
        {"request", [&](cdi::RequestMetadata& m) { m.request = bad; }},
        {"pod claim name", [&](cdi::RequestMetadata& m) { m.pod_claim_name = bad; }},
    };
    for (const Field& field : fields) {
      cdi::RequestMetadata m = Good();
      field.set(m);
      if (std::string(field.name) == "claim uid" && (bad == "UPPER" || bad == "-leading")) {
        continue;
      }
      auto written = Metadata().Write(m);
      ASSERT_FALSE(written.ok()) << field.name;
      EXPECT_THAT(written.error().message, HasSubstr("refusing device metadata"));
      EXPECT_EQ(Tree(root_), before) << field.name << " wrote something";
    }
    EXPECT_FALSE(Metadata().RemoveClaim(bad, "vm-gpu", kUid).ok());
    EXPECT_FALSE(Metadata().RemoveClaim("vms", bad, kUid).ok());
  }
  EXPECT_EQ(Tree(root_), before);
  // The same store writes a good request where it should, and only there.
  ASSERT_TRUE(Metadata().Write(Good()).ok());
  for (const std::string& path : Tree(root_)) {
    if (before.count(path) != 0) continue;
    EXPECT_TRUE(path.rfind("a/data/dra-device-metadata", 0) == 0 || path.rfind("a/cdi/", 0) == 0)
        << path;
  }
}

TEST_F(PathSafetyTest, CdiSpecFileNamesCannotLeaveTheDirectory) {
  cdi::Spec spec;
  spec.kind = "vfio.dra.io/vfio";
  spec.devices.push_back({"dev", {{"/dev/vfio/1", "", 10, 1}}, {}});
  const std::set<std::string> before = Tree(root_);
  for (const std::string& bad :
       {std::string("../victim.json"), std::string("../../victim"), std::string("/tmp/x.json"),
        std::string(".."), std::string("a\0b.json", 8), std::string(300, 'x'),
        std::string("spec\xff.json")}) {
    SCOPED_TRACE(::testing::PrintToString(bad));
    EXPECT_FALSE(Cdi().Write(bad, spec).ok());
    EXPECT_FALSE(Cdi().Remove(bad).ok());
  }
  EXPECT_EQ(Tree(root_), before);
  EXPECT_TRUE(fs::exists(root_ / "victim"));
  EXPECT_TRUE(fs::exists(root_ / "a" / "victim.json"));
}

}  // namespace
}  // namespace vfio_dra::testing
