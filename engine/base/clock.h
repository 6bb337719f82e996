/* The monotonic clock in nanoseconds, which the tiers' busy and wait times are counted in. */
#ifndef ZT_OFFLOAD_CLOCK_H
#define ZT_OFFLOAD_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t zt_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif
