// vfio-check: what a VMM in a pod does first with what the kubelet and the runtime handed it.
// For /dev/vfio/vfio and every group node under /dev/vfio it prints one line: the node's
// major:minor, whether it opens, and for a group whether the kernel calls it viable
// (VFIO_GROUP_GET_STATUS), which holds only when every device of the group is on a VFIO driver.
// Exit code 0 when the container node opens and at least one group is viable. Built static into
// the real-node test image (images.sh): the image has no libc.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/vfio.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static int describe(const char* path, struct stat* st) {
  if (stat(path, st) != 0) {
    printf("%s missing: %s\n", path, strerror(errno));
    return -1;
  }
  printf("%s char=%d major:minor=%u:%u ", path, S_ISCHR(st->st_mode), major(st->st_rdev),
         minor(st->st_rdev));
  return 0;
}

int main(void) {
  struct stat st;
  int ok = 1, viable = 0;
  if (describe("/dev/vfio/vfio", &st) == 0) {
    int fd = open("/dev/vfio/vfio", O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      printf("open=%s\n", strerror(errno));
      ok = 0;
    } else {
      printf("open=ok api=%d\n", ioctl(fd, VFIO_GET_API_VERSION));
      close(fd);
    }
  } else {
    ok = 0;
  }
  DIR* dir = opendir("/dev/vfio");
  struct dirent* entry;
  while (dir != NULL && (entry = readdir(dir)) != NULL) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    char path[300];
    snprintf(path, sizeof path, "/dev/vfio/%s", entry->d_name);
    if (describe(path, &st) != 0) continue;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      printf("open=%s\n", strerror(errno));
      continue;
    }
    struct vfio_group_status status = {.argsz = sizeof status};
    if (ioctl(fd, VFIO_GROUP_GET_STATUS, &status) != 0) {
      printf("open=ok status=%s\n", strerror(errno));
    } else {
      int is_viable = (status.flags & VFIO_GROUP_FLAGS_VIABLE) != 0;
      printf("open=ok viable=%d\n", is_viable);
      viable |= is_viable;
    }
    close(fd);
  }
  if (dir != NULL) closedir(dir);
  return ok && viable ? 0 : 1;
}
