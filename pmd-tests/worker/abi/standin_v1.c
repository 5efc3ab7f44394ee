/* A stand-in for libmercury-worker.so.1 as 0.3.0 built it, for the linker
 * only: the same SONAME, the functions abi_trainer.c calls with their 0.3.0
 * prototypes (v1/mercury/worker_c.h), no symbol versions. Linking against it
 * leaves the trainer with the unversioned references a binary built against
 * that library has; abi_test.py then runs the trainer with the real library
 * in its place. Every body aborts: if this one is ever loaded, the test fails
 * loudly. */
#include <mercury/worker_c.h>
#include <stdlib.h>

const char* mercury_last_error(void) { abort(); }
void mercury_worker_options_init(mercury_worker_options* options) {
  (void)options;
  abort();
}
int mercury_worker_connect(const mercury_worker_options* options, mercury_worker** out) {
  (void)options, (void)out;
  abort();
}
void mercury_worker_destroy(mercury_worker* worker) {
  (void)worker;
  abort();
}
int mercury_worker_declare(mercury_worker* worker, const char* name, float* params, size_t elements,
                           int priority, uint32_t* key_out) {
  (void)worker, (void)name, (void)params, (void)elements, (void)priority, (void)key_out;
  abort();
}
int mercury_worker_start(mercury_worker* worker) {
  (void)worker;
  abort();
}
int mercury_worker_push_pull(mercury_worker* worker, uint32_t key, const float* grad, float* out,
                             size_t elements, mercury_handle** handle_out) {
  (void)worker, (void)key, (void)grad, (void)out, (void)elements, (void)handle_out;
  abort();
}
int mercury_worker_shutdown(mercury_worker* worker) {
  (void)worker;
  abort();
}
uint32_t mercury_worker_rank(const mercury_worker* worker) {
  (void)worker;
  abort();
}
uint32_t mercury_worker_workers(const mercury_worker* worker) {
  (void)worker;
  abort();
}
int mercury_handle_wait(mercury_handle* handle) {
  (void)handle;
  abort();
}
const char* mercury_handle_error(mercury_handle* handle) {
  (void)handle;
  abort();
}
void mercury_handle_release(mercury_handle* handle) {
  (void)handle;
  abort();
}
