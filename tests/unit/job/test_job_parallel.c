/* Jobs of several ranks ("parallel" in the spec) in the job layer, on a cpu registry of four
 * simulated ranks: every bad "parallel" refused naming the field; "all" stored as the count;
 * more ranks than the daemon has, placements ranks cannot take, a gpu_budget too small, fp16
 * with several, and a cuda daemon without the GPUs refused with the numbers; the per-rank estimate (zt_dp_estimate_rank_bytes) equal to
 * what the data-parallel trainer holds per rank for every stage, both archs, fp32 and bf16, with
 * and without activation checkpointing, and behind admission and plan; FIFO scheduling on the
 * ranks: two 2-rank jobs run side by side while a 3-rank job waits, cancelling releases the
 * ranks and the waiting job then takes the first free ones, with status naming the holders. */
#include <errno.h>
#include <string.h>
#include "engine/base/sizes.h"
#include "engine/comm/comm.h"
#include "engine/job/spec.h"
#include "engine/kernels/backend.h"
#include "engine/train/dp/dp.h"
#include "jobtest.h"

#define RANKS 4

static char g_tok[600];

static json_t *spec_of(const char *parallel) {
  char text[1200];
  snprintf(text, sizeof text,
           "{\"model\": {\"arch\": \"gpt\", \"vocab\": 32, \"seq_len\": 8, \"d_model\": 16, "
           "\"n_heads\": 2, \"n_layers\": 1}, \"train\": {\"steps\": 4, \"micro_batch\": 2}, "
           "\"data\": {\"source\": \"file\", \"path\": \"%s\"}%s%s}",
           g_tok, parallel ? ", \"parallel\": " : "", parallel ? parallel : "");
  json_error_t je;
  json_t *j = json_loads(text, 0, &je);
  if (!j) fprintf(stderr, "%s: %s\n", text, je.text);
  CHECK(j != NULL);
  return j;
}

typedef struct bad_case {
  const char *parallel; /* the "parallel" member's JSON */
  const char *extra;    /* another top-level member, or NULL */
  int err;
  const char *msg;
} bad_case;

static const bad_case k_bad[] = {
    {"[]", NULL, -EINVAL, "parallel must be an object"},
    {"{\"gpus\": 0}", NULL, -EINVAL, "parallel.gpus must be a positive integer or \"all\""},
    {"{\"gpus\": \"two\"}", NULL, -EINVAL, "parallel.gpus must be a positive integer or \"all\""},
    {"{\"gpus\": 1.5}", NULL, -EINVAL, "parallel.gpus must be a positive integer or \"all\""},
    {"{\"gpus\": 65}", NULL, -EINVAL, "parallel.gpus must be at most 64"},
    {"{\"zero_stage\": 0}", NULL, -EINVAL, "parallel.zero_stage must be 1, 2 or 3"},
    {"{\"zero_stage\": 4}", NULL, -EINVAL, "parallel.zero_stage must be 1, 2 or 3"},
    {"{\"zero_stage\": \"3\"}", NULL, -EINVAL, "parallel.zero_stage must be 1, 2 or 3"},
    {"{\"stage\": 2}", NULL, -EINVAL, "unknown field 'parallel.stage'"},
    {"{\"gpus\": 5}", NULL, -EINVAL,
     "parallel.gpus 5 is more than the 4 simulated ranks of this cpu daemon (ztd --cpu-ranks)"},
    {"{\"gpus\": 2}", "\"offload\": {\"optimizer\": \"host\", \"params\": \"host\"}",
     -EINVAL, "offload.params: host with parallel.gpus 2 needs parallel.zero_stage 3"},
    {"{\"gpus\": \"all\"}", "\"offload\": {\"optimizer\": \"host\", \"gpu_budget\": 1000}",
     -ENOMEM, "offload.gpu_budget 1000 B per GPU is too small for parallel.gpus 4: with the "
     "optimizer of 0 unit(s) on the GPU and the rest's on the host, the parameters on the GPU a "
     "rank needs"},
};

static void check_refusals(zt_jobs *jobs) {
  char id[ZT_JOB_ID_MAX], err[1024];
  for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
    const bad_case *c = &k_bad[i];
    json_t *spec = spec_of(c->parallel);
    if (c->extra) {
      char text[256];
      snprintf(text, sizeof text, "{%s}", c->extra);
      json_error_t je;
      json_t *x = json_loads(text, 0, &je);
      CHECK(x != NULL);
      json_object_update(spec, x);
      json_decref(x);
    }
    err[0] = '\0';
    int rc = jt_submit(jobs, spec, id, err, sizeof err);
    if (rc != c->err || !strstr(err, c->msg)) {
      fprintf(stderr, "case %zu (parallel %s): rc %d (want %d), \"%s\" (want \"%s\")\n", i,
              c->parallel, rc, c->err, err, c->msg);
      exit(1);
    }
    /* plan refuses it the same way */
    json_t *plan = jt_plan(jobs, spec, &rc, err, sizeof err);
    CHECK(!plan && rc == c->err && strstr(err, c->msg));
    json_decref(spec);
  }
}

