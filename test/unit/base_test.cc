#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "base/base64.h"
#include "base/file_io.h"
#include "base/log.h"
#include "base/sha256.h"
#include "base/text.h"

namespace vfio_dra {
namespace {

TEST(Base64, DecodesPaddedUnpaddedAndWrapped) {
  EXPECT_EQ(*Base64Decode("aGVsbG8gd29ybGQ="), "hello world");
  EXPECT_EQ(*Base64Decode("aGVsbG8gd29ybGQ"), "hello world");
  EXPECT_EQ(*Base64Decode("aGVs\nbG8="), "hello");
  EXPECT_EQ(*Base64Decode(""), "");
}

TEST(Base64, RejectsForeignCharacters) {
  auto bad = Base64Decode("aGV*bG8=");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("offset 3"), std::string::npos);
  EXPECT_FALSE(Base64Decode("aGVsbG8=x").ok());
}

TEST(Sha256, MatchesTheStandardVectorAndKeepsFieldsApart) {
  // FIPS 180-2's "abc" example.
  const Sha256 abc = Sha256Of("abc");
  EXPECT_EQ(abc[0], 0xba);
  EXPECT_EQ(abc[1], 0x78);
  EXPECT_EQ(abc[31], 0xad);
  // Field boundaries are part of what is digested.
  EXPECT_NE(Sha256Stream().Field("ab").Field("c").Finish(),
            Sha256Stream().Field("a").Field("bc").Finish());
  // A field's type is part of it: 0 and "" (whose length is 0) differ, and so do two ints and a
  // string holding their bytes.
  EXPECT_NE(Sha256Stream().Field(int64_t{0}).Finish(), Sha256Stream().Field("").Finish());
  EXPECT_NE(Sha256Stream().Field(int64_t{8}).Field(int64_t{3}).Finish(),
            Sha256Stream().Field(std::string_view("\x03\0\0\0\0\0\0\0", 8)).Finish());
  EXPECT_EQ(Sha256Stream().Field("ab").Field(int64_t{-3}).Finish(),
            Sha256Stream().Field("ab").Field(int64_t{-3}).Finish());
}

TEST(Sha1, MatchesTheStandardVector) {
  // FIPS 180-2's "abc" example: a9993e36 4706816a ba3e2571 7850c26c 9cd0d89d.
  const Sha1 abc = Sha1Of("abc");
  EXPECT_EQ(abc[0], 0xa9);
  EXPECT_EQ(abc[1], 0x99);
  EXPECT_EQ(abc[8], 0xba);
  EXPECT_EQ(abc[19], 0x9d);
}

TEST(LogQuote, QuotesOnlyWhenNeeded) {
  EXPECT_EQ(LogQuote("plain"), "plain");
  EXPECT_EQ(LogQuote("two words"), "\"two words\"");
  EXPECT_EQ(LogQuote(""), "\"\"");
  EXPECT_EQ(LogQuote(std::string("a\nb\0c", 5)), "\"a\\x0ab\\x00c\"");
  EXPECT_EQ(LogQuote("say \"hi\""), "\"say \\\"hi\\\"\"");
}

TEST(EscapeForDisplay, EscapesControlAndNonAsciiAndTruncates) {
  EXPECT_EQ(EscapeForDisplay(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(EscapeForDisplay("\xff"), "\\xff");
  EXPECT_EQ(EscapeForDisplay(std::string(300, 'x'), 10), std::string(10, 'x') + "...");
}

TEST(WriteFileAtomically, WritesContentWithModeAndLeavesNoTemporaryFile) {
  char tmpl[] = "/tmp/vfio-dra-fileio-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string path = dir + "/state.json";
  ASSERT_TRUE(WriteFileAtomically(path, "first", 0640).ok());
  ASSERT_TRUE(WriteFileAtomically(path, "second", 0640).ok());
  EXPECT_EQ(*ReadFileToString(path), "second");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 1);
  std::filesystem::remove_all(dir);
}

// Every fsync of a write goes through its DiskSync: none for a volatile one, the file's for one
// whose caller syncs the directory itself, both for a durable one; a failed one fails the write.
TEST(WriteFileAtomically, RunsTheFsyncsItsDurabilityNeedsThroughItsDiskSync) {
  char tmpl[] = "/tmp/vfio-dra-fileio-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string path = dir + "/state.json";
  std::vector<std::string> syncs;
  DiskSync sync;
  sync.file = [&](int fd, const std::string& file) {
    syncs.push_back(file.starts_with(dir + "/.state.json.tmp-") && fd >= 0 ? "temporary file"
                                                                           : "file " + file);
    return Status::Ok();
  };
  sync.directory = [&](const std::string& directory) {
    syncs.push_back("directory " + directory);
    return Status::Ok();
  };
  ASSERT_TRUE(WriteFileAtomically(path, "a", 0600, Durability::kVolatile, sync).ok());
  EXPECT_TRUE(syncs.empty());
  ASSERT_TRUE(WriteFileAtomically(path, "b", 0600, Durability::kDataOnly, sync).ok());
  EXPECT_THAT(syncs, ::testing::ElementsAre("temporary file"));
  syncs.clear();
  ASSERT_TRUE(WriteFileAtomically(path, "c", 0600, Durability::kDurable, sync).ok());
  EXPECT_THAT(syncs, ::testing::ElementsAre("temporary file", "directory " + dir));
  sync.file = [](int, const std::string& file) {
    return Status(MakeError(ErrorKind::kUnavailable, "cannot fsync " + file));
  };
  Status failed = WriteFileAtomically(path, "d", 0600, Durability::kDurable, sync);
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.error().message,
              ::testing::HasSubstr("cannot fsync " + dir + "/.state.json.tmp-"));
  EXPECT_EQ(*ReadFileToString(path), "c");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 1) << "the temporary file of the failed write is gone";
  std::filesystem::remove_all(dir);
}

