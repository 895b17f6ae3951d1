// Test entry point: runs every test, prints which targets ran, and fails when
// a target this CPU supports (or one named in SIMDATTN_EXPECT_TARGETS) did not.

#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "simdattn/attention.h"
#include "tests/test_util.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
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

  std::set<std::string> expected;
  for (const std::string& t : simdattn::AvailableTargets()) expected.insert(t);
  if (const char* env = std::getenv("SIMDATTN_EXPECT_TARGETS")) {
    std::istringstream is(env);
    std::string t;
    while (is >> t) expected.insert(t);
  }
  int missing = 0;
  for (const std::string& t : expected) {
    if (!ran.count(t)) {
      std::printf("[  FAILED  ] target %s did not run\n", t.c_str());
      ++missing;
    }
  }
  return (rc != 0 || missing != 0) ? 1 : 0;
}
