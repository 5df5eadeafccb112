// vfio-dra-plugin: the daemon's entry point; everything lives in RunCli.
#include "cmd/cli.h"

int main(int argc, char** argv) { return vfio_dra::cmd::RunCli(argc, argv, {}); }
