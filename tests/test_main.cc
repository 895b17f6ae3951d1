// Test entry point: runs every test, prints which targets ran, and fails when
// a target this CPU supports (or one named in SIMDATTN_EXPECT_TARGETS) did not
// run, or, where SIMDATTN_TEST_TARGETS narrows the run, one it names did not.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "lib/dispatch.h"
#include "simdattn/attention.h"
#include "tests/test_util.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  // Where the CPU has no AMX (or SIMDATTN_TEST_AMX_EMULATION=1 asks for it),
  // the AVX3_AMX entry runs its tile emulator, so that its kernel is tested
  // on every CPU with AVX-512.
  const std::vector<std::string> hw = simdattn::AvailableTargets();
  const char* force = std::getenv("SIMDATTN_TEST_AMX_EMULATION");
  if ((force != nullptr && std::string(force) == "1") ||
      std::find(hw.begin(), hw.end(), "AVX3_AMX") == hw.end()) {
    simdattn::SetAmxEmulation(true);
    simdattn::test::SetAmxEmulated(true);
  }
  const int rc = RUN_ALL_TESTS();

  const std::set<std::string> ran = simdattn::test::TargetsRun();
  std::string line = "targets run:";
  if (const char* cpu = std::getenv("QEMU_CPU")) {
    line = std::string("targets run (QEMU_CPU=") + cpu + "):";
  }
  for (const std::string& t : simdattn::AvailableTargets()) {
    if (ran.count(t)) line += " " + t;
  }
  std::printf("%s\n", line.c_str());

  // A filtered run (--gtest_filter) checks nothing about targets.
  if (testing::GTEST_FLAG(filter) != "*") return rc;

  // Every available target (plus those SIMDATTN_EXPECT_TARGETS names, which
  // must be detected) runs the suite, unless SIMDATTN_TEST_TARGETS narrows
  // the run to some of them: then exactly those must run. tests/CMakeLists.txt
  // spreads the aarch64 targets over qemu CPU models that way, each target and
  // vector length once.
  const std::vector<std::string> avail = simdattn::AvailableTargets();
  int missing = 0;
  std::set<std::string> expected;
  simdattn::test::TargetsFromEnv("SIMDATTN_EXPECT_TARGETS", &expected);
  for (const std::string& t : expected) {
    if (std::find(avail.begin(), avail.end(), t) == avail.end()) {
      std::printf("[  FAILED  ] target %s is not available\n", t.c_str());
      ++missing;
    }
  }
  std::set<std::string> tested;
  if (simdattn::test::TargetsFromEnv("SIMDATTN_TEST_TARGETS", &tested)) {
    expected = tested;
  } else {
    expected.insert(avail.begin(), avail.end());
  }
  for (const std::string& t : expected) {
    if (!ran.count(t)) {
      std::printf("[  FAILED  ] target %s did not run\n", t.c_str());
      ++missing;
    }
  }
  return (rc != 0 || missing != 0) ? 1 : 0;
}
