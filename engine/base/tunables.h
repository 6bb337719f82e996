/* Every tunable of ztd in one place, with its default. Flags override some of them at startup
 * (named next to each); the rest are compile-time choices that a benchmark, not a user, changes. */
#ifndef ZT_TUNABLES_H
#define ZT_TUNABLES_H

/* --max-frame: the longest frame a client may send (and the longest reply ztd builds). */
#define ZT_TUNE_MAX_FRAME_DEFAULT (64u << 20) /* proto/zt_proto.h's ZT_PROTO_FRAME_MAX_DEFAULT */
/* Below this a frame could not carry one export chunk plus its envelope. */
#define ZT_TUNE_MAX_FRAME_MIN (64u << 10)
#define ZT_TUNE_MAX_FRAME_MAX (1u << 30)

/* Room left in a frame for the envelope of an export reply (id, ok, total, step, keys); the
 * data of one export chunk is capped to max_frame minus this. */
#define ZT_TUNE_EXPORT_ENVELOPE (4u << 10)

/* The most bytes of a job's log one logs reply carries (engine/job/joblog.c); invalid UTF-8 goes
 * out as \xNN, so the text is at most four times this. */
#define ZT_TUNE_LOG_CHUNK (16u << 10)
/* A Hugging Face export's shards (engine/model/hf_export.c): the tensor bytes of one at most (a
 * larger tensor alone), as save_pretrained's max_shard_size "5GB"; a request may ask less. What
 * the conversion holds of a tensor at a time, in fp32 elements (16 MiB). */
#define ZT_TUNE_HF_SHARD_BYTES 5000000000ull
#define ZT_TUNE_HF_CHUNK_ELEMS ((size_t)4 << 20)

/* Large reads and writes of checkpoint and model files (engine/base/pio.c): a transfer of at
 * least two pieces is cut into pieces of this many bytes that this many threads issue at once,
 * so the disk sees several requests in flight instead of one buffered read's readahead. */
#define ZT_TUNE_PIO_PIECE_BYTES ((size_t)4 << 20)
#define ZT_TUNE_PIO_THREADS 4

/* The seeded random init's share of work a pool thread takes at a time, in elements (~10 ms of
 * Box-Muller; engine/train/trainer.c). */
#define ZT_TUNE_INIT_CHUNK ((size_t)256 << 10)

/* Micro-batches a stream job buffers before ztd stops granting credit to its producer. */
#define ZT_TUNE_BATCH_QUEUE_DEPTH 4u

/* listen(2) backlog of the Unix and TCP listeners. */
#define ZT_TUNE_LISTEN_BACKLOG 64

/* Bytes read from a socket per read callback (one buffer per connection). */
#define ZT_TUNE_READ_CHUNK (64u << 10)

/* Bytes queued for writing on one connection before ztd pushes back: requests stop being read
 * until the queue drains below half of this, and a watcher whose events would grow it further is
 * dropped (see conn.c). A single reply may exceed it (an export chunk); events never wait. */
#define ZT_TUNE_CONN_WRITE_QUEUE_MAX (8u << 20)

/* How long a graceful stop waits for replies to reach clients that do not read them. */
#define ZT_TUNE_SHUTDOWN_FLUSH_MS 5000

/* A job spanning daemons: how long its coordinator, having stopped, waits for its parts on the
 * peers to end by themselves (they stop at the same step) before closing their connections,
 * which ends them. Covers a part's last checkpoint exchange and its status writes. */
#define ZT_TUNE_PART_END_WAIT_S 60

/* Before its hello (with the token, on TCP) is accepted a connection may send frames of at most
 * this many bytes (a hello with the longest token fits), must say hello within this many
 * milliseconds, and counts against a cap of unauthenticated connections per listener; every
 * listener also caps its connections. Over a cap a new connection is closed at once. */
#define ZT_TUNE_PREAUTH_FRAME_MAX (8u << 10)
#define ZT_TUNE_HELLO_TIMEOUT_MS 10000
#define ZT_TUNE_MAX_PREAUTH_CONNS 64
#define ZT_TUNE_MAX_CONNS 1024

/* Failed TCP tokens: after this many from one peer address, hellos from it are refused without
 * a look at the token for a backoff that doubles with each further failure up to the maximum;
 * the log says so once per backoff. The table remembers this many addresses. */
#define ZT_TUNE_TOKEN_FREE_FAILURES 3
#define ZT_TUNE_TOKEN_BACKOFF_MS 1000
#define ZT_TUNE_TOKEN_BACKOFF_MAX_MS 30000
#define ZT_TUNE_TOKEN_PEERS 256

/* The HTTP listener (ztd --http, engine/server/http.c), under the same rules as the protocol's
 * listeners: at most this many connections at once, and per client address; a connection idle
 * (or slow to send its request) this long is closed; a request's line and headers must fit in
 * this many bytes (libmicrohttpd answers a longer one itself) and a request has no body. */
