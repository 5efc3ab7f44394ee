/* A C trainer of bfloat16, float16 and float32 tensors through the C ABI's
 * typed calls (mercury_worker_declare_typed, _push_pull_typed, _pull_typed,
 * _dtype), one rank of a job run by half_job_test.py with ps-server.
 *
 * Its values are multiples of 1/128 below 1 in magnitude, exact in every
 * dtype, so the aggregate each rank must receive, the rank-order average,
 * is exact too and computed here in float; each tensor's buffer must hold
 * it bit for bit in the tensor's dtype. Also checks the refusals: a dtype
 * that is not a mercury_dtype, a buffer of another dtype than the
 * tensor's (nothing converts).
 *
 *   half_trainer JOB NODE ROUNDS */
#include <mercury/worker_c.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { kTensors = 3 };
static const size_t kSizes[kTensors] = {1001, 513, 100};
static const int kDtypes[kTensors] = {MERCURY_DTYPE_BFLOAT16, MERCURY_DTYPE_FLOAT16,
                                      MERCURY_DTYPE_FLOAT32};
static const char* const kNames[kTensors] = {"b", "h", "f"};

/* A float exactly representable in the dtype, as its elements hold it. */
static uint16_t to_bits(float f, int dtype) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if (dtype == MERCURY_DTYPE_BFLOAT16) return (uint16_t)(u >> 16);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  if ((u & 0x7fffffffu) == 0) return sign;
  const uint32_t e = ((u >> 23) & 0xffu) - 127u + 15u; /* normal for |f| >= 2^-14 */
  return (uint16_t)(sign | (e << 10) | ((u >> 13) & 0x3ffu));
}

/* Rank r's gradient element i in round `round`: k / 128, |k| < 64. */
static float gradient(uint32_t r, uint32_t round, size_t i) {
  return (float)((int)(i % 61) - 30 + 3 * (int)r + (int)round) / 128.0f;
}

static void fill(void* buf, size_t t, size_t i, float v) {
  if (kDtypes[t] == MERCURY_DTYPE_FLOAT32) {
    ((float*)buf)[i] = v;
  } else {
    ((uint16_t*)buf)[i] = to_bits(v, kDtypes[t]);
  }
}

static size_t element_bytes(size_t t) { return kDtypes[t] == MERCURY_DTYPE_FLOAT32 ? 4 : 2; }