/* fp16, the GPUs a cuda daemon owns, its memory per GPU: no device is needed for these. */
static void check_cuda_refusals(void) {
  char err[1024];
  zt_job_spec s;
  zt__job_needs needs;
  json_t *spec = spec_of("{\"gpus\": 2, \"zero_stage\": 2}");
  CHECK(zt__job_spec_parse(spec, &s, err, sizeof err) == 0);
  zt_jobs_config one = {.backend = "cuda"};
  CHECK(zt__job_spec_check_resources(&s, &one, &needs, err, sizeof err) == -EINVAL);
  CHECK(strstr(err, "parallel.gpus 2 is more than the 1 GPU this daemon owns (ztd --gpus)"));
  zt_jobs_config two = {.backend = "cuda", .gpus = {2, 3}, .n_gpus = 2};
  int ids[ZT_JOBS_MAX_GPUS];
  CHECK(zt__jobs_devices(&two, ids) == 2 && ids[0] == 2 && ids[1] == 3);
  s.train.precision = ZT_F16;
  two.peer_token = "t";
  s.n_peers = 1;
  CHECK(zt__job_spec_check_resources(&s, &two, &needs, err, sizeof err) == -ENOTSUP);
  CHECK(strstr(err, "train.precision \"fp16\" with 4 ranks (parallel.gpus 2 on each of 2 "
                    "daemons) and parallel.peers is not supported yet"));
  s.n_peers = 0;
  two.peer_token = NULL;
  s.train.precision = ZT_BF16;
  int rc = zt__job_spec_check_resources(&s, &two, &needs, err, sizeof err);
  if (zt_backend_have_cuda() && rc == 0) {
    zt_train_cfg tc = zt__job_rank_train_cfg(&s);
    zt_dp_cfg dpc = {.world = 2, .zero_stage = 2};
    CHECK(needs.rank_bytes ==
          zt_dp_estimate_rank_bytes(&s.model, &tc, &dpc, zt_backend_ops_of("cuda")));
    /* on the host the step's rows alone: inputs, targets and positions of 2 ranks' 2 x 8 */
    CHECK(needs.backend_bytes == 2 * needs.rank_bytes &&
          needs.host_bytes == 3 * sizeof(int32_t) * 2 * 2 * 8);
  } else {
    /* a build without NCCL cannot run it */
    CHECK(rc == -ENOTSUP && strstr(err, "needs NCCL"));
  }
  json_decref(spec);
}

/* The estimate against the trainer, rank by rank. */
static int check_estimate(zt_arch arch, int W, int stage, zt_dtype dt, int ckpt) {
  zt_model_cfg mc = {.arch = arch, .vocab = 37, .seq_len = 8, .d_model = 16, .n_heads = 2,
                     .n_layers = 3, .d_ff = arch == ZT_ARCH_ENCODER ? 24 : 0, .init_seed = 3};
  zt_train_cfg tc;
  zt_train_cfg_defaults(&tc);
  tc.steps = 1;
  tc.micro_batch = 2;
  tc.grad_accum = 2;
  tc.precision = dt;
  tc.ckpt_every = ckpt;
  zt_dp_cfg dpc = {.world = W, .zero_stage = stage};
  size_t est = zt_dp_estimate_rank_bytes(&mc, &tc, &dpc, zt_backend_cpu_ops());
  zt_comm_cpu_group *g;
  zt_dp_rank ranks[4] = {0};
  char err[512];
  CHECK(zt_comm_cpu_group_open(&g, W) == 0);
  for (int r = 0; r < W; r++)
    CHECK(zt_backend_cpu_open(&ranks[r].be, 1) == 0 && zt_comm_cpu_open(&ranks[r].comm, g, r) == 0);
  zt_trainer *t = NULL;
  int rc = zt_trainer_open_dp(&t, &mc, &tc, &dpc, ranks, err, sizeof err);
  if (rc < 0) fprintf(stderr, "open_dp: %s\n", err);
  CHECK(rc == 0);
  int fails = 0;
  for (int r = 0; r < W; r++) {
    size_t got = zt_trainer_dp_rank_bytes(t, r);
    if (got != est) {
      fprintf(stderr, "%s W %d stage %d %s ckpt %d: rank %d holds %zu bytes, estimate %zu\n",
              zt_arch_name(arch), W, stage, zt_dtype_name(dt), ckpt, r, got, est);
      fails++;
    }
  }
  zt_trainer_close(t);
  for (int r = 0; r < W; r++) {
    zt_comm_cpu_close(&ranks[r].comm);
    zt_backend_cpu_close(&ranks[r].be);
  }
  zt_comm_cpu_group_close(g);
  return fails;
}

