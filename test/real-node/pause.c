// The pod sandbox's process (the role of registry.k8s.io/pause): it holds the pod's namespaces
// and does nothing until told to stop. Built static into the local sandbox image (images.sh), so
// the real node needs no registry.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

static void stop(int sig) { _exit(sig == SIGTERM || sig == SIGINT ? 0 : 2); }

int main(void) {
  signal(SIGTERM, stop);
  signal(SIGINT, stop);
  for (;;) pause();
}
