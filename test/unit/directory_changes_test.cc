#include "base/directory_changes.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace vfio_dra {
namespace {

namespace fs = std::filesystem;

class DirectoryChangesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vfio-dra-dirchanges-XXXXXX";
    root_ = mkdtemp(tmpl);
    dir_ = root_ + "/watched";
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string root_;
  std::string dir_;
};

std::set<std::string> Names(std::initializer_list<const char*> names) {
  return std::set<std::string>(names.begin(), names.end());
}

TEST_F(DirectoryChangesTest, ReportsEveryEntryCreatedReplacedWrittenOrRemovedSinceTheLastTake) {
  DirectoryChanges changes(dir_);
  EXPECT_FALSE(changes.unwatched().has_value());
  EXPECT_TRUE(changes.Take().everything) << "nothing is known before the first Take";
  DirectoryChanges::Batch quiet = changes.Take();
  EXPECT_FALSE(quiet.everything);
  EXPECT_TRUE(quiet.names.empty());

  std::ofstream(dir_ + "/.a.tmp") << "1";
  fs::rename(dir_ + "/.a.tmp", dir_ + "/a");
  DirectoryChanges::Batch replaced = changes.Take();
  EXPECT_FALSE(replaced.everything);
  EXPECT_EQ(replaced.names, Names({".a.tmp", "a"}));

  // Written in place: reported once the writer closes it.
  const int fd = ::open((dir_ + "/a").c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "2", 1), 1);
  EXPECT_TRUE(changes.Take().names.empty()) << "not before the close";
  ::close(fd);
  EXPECT_EQ(changes.Take().names, Names({"a"}));

  fs::rename(dir_ + "/a", dir_ + "/b");
  fs::create_directory(dir_ + "/c");
  EXPECT_EQ(changes.Take().names, Names({"a", "b", "c"}));
  fs::remove(dir_ + "/b");
  EXPECT_EQ(changes.Take().names, Names({"b"}));
  // Outside the directory: not its entries.
  std::ofstream(root_ + "/elsewhere") << "x";
  std::ofstream(dir_ + "/c/inside") << "x";
  EXPECT_TRUE(changes.Take().names.empty());
}

// A directory replaced (removed and made again, or renamed away) is a new directory: its
// entries are all unknown, and it is watched from then on.
TEST_F(DirectoryChangesTest, ADirectoryReplacedIsReadWholeAndWatchedAgain) {
  DirectoryChanges changes(dir_);
  changes.Take();
  fs::remove_all(dir_);
  fs::create_directories(dir_);
  EXPECT_TRUE(changes.Take().everything);
  std::ofstream(dir_ + "/a") << "1";
  DirectoryChanges::Batch after = changes.Take();
  EXPECT_FALSE(after.everything);
  EXPECT_EQ(after.names, Names({"a"}));

  fs::rename(dir_, root_ + "/moved");
  fs::create_directories(dir_);
  EXPECT_TRUE(changes.Take().everything);
  std::ofstream(root_ + "/moved/b") << "1";
  std::ofstream(dir_ + "/c") << "1";
  EXPECT_EQ(changes.Take().names, Names({"c"})) << "the path is watched, not the old directory";
}

// A directory above the watched one renamed, and the path made again: the watched directory sends
// no event, but the path names another directory now.
TEST_F(DirectoryChangesTest, APathThatNamesAnotherDirectoryIsReadWholeAndWatchedAgain) {
  fs::create_directories(root_ + "/parent/watched");
  DirectoryChanges changes(root_ + "/parent/watched");
  changes.Take();
  fs::rename(root_ + "/parent", root_ + "/old-parent");
  fs::create_directories(root_ + "/parent/watched");
  std::ofstream(root_ + "/parent/watched/a") << "1";
  EXPECT_TRUE(changes.Take().everything);
  std::ofstream(root_ + "/old-parent/watched/b") << "1";
  std::ofstream(root_ + "/parent/watched/c") << "1";
  EXPECT_EQ(changes.Take().names, Names({"c"}));
}

TEST_F(DirectoryChangesTest, WithoutADirectoryToWatchEveryTakeSaysEverythingUntilThereIsOne) {
  DirectoryChanges changes(root_ + "/missing");
  ASSERT_TRUE(changes.unwatched().has_value());
  EXPECT_NE(changes.unwatched()->find(root_ + "/missing"), std::string::npos);
  EXPECT_NE(changes.unwatched()->find("No such file"), std::string::npos) << *changes.unwatched();
  EXPECT_TRUE(changes.Take().everything);
  EXPECT_TRUE(changes.Take().everything);
  fs::create_directories(root_ + "/missing");
  EXPECT_TRUE(changes.Take().everything) << "the Take that sets the watch";
  EXPECT_FALSE(changes.unwatched().has_value());
  std::ofstream(root_ + "/missing/a") << "1";
  EXPECT_EQ(changes.Take().names, Names({"a"}));
}

// More changes than the kernel queues: some are lost, so everything is unknown.
TEST_F(DirectoryChangesTest, AnOverflowedEventQueueSaysEverything) {
  DirectoryChanges changes(dir_);
  changes.Take();
  long queued = 16384;
  std::ifstream("/proc/sys/fs/inotify/max_queued_events") >> queued;
  // A create, the close of the write and a remove: three events the kernel does not merge.
  for (long i = 0; i < queued / 2 + 8; ++i) {
    const int fd = ::open((dir_ + "/x").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    ::close(fd);
    ASSERT_EQ(::unlink((dir_ + "/x").c_str()), 0);
  }
  std::ofstream(dir_ + "/lost") << "1";
  DirectoryChanges::Batch overflowed = changes.Take();
  EXPECT_TRUE(overflowed.everything);
  EXPECT_TRUE(overflowed.names.empty());
  std::ofstream(dir_ + "/a") << "1";
  EXPECT_EQ(changes.Take().names, Names({"a"})) << "watched as before";
}

}  // namespace
}  // namespace vfio_dra
