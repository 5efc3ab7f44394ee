/* The Mercury worker's C ABI: mercury/worker.h for other languages (C,
 * Python's ctypes/cffi, Rust, Go). Same semantics, same threads, same
 * errors; read mercury/worker.h first.
 *
 * Objects are opaque pointers: a worker (mercury_worker) and the handle of a
 * transfer (mercury_handle), each released by its own function. Every
 * function that can fail returns a mercury_status (MERCURY_OK = 0), and
 * mercury_last_error() then says why, on the calling thread. No C++
 * exception crosses this boundary.
 *
 * Threads: as in C++, every worker function may be called from any number
 * of threads at once. A mercury_handle may be waited on from several
 * threads; release it once, after its last use (a pending transfer
 * completes all the same). Callbacks run on the worker's net core (or at
 * once on the registering thread if the transfer is already complete): they
 * must be short and must not block.
 *
 *   mercury_worker_options o;
 *   mercury_worker_options_init(&o, sizeof o);
 *   o.job_file = "job.yaml"; o.node = "w0";  (or NULL: MERCURY_JOB, and the
 *                                             node from MERCURY_NODE or the
 *                                             launcher's rank, as in C++)
 *   mercury_worker* w;
 *   if (mercury_worker_connect(&o, &w) != MERCURY_OK) puts(mercury_last_error());
 *   uint32_t k; mercury_worker_declare(w, "fc.weight", params, n, -1, &k);
 *   mercury_handle* h; mercury_worker_push_pull(w, k, grad, n, params, n, &h);
 *   mercury_handle_wait(h); mercury_handle_release(h);
 *   mercury_worker_destroy(w);
 */
#ifndef MERCURY_WORKER_C_H
#define MERCURY_WORKER_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mercury_worker mercury_worker;
typedef struct mercury_handle mercury_handle;

typedef enum mercury_status {
  MERCURY_OK = 0,
  MERCURY_E_USAGE = 1,    /* misuse: unknown key, wrong size, after start/shutdown, null argument */
  MERCURY_E_WORKER = 2,   /* the worker cannot run: configuration, EAL, a server refused/silent */
  MERCURY_E_FAILED = 3,   /* a transfer failed (mercury_handle_error says why) */
  MERCURY_E_PENDING = 4,  /* mercury_handle_status: not complete yet */
  MERCURY_E_INTERNAL = 5, /* anything else (out of memory, ...) */
  /* mercury_worker_start of a spare worker: the job ended without needing it
   * (no failure; mercury_last_error says so). Since MERCURY_6. */
  MERCURY_E_RELEASED = 6
} mercury_status;

typedef enum mercury_eal_mode {
  MERCURY_EAL_AUTO = 0,  /* attach if this process started EAL, else start it */
  MERCURY_EAL_START = 1, /* the worker's net core thread starts and cleans up EAL */
  MERCURY_EAL_ATTACH = 2 /* EAL is already up in this process */
} mercury_eal_mode;

/* Set it with mercury_worker_options_init, then change the fields you need.
 * It grows at its end only and has no padding: `size` says which fields the
 * caller has, the library takes its defaults for the others and refuses a
 * larger struct whose fields it does not know are not all zero (a field's
 * zero always means what the library did before the field existed). A new
 * field goes last, 8 bytes wide (int64_t, uint64_t or a pointer). */
typedef struct mercury_worker_options {
  uint32_t size;               /* sizeof(mercury_worker_options) as the caller was built */
  int eal_mode;                /* a mercury_eal_mode */
  const char* job_file;        /* the job's YAML; NULL or "": $MERCURY_JOB */
  const char* node;            /* this worker's node name; NULL or "": from the launcher */
  const char* const* eal_args; /* extra EAL arguments: eal_argc non-NULL strings, */
  size_t eal_argc;             /* or NULL with eal_argc 0 (else MERCURY_E_USAGE)  */
  uint32_t start_timeout_ms;   /* default 30000 */
  int idle_backoff;            /* default 1: the job file's poll mode; 0: busy polling */
  const char* timeline;        /* NULL (default): $MERCURY_TIMELINE; else a directory */
} mercury_worker_options;