static json_t *status_gpus(zt_jobs *jobs) {
  json_t *st = zt_jobs_status(jobs);
  json_t *g = json_incref(json_object_get(st, "gpus"));
  json_decref(st);
  return g;
}

/* "j000001,j000001,-,-": the holder of each rank */
static void holders(zt_jobs *jobs, char *out, size_t outlen) {
  json_t *g = status_gpus(jobs);
  size_t i, n = 0;
  json_t *d;
  out[0] = '\0';
  json_array_foreach(g, i, d) {
    CHECK(json_integer_value(json_object_get(d, "index")) == (json_int_t)i);
    const char *h = json_string_value(json_object_get(d, "job"));
    n += (size_t)snprintf(out + n, outlen - n, "%s%s", i ? "," : "", h ? h : "-");
  }
  json_decref(g);
}

static const char *state_of(zt_jobs *jobs, const char *id) {
  static char buf[32];
  int rc;
  char err[256];
  json_t *show = zt_jobs_show(jobs, id, &rc, err, sizeof err);
  CHECK(show != NULL);
  snprintf(buf, sizeof buf, "%s", json_string_value(json_object_get(show, "state")));
  json_decref(show);
  return buf;
}

typedef struct wait_arg {
  zt_jobs *jobs;
  const char *want;
} wait_arg;

static int holders_are(void *p) {
  wait_arg *a = p;
  char got[256];
  holders(a->jobs, got, sizeof got);
  return strcmp(got, a->want) == 0;
}

static json_t *stream_spec(int gpus) {
  char par[64];
  snprintf(par, sizeof par, "{\"gpus\": %d}", gpus);
  json_t *spec = spec_of(par);
  json_object_set_new(spec, "data", json_pack("{s:s}", "source", "stream"));
  return spec;
}

static void check_scheduling(zt_jobs *jobs, uv_loop_t *loop) {
  char a[ZT_JOB_ID_MAX], b[ZT_JOB_ID_MAX], c[ZT_JOB_ID_MAX], d[ZT_JOB_ID_MAX], err[1024];
  char want[256];
  /* stream jobs: running while they wait for batches, so nothing ends by itself */
  json_t *s2 = stream_spec(2), *s3 = stream_spec(3), *s1 = stream_spec(1);
  CHECK(jt_submit(jobs, s2, a, err, sizeof err) == 0);
  CHECK(jt_submit(jobs, s2, b, err, sizeof err) == 0);
  CHECK(jt_submit(jobs, s3, c, err, sizeof err) == 0);
  /* FIFO: the 1-rank job does not overtake the waiting 3-rank one */
  CHECK(jt_submit(jobs, s1, d, err, sizeof err) == 0);
  snprintf(want, sizeof want, "%s,%s,%s,%s", a, a, b, b);
  wait_arg w = {jobs, want};
  jt_run_until(loop, holders_are, &w, 30);
  CHECK(!strcmp(state_of(jobs, a), "running") && !strcmp(state_of(jobs, b), "running"));
  CHECK(!strcmp(state_of(jobs, c), "queued") && !strcmp(state_of(jobs, d), "queued"));
  json_t *st = zt_jobs_status(jobs);
  CHECK(json_integer_value(json_object_get(st, "running")) == 2);
  CHECK(json_integer_value(json_object_get(st, "queued")) == 2);
  json_decref(st);
  /* the list and show name the ranks a job holds */
  int rc;
  json_t *show = zt_jobs_show(jobs, b, &rc, err, sizeof err);
  json_t *held = json_object_get(show, "gpus");
  CHECK(json_array_size(held) == 2 && json_integer_value(json_array_get(held, 0)) == 2 &&
        json_integer_value(json_array_get(held, 1)) == 3);
  CHECK(json_integer_value(json_object_get(json_object_get(json_object_get(show, "spec"),
                                                           "parallel"), "gpus")) == 2);
  json_decref(show);
  /* a's ranks free: still 2 of the 3 c needs */
  CHECK(zt_jobs_cancel(jobs, a, err, sizeof err) == 0);
  snprintf(want, sizeof want, "-,-,%s,%s", b, b);
  jt_run_until(loop, holders_are, &w, 30);
  CHECK(!strcmp(state_of(jobs, c), "queued"));
  show = zt_jobs_show(jobs, a, &rc, err, sizeof err);
  CHECK(json_array_size(json_object_get(show, "gpus")) == 0);
  json_decref(show);
  /* b's too: c takes the first three, then d the last */
  CHECK(zt_jobs_cancel(jobs, b, err, sizeof err) == 0);
  snprintf(want, sizeof want, "%s,%s,%s,%s", c, c, c, d);
  jt_run_until(loop, holders_are, &w, 30);
  CHECK(zt_jobs_cancel(jobs, c, err, sizeof err) == 0);
  CHECK(zt_jobs_cancel(jobs, d, err, sizeof err) == 0);
  snprintf(want, sizeof want, "-,-,-,-");
  jt_run_until(loop, holders_are, &w, 30);
  json_decref(s1);
  json_decref(s2);
  json_decref(s3);
}

