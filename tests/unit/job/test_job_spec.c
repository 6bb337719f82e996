/* Spec validation through zt_jobs_submit: every bad spec fails with its errno and a message
 * naming the field (a Hugging Face directory's weights checked at submit); nothing is written
 * for it; a good spec gets every default filled. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "engine/kernels/backend.h"
#include "engine/job/spec.h"
#include "engine/model/safetensors.h"
#include "jobtest.h"

static char g_tok[600], g_bad_tok[600], g_short_tok[600], g_big_vocab[600], g_dir_path[600];

static json_t *base_spec(void) {
  json_error_t je;
  json_t *j = json_loads(
      "{\"name\": \"tiny\", \"model\": {\"arch\": \"gpt\", \"vocab\": 32, \"seq_len\": 8, "
      "\"d_model\": 16, \"n_heads\": 2, \"n_layers\": 1}, \"train\": {\"steps\": 4, "
      "\"micro_batch\": 2}, \"data\": {\"source\": \"file\", \"path\": \"\"}}",
      0, &je);
  CHECK(j != NULL);
  json_object_set_new(json_object_get(j, "data"), "path", json_string(g_tok));
  return j;
}

/* Sets (or with value NULL removes) the member at a dotted path, creating objects on the way. */
static void set_path(json_t *j, const char *path, json_t *value) {
  char buf[128];
  snprintf(buf, sizeof buf, "%s", path);
  char *key = buf, *dot;
  while ((dot = strchr(key, '.'))) {
    *dot = '\0';
    json_t *next = json_object_get(j, key);
    if (!json_is_object(next)) {
      next = json_object();
      json_object_set_new(j, key, next);
    }
    j = next;
    key = dot + 1;
  }
  if (value)
    json_object_set_new(j, key, value);
  else
    json_object_del(j, key);
}

typedef struct bad_case {
  const char *path;   /* member to change */
  const char *value;  /* JSON text; NULL removes it; "@tok"-style names pick a test file */
  int err;
  const char *msg;    /* substring of the message */
} bad_case;