/* Runs on completion: `status` is MERCURY_OK or MERCURY_E_FAILED, `error`
 * the failure text ("" on success, valid during the call only). */
typedef void (*mercury_callback)(void* context, int status, const char* error);

/* Why the most recent call on this thread failed ("" if it succeeded).
 * Valid until the next call on this thread. */
const char* mercury_last_error(void);

/* Sets the defaults in the first `size` bytes of *options (`size` is
 * sizeof(mercury_worker_options) as the caller was built; bytes of fields
 * this library does not have are zeroed) and options->size = size.
 * MERCURY_E_USAGE for NULL or a size below the smallest layout (56 bytes
 * on 64-bit platforms) or above 65536. */
int mercury_worker_options_init(mercury_worker_options* options, size_t size);

/* Connects (see Worker's constructor). On success *out is the worker.
 * Reads options->size bytes: MERCURY_E_USAGE if size is below the smallest
 * layout or if a field this library does not have is not zero. */
int mercury_worker_connect(const mercury_worker_options* options, mercury_worker** out);
/* Shuts down (if not done) and frees the worker. NULL is accepted. */
void mercury_worker_destroy(mercury_worker* worker);

int mercury_worker_declare(mercury_worker* worker, const char* name, float* params, size_t elements,
                           int priority, uint32_t* key_out);
int mercury_worker_start(mercury_worker* worker);
/* mercury_worker_start without waiting: *handle_out completes when the
 * start would have returned (release it with mercury_handle_release). */
int mercury_worker_start_async(mercury_worker* worker, mercury_handle** handle_out);
int mercury_worker_push(mercury_worker* worker, uint32_t key, const float* grad, size_t elements,
                        mercury_handle** out);
int mercury_worker_pull(mercury_worker* worker, uint32_t key, float* out, size_t elements,
                        mercury_handle** handle_out);
int mercury_worker_push_pull(mercury_worker* worker, uint32_t key, const float* grad, float* out,
                             size_t elements, mercury_handle** handle_out);
/* mercury_worker_pull that also waits until every chunk of the tensor is at
 * least min_version (Worker::pull(key, out, min_version)). */
int mercury_worker_pull_min(mercury_worker* worker, uint32_t key, float* out, size_t elements,
                            uint32_t min_version, mercury_handle** handle_out);
/* The version the last completed pull of `key` delivered (Worker::version). */
int mercury_worker_version(mercury_worker* worker, uint32_t key, uint32_t* version_out);
/* The trainer is about to compute with `key`'s declared buffer: the version
 * in it now, taken as the base of the next push of `key`
 * (Worker::mark_read). */
int mercury_worker_mark_read(mercury_worker* worker, uint32_t key, uint32_t* version_out);
/* Every drop on the worker's node by reason (Worker::drops) as text,
 * "reason=count" pairs separated by one space ("" when none), e.g.
 * "not_our_mac=5 retransmit_stale=2". Like snprintf: writes at most `size`
 * bytes including the terminating NUL (a longer text is cut, still
 * terminated; `buf` may be NULL when `size` is 0), and *needed_out (when
 * not NULL) is the whole text's length without the NUL. */
int mercury_worker_drops(mercury_worker* worker, char* buf, size_t size, size_t* needed_out);
/* The worker's counters (Worker::stats, WorkerStats in mercury/worker.h, the
 * same fields in the same order: see there what each counts). Fields are
 * only ever added at the end. */
typedef struct mercury_worker_stats {
  uint64_t pushes;
  uint64_t pulls;
  uint64_t bytes_pushed;
  uint64_t chunks_received;
  uint64_t bytes_placed;
  uint64_t versions_completed;
  uint64_t retransmits;
  uint64_t chunks_dropped;
  uint64_t control_dropped;
  uint64_t staleness_sum;
  uint64_t stale_pushes;
  uint64_t staleness_max;
  uint64_t ssp_waits;
  uint64_t ssp_gap_max;
  uint64_t workers_removed;
  uint64_t workers_left;
  uint64_t workers_joined;
  uint64_t standby_takeovers;
  uint64_t tensors_resent;
} mercury_worker_stats;
/* Fills *out with the counters now. `size` is sizeof(mercury_worker_stats)
 * as the caller was compiled (a multiple of 8): a caller built against an
 * older header gets the fields it knows, a newer one zeros in the fields
 * this library does not have. */
