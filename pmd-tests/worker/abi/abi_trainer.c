/* A C trainer for abi_test.py, built twice from this one source:
 *  - against the frozen 0.3.0 header (v1/, -DABI_V1) and linked against a
 *    stand-in of that library (standin_v1.c): a binary built before the
 *    options carried their size;
 *  - against today's mercury/worker_c.h, linked against the real library.
 * Each connects to a real job (ps-server over net_memif), declares two
 * tensors, checks that version 0 is rank 0's parameters and that every
 * push_pull of ROUNDS delivers the rank-order average bit for bit, and says
 * "exact" on its last line. Exit status 0 only if every check held.
 *
 *   abi_trainer JOB NODE [newer]
 * `newer` (today's header only): the options struct as a caller built against
 * a newer header has it, two fields longer; a nonzero one must be refused,
 * zeros accepted. */
#include <mercury/worker_c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROUNDS 3
#define SMALL 100
#define LARGE 30000 /* several 9000-byte chunks */

static int failed(const char* what, int status) {
  fprintf(stderr, "%s: status %d: %s\n", what, status, mercury_last_error());
  return 1;
}

/* Exact in float32 (multiples of 1/8 below 2^12), different per rank,
 * round and element. */
static float gradient(uint32_t rank, int round, size_t i) {
  return (float)((int)((i * 7 + (size_t)round * 13 + rank * 29) % 101) - 50) * 0.125f;
}

/* What the server returns with optimizer `sum`: the rank-order sum times
 * 1/n, in float32 (-ffp-contract=off), as lib/agg computes it. */
static float average(uint32_t workers, int round, size_t i) {
  float s = gradient(0, round, i);
  for (uint32_t r = 1; r < workers; ++r) s = s + gradient(r, round, i);
  return s * (1.0f / (float)workers);
}

