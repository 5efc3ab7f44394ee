/* A C trainer compiled against the installed worker library (its headers
 * and mercury-worker.pc only): proves the C ABI links, and that its errors
 * come back as statuses with texts. Run by link_test.sh. */
#include <mercury/worker_c.h>
#include <stdio.h>
#include <string.h>

static int expect(int got, int want, const char* what) {
  if (got != want) {
    fprintf(stderr, "%s: status %d, expected %d (%s)\n", what, got, want, mercury_last_error());
    return 1;
  }
  return 0;
}

int main(void) {
  int bad = 0;
  mercury_worker* w = NULL;
  mercury_worker_options o;
  mercury_worker_options_init(&o, sizeof o);
  /* No job file and no node: both from the environment (MERCURY_JOB, and
   * the launcher's rank), which link_test.sh sets to a missing file. */
  bad |= expect(mercury_worker_connect(&o, &w), MERCURY_E_WORKER, "connect from the environment");
  if (strstr(mercury_last_error(), "/nonexistent/env-job.yaml") == NULL) {
    fprintf(stderr, "MERCURY_JOB was not read: %s\n", mercury_last_error());
    bad = 1;
  }
  o.job_file = "/nonexistent/job.yaml";
  o.node = "w0";
  bad |= expect(mercury_worker_connect(&o, &w), MERCURY_E_WORKER, "connect to a missing job");
  if (strstr(mercury_last_error(), "/nonexistent/job.yaml") == NULL) {
    fprintf(stderr, "the error does not name the file: %s\n", mercury_last_error());
    bad = 1;
  }
  bad |= expect(mercury_handle_wait(NULL), MERCURY_E_USAGE, "wait on NULL");
  mercury_worker_destroy(NULL);
  if (!bad) printf("trainer.c: linked against libmercury-worker, errors as expected\n");
  return bad;
}