int mercury_worker_get_stats(mercury_worker* worker, mercury_worker_stats* out, size_t size);
/* The job's training.sync ("bsp", "asp", "ssp" or "psplus"); static storage.
 * NULL for a NULL worker. */
const char* mercury_worker_sync(const mercury_worker* worker);
int mercury_worker_barrier(mercury_worker* worker);
/* mercury_worker_barrier without waiting: *handle_out completes when every
 * rank has reached this generation. */
int mercury_worker_barrier_async(mercury_worker* worker, mercury_handle** handle_out);
int mercury_worker_shutdown(mercury_worker* worker);
int mercury_worker_key(mercury_worker* worker, const char* name, uint32_t* key_out);
/* Its rank (Worker::rank); a spare worker's once started (the rank it took
 * over), UINT32_MAX before. */
uint32_t mercury_worker_rank(const mercury_worker* worker);
uint32_t mercury_worker_workers(const mercury_worker* worker);
/* A span of the trainer's work on row `track` of the timeline, in
 * CLOCK_MONOTONIC nanoseconds (Worker::timeline_span); nothing when the
 * worker records no timeline. */
int mercury_worker_timeline_span(mercury_worker* worker, const char* name, const char* track,
                                 uint64_t begin_ns, uint64_t end_ns);

/* Settings and checkpoints (mercury/worker.h, "Settings and checkpoints"). */

/* How the servers make a tensor's versions (Worker::declare's update). */
typedef enum mercury_update {
  MERCURY_UPDATE_OPTIMIZER = 0, /* the job's training.optimizer */
  MERCURY_UPDATE_AVERAGE = 1,   /* the pushes' average in rank order */
  MERCURY_UPDATE_RANK0 = 2,     /* rank 0's push */
  /* the job's training.optimizer on rank 0's push, not averaged; a push of
     MERCURY_SKIP_STEP_BITS in every element applies nothing (a skipped step) */
  MERCURY_UPDATE_OPTIMIZER_RANK0 = 3
} mercury_update;
#define MERCURY_SKIP_STEP_BITS 0x7FA55A5Au
/* mercury_worker_declare with an update rule (a mercury_update). */
int mercury_worker_declare_update(mercury_worker* worker, const char* name, float* params,
                                  size_t elements, int priority, int update, uint32_t* key_out);

/* The servers' hyperparameters (Worker::hyperparameters): the same fields
 * in the same order. Fields are only ever added at the end. */
typedef struct mercury_hyperparameters {
  float learning_rate;
  float momentum;
  float weight_decay;
  float beta1;
  float beta2;
  float epsilon;
} mercury_hyperparameters;
/* Fills *out with the hyperparameters as this worker last set them (the
 * job file's until then). `size` is sizeof(mercury_hyperparameters) as the
 * caller was compiled (a multiple of 4): an older caller gets the fields it
 * knows, a newer one zeros past this library's. */
int mercury_worker_hyperparameters(mercury_worker* worker, mercury_hyperparameters* out,
                                   size_t size);
/* Changes them from this worker's next push on (Worker::set_hyperparameters):
 * `size` as above; the fields an older caller's struct lacks keep their
 * values. *handle_out completes once every server applied them (rank 0), at
 * once on another rank. */
int mercury_worker_set_hyperparameters(mercury_worker* worker,
                                       const mercury_hyperparameters* values, size_t size,
                                       mercury_handle** handle_out);
/* Every shard's state as a job's state file (Worker::server_state), waiting:
 * *state_out is a buffer of *size_out bytes the library allocated; release
 * it with mercury_state_release. */
int mercury_worker_server_state(mercury_worker* worker, void** state_out, size_t* size_out);
void mercury_state_release(void* state);
/* Before start: the job resumes from a job's state file (Worker::resume_from;
 * the bytes are copied). */
