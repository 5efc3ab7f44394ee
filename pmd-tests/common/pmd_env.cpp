#include "pmd_env.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <exception>

#include "eal_args.h"
#include "net/eal.h"

namespace mercury::pmdtest {

int run_all_tests(int argc, char** argv, const std::vector<std::string>& extra_eal_args) {
  std::string name = argv[0];
  name = name.substr(name.find_last_of('/') + 1);
  // gtest sees argv[0] and whatever follows "--".
  std::vector<char*> gargs = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) {
      for (int j = i + 1; j < argc; ++j) gargs.push_back(argv[j]);
      break;
    }
    gargs.push_back(argv[i]);  // meson passes gtest flags directly
  }
  int gargc = static_cast<int>(gargs.size());
  ::testing::InitGoogleTest(&gargc, gargs.data());
  try {
    net::Eal eal(eal_args(name, extra_eal_args));
    return RUN_ALL_TESTS();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), e.what());
    return 1;
  }
}

}  // namespace mercury::pmdtest
