// vfio-dra-plugin: the daemon's entry point; everything lives in RunCli.
#include "plugin/cli.h"

int main(int argc, char** argv) { return vfio_dra::plugin::RunCli(argc, argv, {}); }