int main(void) {
  char dir[512], state[600], err[1024], id[ZT_JOB_ID_MAX];
  jt_tempdir(dir, sizeof dir, "parallel");
  snprintf(state, sizeof state, "%s/state", dir);
  snprintf(g_tok, sizeof g_tok, "%s/good.tok", dir);
  jt_write_tokens(g_tok, 32, 2, 1000);

  int fails = 0;
  zt_arch archs[] = {ZT_ARCH_GPT, ZT_ARCH_ENCODER};
  for (int a = 0; a < 2; a++)
    for (int stage = 1; stage <= 3; stage++)
      for (int W = 2; W <= 3; W++) {
        fails += check_estimate(archs[a], W, stage, ZT_F32, 0);
        fails += check_estimate(archs[a], W, stage, ZT_BF16, stage == 3 ? 1 : 0);
      }
  CHECK(fails == 0);
  /* what the trainer refuses has no estimate */
  {
    zt_model_cfg mc = {.arch = ZT_ARCH_GPT, .vocab = 37, .seq_len = 8, .d_model = 16,
                       .n_heads = 2, .n_layers = 1};
    zt_train_cfg tc;
    zt_train_cfg_defaults(&tc);
    tc.steps = tc.micro_batch = tc.grad_accum = 1;
    zt_dp_cfg dpc = {.world = 2, .zero_stage = 4};
    CHECK(zt_dp_estimate_rank_bytes(&mc, &tc, &dpc, zt_backend_cpu_ops()) == SIZE_MAX);
    /* fp16 where the trainer refuses it: a part */
    dpc.zero_stage = 1;
    dpc.local = 1;
    tc.precision = ZT_F16;
    CHECK(zt_dp_estimate_rank_bytes(&mc, &tc, &dpc, zt_backend_cpu_ops()) == SIZE_MAX);
  }
  check_cuda_refusals();

  uv_loop_t loop;
  uv_loop_init(&loop);
  jt_events ev = {.all = json_array()};
  zt_jobs_config cfg = {.loop = &loop, .state_dir = state, .backend = "cpu", .cpu_threads = 1,
                        .cpu_ranks = RANKS, .batch_queue_depth = 4, .on_event = jt_on_event,
                        .user = &ev};
  zt_jobs *jobs = NULL;
  CHECK(zt_jobs_open(&jobs, &cfg, err, sizeof err) == 0);
  jt_set_loop(&loop);
  check_refusals(jobs);

  /* Admission sizes each rank with the estimate; plan reports it per rank. */
  for (int stage = 1; stage <= 3; stage++) {
    char par[64];
    snprintf(par, sizeof par, "{\"gpus\": 2, \"zero_stage\": %d}", stage);
    json_t *spec = spec_of(par);
    zt_job_spec s;
    zt__job_needs needs;
    CHECK(zt__job_spec_parse(spec, &s, err, sizeof err) == 0);
    CHECK(s.gpus == 2 && s.zero_stage == stage);
    CHECK(zt__job_spec_check_resources(&s, &cfg, &needs, err, sizeof err) == 0);
    zt_dp_cfg dpc = {.world = 2, .zero_stage = stage};
    size_t rank = zt_dp_estimate_rank_bytes(&s.model, &s.train, &dpc, zt_backend_cpu_ops());
    /* the cpu ranks' memory is the host's, with the step's rows (3 planes of 2 x 2 x 8) */
    CHECK(needs.rank_bytes == rank && needs.backend_bytes == 2 * rank &&
          needs.host_bytes == 2 * rank + 3 * sizeof(int32_t) * 2 * 2 * 8);
    int rc;
    json_t *plan = jt_plan(jobs, spec, &rc, err, sizeof err);
    CHECK(plan && rc == 0);
    json_t *p = json_object_get(plan, "parallel");
    json_t *rb = json_object_get(p, "rank_bytes");
    CHECK(json_integer_value(json_object_get(p, "gpus")) == 2 &&
          json_integer_value(json_object_get(p, "zero_stage")) == stage);
    CHECK(json_array_size(rb) == 2 && json_integer_value(json_array_get(rb, 0)) == (json_int_t)rank &&
          json_integer_value(json_array_get(rb, 1)) == (json_int_t)rank);
    CHECK(json_integer_value(json_object_get(plan, "backend_bytes")) == (json_int_t)(2 * rank));
    json_decref(plan);
    /* all ranks together against the host's limit, with the numbers */
    zt_jobs_config limited = cfg;
    limited.host_mem_limit = rank;
    CHECK(zt__job_spec_check_resources(&s, &limited, &needs, err, sizeof err) == -ENOMEM);
    char want[256], one[32], two[32];
    zt_size_format(one, sizeof one, (double)rank);
    zt_size_format(two, sizeof two, 2.0 * (double)rank);
    snprintf(want, sizeof want, "job needs %s on the cpu backend (2 ranks of %s: parallel.gpus 2, "
             "zero_stage %d); host limit %s", two, one, stage, one);
    if (strcmp(err, want) != 0) {
      fprintf(stderr, "refusal \"%s\" lacks \"%s\"\n", err, want);
      return 1;
    }
    json_decref(spec);
  }
  /* train.epochs: a step's rows are every rank's; 2 epochs of the file's 124 windows of 8 at
   * 2 ranks x micro_batch 2 x grad_accum 3 = 12 rows a step, the last partial */
  {
    json_t *spec = spec_of("{\"gpus\": 2}");
    json_object_set_new(spec, "train", json_pack("{s:i, s:i, s:i}", "epochs", 2, "micro_batch", 2,
                                                 "grad_accum", 3));
    int rc;
    json_t *plan = jt_plan(jobs, spec, &rc, err, sizeof err);
    CHECK(plan && rc == 0 && json_integer_value(json_object_get(plan, "steps")) == 21);
    json_decref(plan);
    json_decref(spec);
  }
  /* A spec without "parallel" is one rank; the stored spec writes it out. */
  {
    json_t *spec = spec_of(NULL);
    zt_job_spec s;
    CHECK(zt__job_spec_parse(spec, &s, err, sizeof err) == 0);
    CHECK(s.gpus == 1 && s.zero_stage == 1);
    json_t *back = zt__job_spec_to_json(&s);
    json_t *p = json_object_get(back, "parallel");
    CHECK(json_integer_value(json_object_get(p, "gpus")) == 1 &&
          json_integer_value(json_object_get(p, "zero_stage")) == 1);
    json_decref(back);
    json_decref(spec);
  }
  /* "all" is stored as the daemon's count (a restart resumes the same split of the data). */
  {
    json_t *spec = spec_of("{\"gpus\": \"all\", \"zero_stage\": 3}");
    json_object_set_new(spec, "data", json_pack("{s:s}", "source", "stream"));
    CHECK(jt_submit(jobs, spec, id, err, sizeof err) == 0);
    char path[800];
    snprintf(path, sizeof path, "%s/jobs/%s", state, id);
    json_error_t je;
    char file[900];
    snprintf(file, sizeof file, "%s/spec.json", path);
    json_t *stored = json_load_file(file, 0, &je);
    CHECK(stored != NULL);
    json_t *p = json_object_get(stored, "parallel");
    CHECK(json_integer_value(json_object_get(p, "gpus")) == RANKS &&
          json_integer_value(json_object_get(p, "zero_stage")) == 3);
    zt_job_spec s;
    CHECK(zt__job_spec_parse(stored, &s, err, sizeof err) == 0 && s.gpus == RANKS &&
          s.zero_stage == 3);
    json_decref(stored);
    json_decref(spec);
    snprintf(file, sizeof file, "%s,%s,%s,%s", id, id, id, id);
    wait_arg w = {jobs, file};
    jt_run_until(&loop, holders_are, &w, 30);
    CHECK(zt_jobs_cancel(jobs, id, err, sizeof err) == 0);
    snprintf(file, sizeof file, "-,-,-,-");
    jt_run_until(&loop, holders_are, &w, 30);
  }
  check_scheduling(jobs, &loop);

  jt_close(jobs, &loop);
  uv_loop_close(&loop);
  json_decref(ev.all);
  jt_rmtree(dir);
  printf("job_parallel: ok\n");
  return 0;
}
