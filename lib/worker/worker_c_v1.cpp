// The C ABI's entry points as libmercury-worker.so.1 had them before its
// options carried their size (0.1.0 to 0.3.0), exported as symbol version
// MERCURY_1 (libmercury-worker.map). A trainer linked against one of those
// libraries has unversioned references, which glibc's dynamic linker binds
// to a library's oldest version: these two functions, which take the old
// struct and hand it on to today's. Built into the shared library only:
// symbol versions exist in a shared object alone.
#include "mercury/worker_c.h"

namespace {

// mercury_worker_options as 0.3.0's mercury/worker_c.h laid it out: never
// to change.
struct OptionsV1 {
  const char* job_file;
  const char* node;
  const char* const* eal_args;
  size_t eal_argc;
  int eal_mode;
  uint32_t start_timeout_ms;
  int idle_backoff;
  const char* timeline;
};
static_assert(sizeof(void*) != 8 || sizeof(OptionsV1) == 56, "the 0.3.0 layout is fixed");

}  // namespace

extern "C" {

// Not mercury_*: the version script exports them under their old names only.
void v1_mercury_worker_options_init(OptionsV1* o);
int v1_mercury_worker_connect(const OptionsV1* o, mercury_worker** out);

__asm__(".symver v1_mercury_worker_options_init,mercury_worker_options_init@MERCURY_1");
__asm__(".symver v1_mercury_worker_connect,mercury_worker_connect@MERCURY_1");

void v1_mercury_worker_options_init(OptionsV1* o) {
  if (o == nullptr) return;
  mercury_worker_options d;
  mercury_worker_options_init(&d, sizeof d);
  *o = OptionsV1{d.job_file,         d.node,         d.eal_args, d.eal_argc, d.eal_mode,
                 d.start_timeout_ms, d.idle_backoff, d.timeline};
}

int v1_mercury_worker_connect(const OptionsV1* o, mercury_worker** out) {
  if (o == nullptr) return mercury_worker_connect(nullptr, out);  // refused, with its text
  mercury_worker_options d;
  mercury_worker_options_init(&d, sizeof d);
  d.job_file = o->job_file;
  d.node = o->node;
  d.eal_args = o->eal_args;
  d.eal_argc = o->eal_argc;
  d.eal_mode = o->eal_mode;
  d.start_timeout_ms = o->start_timeout_ms;
  d.idle_backoff = o->idle_backoff;
  d.timeline = o->timeline;
  return mercury_worker_connect(&d, out);
}

}  // extern "C"