#ifdef ABI_V1
/* The 0.3.0 layout: init must set its defaults and write nothing past it. */
static int connect_worker(const char* job, const char* node, int newer, mercury_worker** w) {
  struct {
    mercury_worker_options o;
    unsigned char canary[16];
  } s;
  memset(&s, 0xa5, sizeof s);
  if (newer) {
    fprintf(stderr, "`newer` needs today's header\n");
    return 1;
  }
  mercury_worker_options_init(&s.o);
  for (size_t i = 0; i < sizeof s.canary; ++i) {
    if (s.canary[i] != 0xa5) {
      fprintf(stderr, "mercury_worker_options_init wrote past the 0.3.0 struct\n");
      return 1;
    }
  }
  if (s.o.job_file != NULL || s.o.node != NULL || s.o.eal_args != NULL || s.o.eal_argc != 0 ||
      s.o.eal_mode != MERCURY_EAL_AUTO || s.o.start_timeout_ms != 30000 || s.o.idle_backoff != 1 ||
      s.o.timeline != NULL) {
    fprintf(stderr, "mercury_worker_options_init did not set the 0.3.0 defaults\n");
    return 1;
  }
  printf("options: the 0.3.0 layout (%zu bytes), defaults set, nothing written past it\n",
         sizeof s.o);
  s.o.job_file = job;
  s.o.node = node;
  const int st = mercury_worker_connect(&s.o, w);
  return st == MERCURY_OK ? 0 : failed("connect", st);
}
#else
static int connect_worker(const char* job, const char* node, int newer, mercury_worker** w) {
  if (!newer) {
    mercury_worker_options o;
    int st = mercury_worker_options_init(&o, sizeof o);
    if (st != MERCURY_OK) return failed("options_init", st);
    if (o.size != sizeof o || o.start_timeout_ms != 30000 || o.idle_backoff != 1) {
      fprintf(stderr, "mercury_worker_options_init: size %u, defaults not set\n", o.size);
      return 1;
    }
    printf("options: today's layout (%zu bytes)\n", sizeof o);
    o.job_file = job;
    o.node = node;
    st = mercury_worker_connect(&o, w);
    return st == MERCURY_OK ? 0 : failed("connect", st);
  }
  /* A caller built against a header with two more fields. */
  struct {
    mercury_worker_options known;
    int64_t dtype;
    const char* more;
  } n;
  memset(&n, 0xa5, sizeof n);
  int st = mercury_worker_options_init(&n.known, sizeof n);
  if (st != MERCURY_OK) return failed("options_init", st);
  if (n.known.size != sizeof n || n.dtype != 0 || n.more != NULL) {
    fprintf(stderr, "mercury_worker_options_init: size %u, unknown fields not zeroed\n",
            n.known.size);
    return 1;
  }
  n.known.job_file = job;
  n.known.node = node;
  n.dtype = 2; /* an option this library does not have */
  st = mercury_worker_connect(&n.known, w);
  if (st != MERCURY_E_USAGE ||
      strstr(mercury_last_error(), "sets an option this library does not have") == NULL) {
    fprintf(stderr, "a newer caller's unknown option was not refused: status %d: %s\n", st,
            mercury_last_error());
    return 1;
  }
  printf("options: a newer caller's (%zu bytes); refused with a field set: %s\n", sizeof n,
         mercury_last_error());
  n.dtype = 0;
  st = mercury_worker_connect(&n.known, w);
  return st == MERCURY_OK ? 0 : failed("connect with the unknown fields zero", st);
}
#endif

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: abi_trainer JOB NODE [newer]\n");
    return 2;
  }
  const int newer = argc > 3 && strcmp(argv[3], "newer") == 0;
  mercury_worker* w = NULL;
  if (connect_worker(argv[1], argv[2], newer, &w) != 0) return 1;
  const uint32_t rank = mercury_worker_rank(w), workers = mercury_worker_workers(w);

  static float small[SMALL], large[LARGE], grad_small[SMALL], grad_large[LARGE];
  float* params[2] = {small, large};
  float* grads[2] = {grad_small, grad_large};
  const size_t sizes[2] = {SMALL, LARGE};
  uint32_t keys[2];
  int bad = 0;
  for (int t = 0; t < 2 && !bad; ++t) {
    for (size_t i = 0; i < sizes[t]; ++i) params[t][i] = rank == 0 ? (float)i * 0.25f : -1.0f;
    const int st =
        mercury_worker_declare(w, t == 0 ? "small" : "large", params[t], sizes[t], t, &keys[t]);
    if (st != MERCURY_OK) bad = failed("declare", st);
  }
  if (!bad) {
    const int st = mercury_worker_start(w);
    if (st != MERCURY_OK) bad = failed("start", st);
  }
  for (int t = 0; t < 2 && !bad; ++t) {
    for (size_t i = 0; i < sizes[t]; ++i) {
      if (params[t][i] != (float)i * 0.25f) {
        fprintf(stderr, "version 0 of tensor %d differs from rank 0's at %zu\n", t, i);
        bad = 1;
        break;
      }
    }
  }
  for (int round = 0; round < ROUNDS && !bad; ++round) {
    mercury_handle* h[2];
    for (int t = 0; t < 2; ++t) {
      for (size_t i = 0; i < sizes[t]; ++i) grads[t][i] = gradient(rank, round, i);
      const int st = mercury_worker_push_pull(w, keys[t], grads[t], params[t], sizes[t], &h[t]);
      if (st != MERCURY_OK) return failed("push_pull", st);
    }
    for (int t = 0; t < 2; ++t) {
      if (mercury_handle_wait(h[t]) != MERCURY_OK) {
        fprintf(stderr, "push_pull failed: %s\n", mercury_handle_error(h[t]));
        bad = 1;
      }
      mercury_handle_release(h[t]);
      for (size_t i = 0; i < sizes[t] && !bad; ++i) {
        if (params[t][i] != average(workers, round, i)) {
          fprintf(stderr, "round %d tensor %d element %zu: %.9g, expected %.9g\n", round, t, i,
                  (double)params[t][i], (double)average(workers, round, i));
          bad = 1;
        }
      }
    }
  }
  const int st = mercury_worker_shutdown(w);
  if (st != MERCURY_OK && !bad) bad = failed("shutdown", st);
  mercury_worker_destroy(w);
  if (bad) return 1;
  printf("rank %u of %u: version 0 and %d rounds of push_pull exact\n", rank, workers, ROUNDS);
  return 0;
}