static const bad_case k_bad[] = {
  {"model.d_model", "0", -EINVAL, "model.d_model must be a positive integer"},
  {"model.d_model", "-16", -EINVAL, "model.d_model must be a positive integer"},
  {"model.d_model", "1000000000", -EINVAL, "model.d_model must be at most"},
  {"model.d_model", "\"16\"", -EINVAL, "model.d_model must be a positive integer"},
  {"model.d_model", "16.5", -EINVAL, "model.d_model must be a positive integer"},
  {"model.d_model", NULL, -EINVAL, "model.d_model is required"},
  {"model.vocab", "0", -EINVAL, "model.vocab"},
  {"model.seq_len", "-1", -EINVAL, "model.seq_len"},
  {"model.n_layers", "true", -EINVAL, "model.n_layers"},
  {"model.n_heads", "3", -EINVAL, "model.n_heads must divide model.d_model"},
  {"model.d_ff", "-4", -EINVAL, "model.d_ff"},
  {"model.dmodel", "16", -EINVAL, "unknown field 'model.dmodel'"},
  {"modle", "{}", -EINVAL, "unknown field 'modle'"},
  {"model.arch", "\"lstm\"", -EINVAL, "model.arch"},
  {"model", "[]", -EINVAL, "model must be an object"},
  {"model.init", "{\"seed\": 1, \"safetensors\": \"/x\"}", -EINVAL, "model.init"},
  {"model.init.seed", "-1", -EINVAL, "model.init.seed"},
  {"model.init", "{\"safetensors\": \"/nonexistent/init.safetensors\"}", -ENOENT,
   "model.init.safetensors: /nonexistent/init.safetensors: No such file or directory"},
  {"model.init", "{\"safetensors\": \"rel.safetensors\"}", -EINVAL,
   "model.init.safetensors must be an absolute path"},
  {"train.steps", "0", -EINVAL, "train.steps"},
  {"train.steps", NULL, -EINVAL, "train.steps is required (or train.epochs"},
  {"train.epochs", "0", -EINVAL, "train.epochs must be a positive integer"},
  {"train.epochs", "1001", -EINVAL, "train.epochs must be at most 1000"},
  {"train.epochs", "2", -EINVAL, "train.epochs and train.steps: give one"},
  /* 1000 tokens in windows of 8: 124 rows an epoch, 2 a step */
  {"train", "{\"epochs\": 2, \"micro_batch\": 2, \"schedule\": {\"warmup_steps\": 125}}",
   -EINVAL, "warmup_steps 125 is more than the 124 steps that train.epochs 2 makes of data.path"},
  {"train.micro_batch", "-2", -EINVAL, "train.micro_batch"},
  {"train.grad_accum", "0", -EINVAL, "train.grad_accum"},
  {"train.precision", "\"bf16\"", -EINVAL,
   "train.precision \"bf16\" needs the cuda backend; this daemon runs the cpu backend"},
  {"train.precision", "\"fp16\"", -EINVAL,
   "train.precision \"fp16\" needs the cuda backend; this daemon runs the cpu backend"},
  {"train.tf32", "true", -EINVAL,
   "train.tf32 needs the cuda backend; this daemon runs the cpu backend"},
  {"train.tf32", "1", -EINVAL, "train.tf32 must be true or false"},
  {"train.precision", "\"fp8\"", -EINVAL, "train.precision"},
  {"train.optimizer.name", "\"sgd\"", -EINVAL, "train.optimizer.name"},
  {"train.optimizer.lr", "0", -EINVAL, "train.optimizer.lr"},
  {"train.optimizer.lr", "\"fast\"", -EINVAL, "train.optimizer.lr"},
  {"train.optimizer.betas", "[0.9]", -EINVAL, "train.optimizer.betas"},
  {"train.optimizer.betas", "[0.9, 1.0]", -EINVAL, "train.optimizer.betas[1]"},
  {"train.optimizer.eps", "-1e-8", -EINVAL, "train.optimizer.eps"},
  /* a value a float holds as 0 is refused, not trained with lr 0 */
  {"train.optimizer.lr", "1e-50", -EINVAL, "train.optimizer.lr is 1e-50"},
  {"train.optimizer.momentum", "0.9", -EINVAL, "unknown field 'train.optimizer.momentum'"},
  {"train.optimizer.state_dtype", "\"fp16\"", -EINVAL,
   "train.optimizer.state_dtype must be \"fp32\" or \"bf16\""},
  {"train.schedule.name", "\"linear\"", -EINVAL, "train.schedule.name"},
  {"train.schedule.warmup_steps", "-1", -EINVAL, "train.schedule.warmup_steps"},
  {"train.schedule.warmup_steps", "100", -EINVAL, "warmup_steps"},
  {"train.grad_clip", "-1", -EINVAL, "train.grad_clip"},
  {"train.seed", "1.5", -EINVAL, "train.seed"},
  {"data.source", "\"http\"", -EINVAL, "data.source"},
  {"data.source", NULL, -EINVAL, "data.source is required"},
  {"data.path", "\"relative.tok\"", -EINVAL, "data.path must be an absolute path"},
  {"data.path", "\"/nonexistent/x.tok\"", -ENOENT,
   "data.path: /nonexistent/x.tok: No such file or directory"},
  {"data.path", "@bad", -EINVAL, "not a token file"},
  {"data.path", "@short", -EINVAL, "model.seq_len 8 needs at least 9"},
  {"data.path", "@vocab", -EINVAL, "token vocabulary 1000 is larger than model.vocab 32"},
  {"data.path", "@dir", -EINVAL, "not a regular file"},
  {"data", "{\"source\": \"stream\", \"path\": \"/x.tok\"}", -EINVAL, "unknown field 'data.path'"},
  {"checkpoint.keep", "-1", -EINVAL, "checkpoint.keep must be a non-negative integer"},
  {"checkpoint.keep", "1001", -EINVAL, "checkpoint.keep"},
  {"checkpoint.every", "-1", -EINVAL, "checkpoint.every must be a non-negative integer"},
  {"checkpoint.often", "1", -EINVAL, "unknown field 'checkpoint.often'"},
  {"log.tensorboard", "1", -EINVAL, "log.tensorboard must be true or false"},
  {"log", "{\"csv\": true}", -EINVAL, "unknown field 'log.csv'"},
  {"log", "[]", -EINVAL, "log must be an object"},
  {"name", "7", -EINVAL, "name must be a string"},
  {"name", "\"a\\u0000b\"", -EINVAL, "name must not contain NUL bytes"},
  {"data.path", "\"/tmp/x\\u0000.tok\"", -EINVAL, "data.path must not contain NUL bytes"},
  {"name", "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"", -EINVAL,
   "name must be at most 64"},
  /* About 51 G parameters: fits the model's bounds, not this machine. */
  {"model", "{\"arch\": \"gpt\", \"vocab\": 32, \"seq_len\": 8, \"d_model\": 8192, "
            "\"n_heads\": 64, \"n_layers\": 64}", -ENOMEM,
   "parameters, gradients and AdamW state 768.11 GiB); this machine has"},
};

