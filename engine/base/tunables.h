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

/* Length limits of the TCP token file: shorter tokens are refused as guessable. */
#define ZT_TUNE_TOKEN_MIN 16
#define ZT_TUNE_TOKEN_MAX 4096

/* The offload planner's cost model (engine/train/offload/offload_step.c), the rates it ranks plans by.
 * Measured on the H200 machine (docs/BENCHMARKS.md); the CPU backend plans with the same rates,
 * as the GPU it stands in for, so CI runs the plans a GPU would. */
#define ZT_TUNE_PLAN_DEVICE_FLOPS_LP 3.5e14  /* bf16 step, flops by 6*N*tokens + attention */
#define ZT_TUNE_PLAN_DEVICE_FLOPS_F32 4.0e13
/* params/s of the CPU AdamW pool while the step's copies share the host's memory (4.9e9 alone,
 * 2.2e9 to 3e9 measured inside offloaded steps) */
#define ZT_TUNE_PLAN_CPU_ADAM_PARAMS 2.5e9
/* bytes/s the runner reads gradients at for their sum of squares (norm, inf/nan check) */
#define ZT_TUNE_PLAN_HOST_SUMSQ_BYTES 2.0e10
#define ZT_TUNE_PLAN_LINK_BYTES 5.0e10       /* pinned copies, each way */
/* bytes/s the NVMe tier reads and writes the optimizer state at (bench_nvme: 1.59 read, 1.90
 * write on the H200 machine's disk) */
#define ZT_TUNE_PLAN_NVME_BYTES 1.7e9

/* The most host memory the offloaded step's gradient ring grows to so that the backward does
 * not wait for the CPU AdamW to free a slot (offload_step.c ring_slots): GPT-2 1.5B's streamed
 * units take about 1.5 GB; a 10 B model's keep the minimal ring. */
#define ZT_TUNE_GRAD_RING_BYTES (4ull << 30)

/* Directories --nvme-dir and --data-root may each name. */
#define ZT_TUNE_MAX_ROOTS 16

/* GPUs --gpus may name, and simulated ranks --cpu-ranks may give the cpu backend. */
#define ZT_TUNE_MAX_GPUS 64

/* --cpu-ranks: the cpu daemon's simulated ranks (its device set: a job's parallel.gpus takes
 * that many, each a CPU backend of --cpu-threads / ranks threads). One keeps a job on all the
 * cores and jobs one at a time, as on a machine with one device. */
#define ZT_TUNE_CPU_RANKS_DEFAULT 1

#endif
