/* The monotonic clock in nanoseconds, which the tiers' busy and wait times are counted in; the
 * wall clock in Unix seconds, which a job's step points are stamped with. */
#ifndef ZT_OFFLOAD_CLOCK_H
#define ZT_OFFLOAD_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t zt_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline double zt_unix_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
