// A C++ trainer compiled against the installed worker library (its public
// headers and mercury-worker.pc only). Run by link_test.sh.
#include <mercury/worker.h>

#include <cstdio>
#include <string>

int main() {
  mercury::worker::WorkerOptions options;
  options.job_file = "/nonexistent/job.yaml";
  options.node = "w0";
  try {
    mercury::worker::Worker w(options);
  } catch (const mercury::worker::WorkerError& e) {
    if (std::string(e.what()).find("/nonexistent/job.yaml") == std::string::npos) {
      std::fprintf(stderr, "the error does not name the file: %s\n", e.what());
      return 1;
    }
    std::printf("trainer.cpp: linked against libmercury-worker, WorkerError as expected\n");
    return 0;
  }
  std::fprintf(stderr, "a missing job file did not throw\n");
  return 1;
}
