// vfio-check: what a VMM in a pod does first with what the kubelet and the runtime handed it.
// For /dev/vfio/vfio and every group node under /dev/vfio it prints one line: the node's
// major:minor, whether it opens, and for a group whether the kernel calls it viable
// (VFIO_GROUP_GET_STATUS), which holds only when every device of the group is on a VFIO driver.
// With DEVICE (a PCI address or an mdev UUID, as KubeVirt's metadata file names it) it then does
// what a VMM does first to assign it: the group into a container with the type1 IOMMU, the
// device's fd from the group, its regions and interrupts, and a page mapped for DMA.
// Exit code 0 when the container node opens, a group is viable and the device (if named) is
// assigned. With --hold after DEVICE, once assigned it prints "holding" and keeps everything open
// until killed, as a VMM left behind by its pod does. With --lock FILE it first takes an exclusive
// flock on FILE and runs the check under it: a group opens in one process at a time, so the pods
// of one shared claim (and the soak's node check) take turns instead of finding it busy. Built
// static into the real-node test image (images.sh): the image has no libc.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/vfio.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
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

// Assigns `device` from the group open at `group_fd` as a VMM would; 0 on success. With `hold`,
// never returns after a success: the device, its container and its group stay open.
static int assign(int group_fd, const char* device, int hold) {
  int container = open("/dev/vfio/vfio", O_RDWR | O_CLOEXEC);
  if (container < 0) return -1;
  int result = -1;
  struct vfio_device_info info = {.argsz = sizeof info};
  if (ioctl(group_fd, VFIO_GROUP_SET_CONTAINER, &container) != 0) {
    printf("device=%s set-container=%s\n", device, strerror(errno));
  } else if (ioctl(container, VFIO_SET_IOMMU, VFIO_TYPE1v2_IOMMU) != 0) {
    printf("device=%s set-iommu=%s\n", device, strerror(errno));
  } else {
    int fd = ioctl(group_fd, VFIO_GROUP_GET_DEVICE_FD, device);
    if (fd < 0) {
      printf("device=%s get-device-fd=%s\n", device, strerror(errno));
    } else if (ioctl(fd, VFIO_DEVICE_GET_INFO, &info) != 0) {
      printf("device=%s get-info=%s\n", device, strerror(errno));
    } else {
      void* page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      struct vfio_iommu_type1_dma_map map = {
          .argsz = sizeof map,
          .flags = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
          .vaddr = (unsigned long)page,
          .iova = 0,
          .size = 4096};
      const int mapped = page != MAP_FAILED ? ioctl(container, VFIO_IOMMU_MAP_DMA, &map) : -1;
      printf("device=%s fd=ok regions=%u irqs=%u dma-map=%s\n", device, info.num_regions,
             info.num_irqs, mapped == 0 ? "ok" : strerror(errno));
      result = mapped == 0 ? 0 : -1;
      if (result == 0 && hold) {
        printf("holding\n");
        fflush(stdout);
        for (;;) pause();
      }
    }
    if (fd >= 0) close(fd);
  }
  close(container);
  return result;
}

int main(int argc, char** argv) {
  const char* device = argc > 1 ? argv[1] : NULL;
  int hold = 0;
  for (int i = 2; i < argc; i++) {
    if (strcmp(argv[i], "--hold") == 0) {
      hold = 1;
    } else if (strcmp(argv[i], "--lock") == 0 && i + 1 < argc) {
      const int lock = open(argv[++i], O_RDWR | O_CREAT | O_CLOEXEC, 0600);
      if (lock < 0 || flock(lock, LOCK_EX) != 0) {
        printf("lock %s: %s\n", argv[i], strerror(errno));
        return 1;
      }  // held until exit
    } else {
      printf("usage: vfio-check [DEVICE [--hold] [--lock FILE]]\n");
      return 2;
    }
  }
  int assigned = device == NULL;
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
      if (is_viable && !assigned && assign(fd, device, hold) == 0) assigned = 1;
    }
    close(fd);
  }
  if (dir != NULL) closedir(dir);
  if (!assigned) printf("device=%s not assigned from any group\n", device);
  return ok && viable && assigned ? 0 : 1;
}
