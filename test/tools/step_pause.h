// StepPause: stops a daemon's thread at named prepare/unprepare/recovery steps until a test in
// another process lets it go, so that tests can force an interleaving of two daemon instances
// (on the simulated kernel or on the QEMU node) by events, never by sleeps.
//
// The protocol, through two FIFOs the test makes in one directory before starting the daemon:
//   <dir>/paused  the daemon writes "<step>\n" when a thread reaches a step it is to pause at;
//                 the test holds it open read-write for the whole run (so it never sees an end of
//                 file between two pauses) and waits for lines.
//   <dir>/resume  the paused thread opened it for reading before it announced the pause, and
//                 goes on when the test writes a line into it (or closes it).
// Each listed step pauses once (its first occurrence); other steps pass at once.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace vfio_dra::testing {

// A step hook that pauses at each step of `steps` (a comma-separated list) as above; a hook that
// does nothing when `steps` is empty. A FIFO that cannot be used aborts the process with a
// message: a test that asked to pause must not go on unpaused.
std::function<void(const std::string&)> MakeStepPause(const std::string& steps,
                                                      const std::string& dir);
// MakeStepPause with the steps and the directory the daemon's environment names:
//   VFIO_DRA_TEST_PAUSE_AT=STEP[,STEP...]  VFIO_DRA_TEST_PAUSE_DIR=DIR
std::function<void(const std::string&)> StepPauseFromEnvironment();

// The test's side. Waits until a thread pauses; returns the step's name, or "" after `seconds`.
// `paused_fd` is <dir>/paused opened O_RDWR.
std::string AwaitPause(int paused_fd, int seconds);
// Lets the thread paused in <dir> go on; false when no thread is paused there.
bool ResumePaused(const std::string& dir);

}  // namespace vfio_dra::testing