TEST(SplitFilePath, GivesTheDirectoryAndTheName) {
  EXPECT_EQ(SplitFilePath("/var/run/cdi/a.json"),
            (std::pair<std::string, std::string>{"/var/run/cdi", "a.json"}));
  EXPECT_EQ(SplitFilePath("a.json"), (std::pair<std::string, std::string>{".", "a.json"}));
  EXPECT_EQ(SplitFilePath("/a.json"), (std::pair<std::string, std::string>{"/", "a.json"}));
  EXPECT_EQ(SplitFilePath("d/.a.json.tmp-1"),
            (std::pair<std::string, std::string>{"d", ".a.json.tmp-1"}));
}

TEST(TemporaryFileStandsFor, NamesTheFileOfAWritesTemporaryOnly) {
  EXPECT_EQ(TemporaryFileStandsFor(TemporaryFilePrefix("a.json") + "17"), "a.json");
  EXPECT_EQ(TemporaryFileStandsFor(".a.json.tmp-"), "a.json");
  for (const char* other : {"a.json", ".", "..", ".a.json", "a.json.tmp-1", "..tmp-1"}) {
    EXPECT_EQ(TemporaryFileStandsFor(other), std::nullopt) << other;
  }
}

// An unprepare removes a claim's files of one directory with one listing: the files, and the
// temporary files of exactly those names that writes cut short by a crash left; nothing else.
TEST(RemoveFilesAndTemporaries, RemovesTheFilesAndTheirLeftoversOnly) {
  char tmpl[] = "/tmp/vfio-dra-remove-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  for (const char* name : {"a.json", ".a.json.tmp-1", ".a.json.tmp-22", ".b.json.tmp-3", "c.json",
                           ".c.json.tmp-4", ".ab.json.tmp-5", "a.json.tmp-6"}) {
    std::ofstream(dir + "/" + name) << "x";
  }
  ASSERT_TRUE(RemoveFilesAndTemporaries(dir, {"a.json", "b.json"}).ok());
  std::set<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    left.insert(e.path().filename().string());
  }
  EXPECT_EQ(left,
            (std::set<std::string>{"c.json", ".c.json.tmp-4", ".ab.json.tmp-5", "a.json.tmp-6"}));
  EXPECT_TRUE(RemoveFilesAndTemporaries(dir + "/gone", {"a.json"}).ok()) << "nothing to remove";
  std::filesystem::remove_all(dir);
}

// Files the caller cannot name one by one (a claim's metadata specs, one per request) go by
// prefix and suffix in the same listing, with their leftovers; a name that only contains the
// prefix, another suffix and a directory stay, and an empty prefix is refused.
TEST(RemoveFilesAndTemporaries, RemovesFilesByPrefixInTheSameListing) {
  char tmpl[] = "/tmp/vfio-dra-remove-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  for (const char* name :
       {"a.json", "m_u1_gpu.json", "m_u1_nic.json", ".m_u1_x.json.tmp-1", "m_u2_gpu.json",
        ".m_u2_gpu.json.tmp-2", "x_m_u1_gpu.json", "m_u1_gpu.json.bak"}) {
    std::ofstream(dir + "/" + name) << "x";
  }
  std::filesystem::create_directory(dir + "/m_u1_dir.json");
  EXPECT_FALSE(RemoveFilesAndTemporaries(dir, {}, {{"", ".json"}}).ok()) << "matches everything";
  ASSERT_TRUE(RemoveFilesAndTemporaries(dir, {"a.json"}, {{"m_u1_", ".json"}}).ok());
  std::set<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    left.insert(e.path().filename().string());
  }
  EXPECT_EQ(left, (std::set<std::string>{"m_u2_gpu.json", ".m_u2_gpu.json.tmp-2", "x_m_u1_gpu.json",
                                         "m_u1_gpu.json.bak", "m_u1_dir.json"}));
  std::filesystem::remove_all(dir);
}

// The stat that spares each write the creation attempt must not take a file for the directory.
TEST(EnsureDirectory, CreatesAMissingOneAndRefusesAFile) {
  char tmpl[] = "/tmp/vfio-dra-ensure-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  EXPECT_TRUE(EnsureDirectory(dir).ok());
  EXPECT_TRUE(EnsureDirectory(dir + "/a/b").ok());
  EXPECT_TRUE(std::filesystem::is_directory(dir + "/a/b"));
  ASSERT_TRUE(WriteFileAtomically(dir + "/file", "x", 0600).ok());
  Status file = EnsureDirectory(dir + "/file");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.error().message.find(dir + "/file"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(ReadFileToString, ReportsMissingFileAndSizeCap) {
  auto missing = ReadFileToString("/nonexistent/vfio-dra");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().kind, ErrorKind::kNotFound);
  EXPECT_NE(missing.error().message.find("/nonexistent/vfio-dra"), std::string::npos);
  char tmpl[] = "/tmp/vfio-dra-fileio-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  ASSERT_TRUE(WriteFileAtomically(dir + "/big", std::string(100, 'x'), 0600).ok());
  auto big = ReadFileToString(dir + "/big", 10);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message.find("larger than 10 bytes"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(FileIo, DurabilityFailuresAreErrorsNamingThePath) {
  Status missing = SyncDirectory("/nonexistent-vfio-dra-dir");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("/nonexistent-vfio-dra-dir"), std::string::npos);
  Status not_a_dir = SyncDirectory("/proc/self/status");
  EXPECT_FALSE(not_a_dir.ok());
  char tmpl[] = "/tmp/vfio-dra-sync-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  EXPECT_TRUE(SyncDirectory(dir).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace vfio_dra