#define ZT_TUNE_HTTP_MAX_CONNS 64
#define ZT_TUNE_HTTP_MAX_CONNS_PER_IP 16
#define ZT_TUNE_HTTP_TIMEOUT_S 10
#define ZT_TUNE_HTTP_REQUEST_MAX (16u << 10)
/* Its history for the dashboard (engine/server/history.c): the points kept per job (thinned to
 * every other one when full, so they span the run), and the jobs kept (those that stepped
 * last). */
#define ZT_TUNE_HTTP_HISTORY_POINTS 1024
#define ZT_TUNE_HTTP_HISTORY_JOBS 32

/* Length limits of the TCP token file: shorter tokens are refused as guessable. */
#define ZT_TUNE_TOKEN_MIN 16
#define ZT_TUNE_TOKEN_MAX 4096

/* The offload planner's cost model (engine/plan/offload_plan.c), the rates it ranks plans by.
 * Measured on the H200 machine (docs/BENCHMARKS.md); the CPU backend plans with the same rates,
 * as the GPU it stands in for, so CI runs the plans a GPU would. */
/* bf16 step, flops by 6*N*tokens + attention, of a model of width 2048 (ZT_PLAN_FLOPS_WIDTH),
 * and the width at which the rate is half its limit: GPT-2 124M (d 768) and 1.5B (d 1600) steps
 * ran at 2.8e14 and 3.86e14 on the H200 (docs/BENCHMARKS.md, session 11) */
#define ZT_TUNE_PLAN_DEVICE_FLOPS_LP 4.2e14
#define ZT_TUNE_PLAN_DEVICE_FLOPS_F32 4.0e13
#define ZT_TUNE_PLAN_FLOPS_KNEE 860
/* params/s of the CPU AdamW pool while the step's copies share the host's memory (2.8e9 inside
 * the H200's offloaded steps, session 11), and alone (bench_cpu_adam: 4.7e9 with the bf16 copy) */
#define ZT_TUNE_PLAN_CPU_ADAM_PARAMS 2.8e9
#define ZT_TUNE_PLAN_CPU_ADAM_ALONE_PARAMS 4.7e9
/* bytes/s the runner reads gradients at for their sum of squares (norm, inf/nan check): the
 * fit to the H200's clipped steps of session 11 */
#define ZT_TUNE_PLAN_HOST_SUMSQ_BYTES 5.0e10
#define ZT_TUNE_PLAN_LINK_BYTES 5.0e10       /* pinned copies, each way */
/* bytes/s the NVMe tier reads and writes the optimizer state at (bench_nvme: 1.59 read, 1.90
 * write on the H200 machine's disk) */
#define ZT_TUNE_PLAN_NVME_BYTES 1.7e9
/* device memory bytes/s the device units' AdamW moves (18 bytes a parameter) */
#define ZT_TUNE_PLAN_HBM_BYTES 3e12
/* These are the built-in rates (engine/plan/rates.h); a state dir's rates.json replaces them. */

/* MFU, the model flops utilisation of a step event ("mfu", docs/protocol.md): 6 * N * tokens/s
 * (N the model's parameters: the forward and backward of their matmuls, attention left out, as
 * MFU is usually quoted) over the peak rate of the devices the job runs on, these nominal
 * figures times the job's ranks. cuda: an H100/H200 SXM's dense tensor-core rates (bf16 and fp16;
 * fp32 with train.tf32) and its fp32 rate without; cpu: per thread of a rank's backend, two
 * 8-wide fp32 FMAs a cycle at 3 GHz. */
#define ZT_TUNE_PEAK_FLOPS_CUDA_LP 9.89e14
#define ZT_TUNE_PEAK_FLOPS_CUDA_TF32 4.94e14
#define ZT_TUNE_PEAK_FLOPS_CUDA_F32 6.7e13
#define ZT_TUNE_PEAK_FLOPS_CPU_THREAD 9.6e10

/* The most host memory the offloaded step's gradient ring grows to so that the backward does
 * not wait for the CPU AdamW to free a slot (engine/plan/offload_plan.c ring_slots): GPT-2
 * 1.5B's streamed units take about 1.5 GB; a 10 B model's keep the minimal ring. */
#define ZT_TUNE_GRAD_RING_BYTES (4ull << 30)

/* The llama head's logits a chunk of rows at a time (engine/model/llama.c): the bytes of one
 * chunk, rows = this / (vocab x the activations' element size), at least one row. A 16k-token
 * micro-batch of a 128256 vocabulary takes 8.4 GB of fp32 logits whole; 64 MiB is 130 rows,
 * each chunk's two matmuls still large enough to keep the GPU busy. */
#define ZT_TUNE_LOSS_CHUNK_BYTES (64u << 20)

/* Directories --nvme-dir and --data-root may each name. */
#define ZT_TUNE_MAX_ROOTS 16

/* GPUs --gpus may name, and simulated ranks --cpu-ranks may give the cpu backend. */
#define ZT_TUNE_MAX_GPUS 64

/* --cpu-ranks: the cpu daemon's simulated ranks (its device set: a job's parallel.gpus takes
 * that many, each a CPU backend of --cpu-threads / ranks threads). One keeps a job on all the
 * cores and jobs one at a time, as on a machine with one device. */
#define ZT_TUNE_CPU_RANKS_DEFAULT 1

#endif