int main(void) {
  char dir[512], state[600];
  jt_tempdir(dir, sizeof dir, "spec");
  snprintf(state, sizeof state, "%s/state", dir);
  snprintf(g_tok, sizeof g_tok, "%s/good.tok", dir);
  snprintf(g_bad_tok, sizeof g_bad_tok, "%s/bad.tok", dir);
  snprintf(g_short_tok, sizeof g_short_tok, "%s/short.tok", dir);
  snprintf(g_big_vocab, sizeof g_big_vocab, "%s/vocab.tok", dir);
  snprintf(g_dir_path, sizeof g_dir_path, "%s/adir", dir);
  jt_write_tokens(g_tok, 32, 2, 1000);
  jt_write_file(g_bad_tok, "NOTTOKENS and some more bytes", 29);
  jt_write_tokens(g_short_tok, 32, 4, 8);
  jt_write_tokens(g_big_vocab, 1000, 2, 1000);
  CHECK(mkdir(g_dir_path, 0755) == 0);

  uv_loop_t loop;
  uv_loop_init(&loop);
  jt_events ev = {.all = json_array()};
  zt_jobs *jobs = jt_open(&loop, state, &ev, 4);
  char id[ZT_JOB_ID_MAX], err[1024];

  for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
    const bad_case *c = &k_bad[i];
    json_t *spec = base_spec();
    json_t *v = NULL;
    if (c->value && c->value[0] == '@') {
      const char *p = strcmp(c->value, "@bad") == 0     ? g_bad_tok
                      : strcmp(c->value, "@short") == 0 ? g_short_tok
                      : strcmp(c->value, "@vocab") == 0 ? g_big_vocab
                                                        : g_dir_path;
      v = json_string(p);
    } else if (c->value) {
      json_error_t je;
      v = json_loads(c->value, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
      CHECK(v != NULL);
    }
    set_path(spec, c->path, v);
    err[0] = '\0';
    int rc = jt_submit(jobs, spec, id, err, sizeof err);
    if (rc != c->err || !strstr(err, c->msg)) {
      fprintf(stderr, "case %zu (%s = %s): rc %d (want %d), message \"%s\" (want \"%s\")\n", i,
              c->path, c->value ? c->value : "<removed>", rc, c->err, err, c->msg);
      return 1;
    }
    json_decref(spec);
  }
  /* A Hugging Face directory: config.json read at submit, its weights checked there too. */
  {
    char hf[600], path[700];
    snprintf(hf, sizeof hf, "%s/hf", dir);
    CHECK(mkdir(hf, 0755) == 0);
    snprintf(path, sizeof path, "%s/config.json", hf);
    const char *cj = "{\"model_type\": \"llama\", \"hidden_size\": 16, \"num_attention_heads\": "
                     "2, \"intermediate_size\": 32, \"num_hidden_layers\": 1, \"vocab_size\": "
                     "32, \"tie_word_embeddings\": true}";
    jt_write_file(path, cj, strlen(cj));
    json_t *spec = base_spec();
    set_path(spec, "model", json_pack("{s:s, s:i}", "hf", hf, "seq_len", 8));
    int rc = jt_submit(jobs, spec, id, err, sizeof err);
    CHECK(rc == -ENOENT && strstr(err, "model.hf: ") && strstr(err, "holds neither"));
    /* a file of one tensor: the first the model misses is named */
    zt_st_entry e = {.name = "model.embed_tokens.weight", .ndim = 2, .shape = {32, 16},
                     .data = calloc(32 * 16, sizeof(float))};
    snprintf(path, sizeof path, "%s/model.safetensors", hf);
    CHECK(zt_st_write(path, &e, 1, NULL, 0, err, sizeof err) == 0);
    free((void *)e.data);
    rc = jt_submit(jobs, spec, id, err, sizeof err);
    CHECK(rc == -EINVAL &&
          strstr(err, "tensor model.layers.0.input_layernorm.weight is missing"));
    set_path(spec, "model.seq_len", json_integer(4096));
    rc = jt_submit(jobs, spec, id, err, sizeof err);
    CHECK(rc == -EINVAL && strstr(err, "max_position_embeddings"));
    json_decref(spec);
  }
  /* A limit set by the operator gives the numbers against it. */
  {
    json_t *spec = base_spec();
    zt_job_spec s;
    zt__job_needs bytes;
    CHECK(zt__job_spec_parse(spec, &s, err, sizeof err) == 0);
    zt_jobs_config limited = {.backend = "cpu", .host_mem_limit = 1000};
    zt_jobs_config unlimited = {.backend = "cpu"};
    CHECK(zt__job_spec_check_resources(&s, &limited, &bytes, err, sizeof err) == -ENOMEM);
    CHECK(strstr(err, "job needs ") && strstr(err, "on the cpu backend (activations ") &&
          strstr(err, "); host limit 1000 B"));
    CHECK(zt__job_spec_check_resources(&s, &unlimited, &bytes, err, sizeof err) == 0);
    CHECK(bytes.backend_bytes ==
          zt_trainer_estimate_bytes(&s.model, &s.train, zt_backend_cpu_ops()));
    json_decref(spec);
  }
  /* bf16 AdamW state runs on one rank, offloaded or not: an offloaded job is planned (the
   * data-parallel open's refusal: tests/unit/model/test_state_dtype.c) */
  {
    json_t *spec = base_spec();
    set_path(spec, "train.optimizer.state_dtype", json_string("bf16"));
    set_path(spec, "offload", json_pack("{s:s}", "optimizer", "host"));
    err[0] = '\0';
    int rc;
    json_t *plan = jt_plan(jobs, spec, &rc, err, sizeof err);
    if (rc) fprintf(stderr, "offloaded bf16 state refused: %s\n", err);
    CHECK(rc == 0 && plan);
    json_decref(plan);
    json_decref(spec);
  }
  /* bf16/fp16/tf32 pass where the backend is cuda (without a GPU the memory is not checked),
   * with the trainer's estimate for that precision. */
  for (int k = 0; k < 3; k++) {
    static const char *const prec[] = {"bf16", "fp16", "fp32"};
    json_t *spec = base_spec();
    set_path(spec, "train.precision", json_string(prec[k]));
    set_path(spec, "train.tf32", json_boolean(k == 2));
    zt_job_spec s;
    zt__job_needs bytes;
    CHECK(zt__job_spec_parse(spec, &s, err, sizeof err) == 0);
    CHECK(s.train.precision == (k == 0 ? ZT_BF16 : k == 1 ? ZT_F16 : ZT_F32));
    CHECK(s.train.tf32 == (k == 2));
    zt_jobs_config cuda = {.backend = "cuda"};
    CHECK(zt__job_spec_check_resources(&s, &cuda, &bytes, err, sizeof err) == 0);
    /* sized by the cuda backend's own table (its attention saves far less than the CPU's);
     * a daemon only runs cuda in builds that have it */
    if (zt_backend_have_cuda())
      CHECK(bytes.backend_bytes ==
            zt_trainer_estimate_bytes(&s.model, &s.train, zt_backend_ops_of("cuda")));
    /* the spec written back parses to the same precision */
    json_t *back = zt__job_spec_to_json(&s);
    zt_job_spec s2;
    CHECK(back && zt__job_spec_parse(back, &s2, err, sizeof err) == 0);
    CHECK(s2.train.precision == s.train.precision && s2.train.tf32 == s.train.tf32);
    json_decref(back);
    json_decref(spec);
  }

  /* train.epochs: counted from the file at admission (the plan's steps: 3 epochs of 124 rows
   * at 8 rows a step, the last step partial), refused with a stream */
  {
    json_t *spec = base_spec();
    set_path(spec, "train", json_pack("{s:i, s:i, s:i}", "epochs", 3, "micro_batch", 4,
                                      "grad_accum", 2));
    int rc;
    json_t *plan = jt_plan(jobs, spec, &rc, err, sizeof err);
    CHECK(rc == 0 && plan && json_integer_value(json_object_get(plan, "steps")) == 47 &&
          json_integer_value(json_object_get(plan, "epochs")) == 3);
    json_decref(plan);
    /* parsed, unresolved (steps 0), written back without steps and parsed again the same */
    zt_job_spec p1, p2;
    CHECK(zt__job_spec_parse(spec, &p1, err, sizeof err) == 0);
    CHECK(p1.train.epochs == 3 && p1.train.steps == 0);
    json_t *back = zt__job_spec_to_json(&p1);
    json_t *bt = json_object_get(back, "train");
    CHECK(back && !json_object_get(bt, "steps") &&
          json_integer_value(json_object_get(bt, "epochs")) == 3);
    CHECK(zt__job_spec_parse(back, &p2, err, sizeof err) == 0 && memcmp(&p1, &p2, sizeof p1) == 0);
    json_decref(back);
    set_path(spec, "data", json_pack("{s:s}", "source", "stream"));
    CHECK(jt_submit(jobs, spec, id, err, sizeof err) == -EINVAL &&
          strstr(err, "train.epochs counts passes over data.path's token file; data.source "
                      "\"stream\" has no end to count: give train.steps"));
    json_decref(spec);
  }

  /* Nothing was written and no id was used by the refusals. */
  json_t *st = zt_jobs_status(jobs);
  CHECK(json_integer_value(json_object_get(st, "jobs")) == 0);
  json_decref(st);

  /* A good spec: defaults filled in the stored spec (the job may start; closing stops it). */
  json_t *spec = base_spec();
  set_path(spec, "train.steps", json_integer(2));
  CHECK(jt_submit(jobs, spec, id, err, sizeof err) == 0);
  json_decref(spec);
  CHECK(strcmp(id, "j000001") == 0);
  int rc;
  json_t *show = zt_jobs_show(jobs, id, &rc, err, sizeof err);
  CHECK(rc == 0 && show);
  json_t *s = json_object_get(show, "spec");
  CHECK(json_integer_value(json_object_get(json_object_get(s, "model"), "d_ff")) == 0);
  CHECK(json_integer_value(json_object_get(json_object_get(json_object_get(s, "model"), "init"),
                                           "seed")) == 0);
  json_t *train = json_object_get(s, "train");
  CHECK(json_integer_value(json_object_get(train, "grad_accum")) == 1);
  CHECK(strcmp(json_string_value(json_object_get(train, "precision")), "fp32") == 0);
  CHECK(json_is_false(json_object_get(train, "tf32")));
  CHECK(json_integer_value(json_object_get(train, "seed")) == 0);
  CHECK(json_real_value(json_object_get(train, "grad_clip")) == 0.0);
  json_t *opt = json_object_get(train, "optimizer");
  CHECK(strcmp(json_string_value(json_object_get(opt, "name")), "adamw") == 0);
  CHECK((float)json_real_value(json_object_get(opt, "lr")) == 1e-3f);
  CHECK((float)json_real_value(json_array_get(json_object_get(opt, "betas"), 0)) == 0.9f);
  CHECK((float)json_real_value(json_array_get(json_object_get(opt, "betas"), 1)) == 0.999f);
  CHECK((float)json_real_value(json_object_get(opt, "eps")) == 1e-8f);
  CHECK((float)json_real_value(json_object_get(opt, "weight_decay")) == 0.01f);
  json_t *sched = json_object_get(train, "schedule");
  CHECK(strcmp(json_string_value(json_object_get(sched, "name")), "constant") == 0);
  CHECK(json_integer_value(json_object_get(sched, "warmup_steps")) == 0);
  json_t *ck = json_object_get(s, "checkpoint");
  CHECK(json_integer_value(json_object_get(ck, "every")) == 0);
  CHECK(json_integer_value(json_object_get(ck, "keep")) == 2);
  json_decref(show);

  /* The stored spec parses back to the same struct (what a restarted daemon reads). */
  char jobdir[700];
  snprintf(jobdir, sizeof jobdir, "%s/jobs/%s/spec.json", state, id);
  json_error_t je;
  json_t *stored = json_load_file(jobdir, 0, &je);
  CHECK(stored != NULL);
  zt_job_spec a, b;
  json_t *again = base_spec();
  set_path(again, "train.steps", json_integer(2));
  CHECK(zt__job_spec_parse(stored, &a, err, sizeof err) == 0);
  CHECK(zt__job_spec_parse(again, &b, err, sizeof err) == 0);
  CHECK(memcmp(&a, &b, sizeof a) == 0);
  json_decref(stored);
  json_decref(again);

  jt_close(jobs, &loop);
  CHECK(uv_loop_close(&loop) == 0);
  json_decref(ev.all);
  jt_rmtree(dir);
  return 0;
}