static int expect(int got, int want, const char* what) {
  if (got != want) {
    fprintf(stderr, "%s: status %d, expected %d (%s)\n", what, got, want, mercury_last_error());
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: half_trainer JOB NODE ROUNDS\n");
    return 2;
  }
  const uint32_t rounds = (uint32_t)atoi(argv[3]);
  mercury_worker_options o;
  mercury_worker_options_init(&o, sizeof o);
  o.job_file = argv[1];
  o.node = argv[2];
  mercury_worker* w = NULL;
  if (mercury_worker_connect(&o, &w) != MERCURY_OK) {
    fprintf(stderr, "connect: %s\n", mercury_last_error());
    return 1;
  }
  const uint32_t rank = mercury_worker_rank(w);
  const uint32_t n = mercury_worker_workers(w);
  int bad = 0;
  void *params[kTensors], *grads[kTensors], *want[kTensors];
  uint32_t keys[kTensors];
  for (size_t t = 0; t < kTensors; ++t) {
    params[t] = calloc(kSizes[t], element_bytes(t));
    grads[t] = calloc(kSizes[t], element_bytes(t));
    want[t] = calloc(kSizes[t], element_bytes(t));
    for (size_t i = 0; i < kSizes[t]; ++i) {
      const float initial = (float)(i % 7) / 8.0f;
      fill(want[t], t, i, initial);
      if (rank == 0) fill(params[t], t, i, initial);
    }
  }
  uint32_t k = 0;
  bad |= expect(mercury_worker_declare_typed(w, "x", params[0], kSizes[0], 0, -1, 0, &k),
                MERCURY_E_USAGE, "declare_typed with dtype 0 (bytes)");
  bad |= expect(mercury_worker_declare_typed(w, "x", params[0], kSizes[0], 4, -1, 0, &k),
                MERCURY_E_USAGE, "declare_typed with dtype 4");
  for (size_t t = 0; t < kTensors; ++t) {
    /* bfloat16 with the average rule, the others the job's optimizer (sum). */
    const int update = t == 0 ? MERCURY_UPDATE_AVERAGE : MERCURY_UPDATE_OPTIMIZER;
    bad |= expect(mercury_worker_declare_typed(w, kNames[t], params[t], kSizes[t], kDtypes[t],
                                               (int)t, update, &keys[t]),
                  MERCURY_OK, "declare_typed");
    int dtype = 0;
    bad |= expect(mercury_worker_dtype(w, keys[t], &dtype), MERCURY_OK, "dtype");
    if (dtype != kDtypes[t]) {
      fprintf(stderr, "tensor %s: dtype %d, declared %d\n", kNames[t], dtype, kDtypes[t]);
      bad = 1;
    }
  }
  if (bad || expect(mercury_worker_start(w), MERCURY_OK, "start")) return 1;
  for (size_t t = 0; t < kTensors; ++t) {
    if (memcmp(params[t], want[t], kSizes[t] * element_bytes(t)) != 0) {
      size_t i = 0;
      while (((const uint16_t*)params[t])[i] == ((const uint16_t*)want[t])[i]) ++i;
      fprintf(stderr, "%s: tensor %s: version 0 is not rank 0's values (16-bit word %zu: %#x, not %#x)\n",
              argv[2], kNames[t], i, ((const uint16_t*)params[t])[i], ((const uint16_t*)want[t])[i]);
      bad = 1;
    }
  }
  /* A buffer of another dtype than the tensor's is refused, nothing sent. */
  mercury_handle* h = NULL;
  bad |= expect(mercury_worker_push_typed(w, keys[0], grads[0], kSizes[0], MERCURY_DTYPE_FLOAT16,
                                          &h),
                MERCURY_E_USAGE, "push_typed of float16 elements to a bfloat16 tensor");
  if (strstr(mercury_last_error(), "is bfloat16 but the buffer is float16") == NULL) {
    fprintf(stderr, "the refusal does not name both dtypes: %s\n", mercury_last_error());
    bad = 1;
  }
  bad |= expect(mercury_worker_push_typed(w, keys[1], grads[1], kSizes[1], MERCURY_DTYPE_FLOAT32,
                                          &h),
                MERCURY_E_USAGE, "push_typed of float32 elements to a float16 tensor");
  bad |= expect(mercury_worker_pull_typed(w, keys[2], params[2], kSizes[2],
                                          MERCURY_DTYPE_BFLOAT16, 0, &h),
                MERCURY_E_USAGE, "pull_typed of bfloat16 elements from a float32 tensor");
  bad |= expect(mercury_worker_push_typed(w, keys[0], grads[0], kSizes[0], 9, &h),
                MERCURY_E_USAGE, "push_typed with dtype 9");
  for (uint32_t round = 0; round < rounds && !bad; ++round) {
    mercury_handle* pending[kTensors];
    for (size_t t = 0; t < kTensors; ++t) {
      for (size_t i = 0; i < kSizes[t]; ++i) {
        fill(grads[t], t, i, gradient(rank, round, i));
        float sum = gradient(0, round, i);
        for (uint32_t r = 1; r < n; ++r) sum = sum + gradient(r, round, i);
        fill(want[t], t, i, sum * (1.0f / (float)n)); /* exact: n is 2 */
      }
      bad |= expect(mercury_worker_push_pull_typed(w, keys[t], grads[t], params[t], kSizes[t],
                                                   kDtypes[t], &pending[t]),
                    MERCURY_OK, "push_pull_typed");
    }
    for (size_t t = 0; t < kTensors && !bad; ++t) {
      bad |= expect(mercury_handle_wait(pending[t]), MERCURY_OK, "wait");
      mercury_handle_release(pending[t]);
      if (memcmp(params[t], want[t], kSizes[t] * element_bytes(t)) != 0) {
        fprintf(stderr, "%s round %u: tensor %s differs from the exact average\n", argv[2],
                round + 1, kNames[t]);
        bad = 1;
      }
    }
    if (!bad) printf("%s round %u: bfloat16, float16, float32 exact\n", argv[2], round + 1);
  }
  /* The last version again, into another buffer, through pull_typed. */
  void* copy = calloc(kSizes[0], 2);
  if (!bad) {
    bad |= expect(mercury_worker_pull_typed(w, keys[0], copy, kSizes[0], MERCURY_DTYPE_BFLOAT16,
                                            rounds, &h),
                  MERCURY_OK, "pull_typed");
    bad |= expect(mercury_handle_wait(h), MERCURY_OK, "wait on pull_typed");
    mercury_handle_release(h);
    if (memcmp(copy, params[0], kSizes[0] * 2) != 0) {
      fprintf(stderr, "pull_typed into another buffer: not the declared buffer's version\n");
      bad = 1;
    }
  }
  bad |= expect(mercury_worker_barrier(w), MERCURY_OK, "barrier");
  mercury_worker_destroy(w);
  for (size_t t = 0; t < kTensors; ++t) {
    free(params[t]);
    free(grads[t]);
    free(want[t]);
  }
  free(copy);
  if (!bad) printf("%s: done, the typed C calls exact\n", argv[2]);
  return bad;
}