int mercury_worker_resume_from(mercury_worker* worker, const void* state, size_t size);
/* The version the job started at (Worker::start_version). */
int mercury_worker_start_version(mercury_worker* worker, uint32_t* version_out);
/* After a call failed because a server was lost (network.on_server_loss:
 * wait): waits for the server to come back and stores the version the job
 * rolled back to (Worker::roll_back). MERCURY_E_WORKER when it did not come
 * back in time or no server was lost (mercury_last_error says why). Symbol
 * version MERCURY_4. */
int mercury_worker_roll_back(mercury_worker* worker, uint32_t* version_out);

/* Whether this process joined a running job in place of a removed rank
 * (*joined_out 1, else 0) and, if it did, the version it joined at
 * (*version_out; Worker::joined_version). MERCURY_E_USAGE before start.
 * Symbol version MERCURY_5. */
int mercury_worker_joined_version(mercury_worker* worker, int* joined_out, uint32_t* version_out);

/* 1 when the job file makes this worker a spare (docs/membership.md, "Spare
 * workers"), else 0 (and for NULL). Its mercury_worker_start returns once it
 * took a rank over (mercury_worker_rank), or MERCURY_E_RELEASED when the
 * job ended without needing it. Symbol version MERCURY_6. */
int mercury_worker_spare(const mercury_worker* worker);

/* Element types (mercury/worker.h, "Element types"): a tensor is float32,
 * bfloat16 or float16, fixed when declared; its buffers hold its elements
 * as they are (bfloat16 and float16: 2 bytes each, little-endian) and
 * nothing converts them. Each call names the dtype of the buffer it passes:
 * one that is not the tensor's is MERCURY_E_USAGE. */
typedef enum mercury_dtype {
  MERCURY_DTYPE_FLOAT32 = 1,  /* float */
  MERCURY_DTYPE_BFLOAT16 = 2, /* the top 16 bits of a float */
  MERCURY_DTYPE_FLOAT16 = 3   /* IEEE-754 binary16 */
} mercury_dtype;
/* mercury_worker_declare_update with a dtype (a mercury_dtype): `params` is
 * `elements` elements of it. */
int mercury_worker_declare_typed(mercury_worker* worker, const char* name, void* params,
                                 size_t elements, int dtype, int priority, int update,
                                 uint32_t* key_out);
/* The dtype `key` was declared with (a mercury_dtype). */
int mercury_worker_dtype(mercury_worker* worker, uint32_t key, int* dtype_out);
/* mercury_worker_push, _pull_min (min_version 0: none) and _push_pull of a
 * tensor of any dtype: the buffers are `elements` elements of `dtype`. */
int mercury_worker_push_typed(mercury_worker* worker, uint32_t key, const void* grad,
                              size_t elements, int dtype, mercury_handle** handle_out);
int mercury_worker_pull_typed(mercury_worker* worker, uint32_t key, void* out, size_t elements,
                              int dtype, uint32_t min_version, mercury_handle** handle_out);
int mercury_worker_push_pull_typed(mercury_worker* worker, uint32_t key, const void* grad,
                                   void* out, size_t elements, int dtype,
                                   mercury_handle** handle_out);

/* Blocks until complete: MERCURY_OK or MERCURY_E_FAILED. */
int mercury_handle_wait(mercury_handle* handle);
/* MERCURY_OK, MERCURY_E_FAILED or MERCURY_E_PENDING; never blocks. */
int mercury_handle_status(const mercury_handle* handle);
/* 1 once complete (ok or failed), else 0. */
int mercury_handle_ready(const mercury_handle* handle);
/* Why it failed ("" unless failed); valid while the handle is. */
const char* mercury_handle_error(mercury_handle* handle);
/* Runs fn(context, status, error) once on completion (see the file comment). */
int mercury_handle_on_complete(mercury_handle* handle, mercury_callback fn, void* context);
void mercury_handle_release(mercury_handle* handle);

#ifdef __cplusplus
}
#endif

#endif /* MERCURY_WORKER_C_H */
