#include "engine/kernels/mem.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/log.h"

/* bytes rounded up to the block alignment (0 takes a slot too, as cudaMalloc(0) would fail);
 * SIZE_MAX when that overflows */
static size_t slot_bytes(size_t bytes) {
  if (bytes > SIZE_MAX - (ZT__MEM_ALIGN - 1)) return SIZE_MAX;
  return bytes ? (bytes + ZT__MEM_ALIGN - 1) / ZT__MEM_ALIGN * ZT__MEM_ALIGN : ZT__MEM_ALIGN;
}

int zt__mem_init(zt__mem *m, const zt__mem_raw *raw) {
  memset(m, 0, sizeof *m);
  m->raw = *raw;
  m->open = -1;
  return -pthread_mutex_init(&m->mu, NULL);
}

/* under mu */
static void release_block(zt__mem *m, int i) {
  zt__mem_block *b = &m->blocks[i];
  if (b->base) m->raw.free(m->raw.ctx, b->base);
  m->st.reserved -= b->size;
  *b = (zt__mem_block){0};
}

void zt__mem_destroy(zt__mem *m) {
  if (m->n_recs)
    ZT_LOGW("kernels", "backend closed with %zu allocation%s (%llu bytes) not freed", m->n_recs,
            m->n_recs == 1 ? "" : "s", (unsigned long long)m->st.allocated);
  for (int i = 0; i < m->n_blocks; i++)
    if (m->blocks[i].size) release_block(m, i);
  free(m->recs);
  free(m->blocks);
  pthread_mutex_destroy(&m->mu);
}

/* under mu: room for one more record */
static int grow_recs(zt__mem *m) {
  if (m->n_recs < m->cap_recs) return 0;
  size_t cap = m->cap_recs ? 2 * m->cap_recs : 16;
  zt__mem_rec *r = realloc(m->recs, cap * sizeof *r);
  if (!r) return -ENOMEM;
  m->recs = r;
  m->cap_recs = cap;
  return 0;
}

void *zt__mem_alloc(zt__mem *m, size_t bytes) {
  void *p = NULL;
  pthread_mutex_lock(&m->mu);
  if (grow_recs(m) < 0) goto out;
  int bi = m->open;
  if (bi >= 0) {
    zt__mem_block *b = &m->blocks[bi];
    size_t slot = slot_bytes(bytes);
    if (slot > b->size - b->used) {
      ZT_LOGE("kernels", "an allocation of %zu bytes does not fit the reserved block: %zu of "
              "its %zu bytes left", bytes, b->size - b->used, b->size);
      goto out;
    }
    if (m->raw.carve) {
      p = (char *)b->base + b->used;
    } else {
      if (!(p = m->raw.alloc(m->raw.ctx, bytes))) goto out;
      m->st.system_allocs++;
    }
    b->used += slot;
    b->live++;
  } else {
    if (!(p = m->raw.alloc(m->raw.ctx, bytes))) goto out;
    m->st.system_allocs++;
  }
  m->recs[m->n_recs++] = (zt__mem_rec){p, bytes, bi};
  m->st.allocated += bytes;
  if (m->st.allocated > m->st.peak) m->st.peak = m->st.allocated;
  m->st.allocations++;
  m->st.allocations_total++;
out:
  pthread_mutex_unlock(&m->mu);
  return p;
}

void zt__mem_free(zt__mem *m, void *p) {
  if (!p) return;
  pthread_mutex_lock(&m->mu);
  size_t i = m->n_recs;
  while (i > 0 && m->recs[i - 1].p != p) i--;
  if (i == 0) {
    /* not ours: freed as before the accounting, so that a sanitizer still reports it */
    ZT_LOGE("kernels", "free of %p, which this backend did not allocate", p);
    pthread_mutex_unlock(&m->mu);
    m->raw.free(m->raw.ctx, p);
    return;
  }
  zt__mem_rec r = m->recs[i - 1];
  m->recs[i - 1] = m->recs[--m->n_recs];
  m->st.allocated -= r.bytes;
  m->st.allocations--;
  if (r.block < 0 || !m->raw.carve) m->raw.free(m->raw.ctx, p);
  if (r.block >= 0 && --m->blocks[r.block].live == 0 && r.block != m->open)
    release_block(m, r.block);
  pthread_mutex_unlock(&m->mu);
}

int zt__mem_reserve(zt__mem *m, size_t bytes) {
  int rc = 0;
  size_t size = slot_bytes(bytes);
  const size_t room = (size_t)ZT_BACKEND_RESERVE_ALLOCS * ZT__MEM_ALIGN;
  if (size > SIZE_MAX - room) return -ENOMEM;
  size += room;
  pthread_mutex_lock(&m->mu);
  if (m->open >= 0) {
    rc = -EBUSY;
    goto out;
  }
  int i = 0;
  while (i < m->n_blocks && m->blocks[i].size) i++;
  if (i == m->n_blocks) {
    zt__mem_block *b = realloc(m->blocks, (size_t)(m->n_blocks + 1) * sizeof *b);
    if (!b) {
      rc = -ENOMEM;
      goto out;
    }
    m->blocks = b;
    m->blocks[m->n_blocks++] = (zt__mem_block){0};
  }
  void *base = NULL;
  if (m->raw.carve) {
    if (!(base = m->raw.alloc(m->raw.ctx, size))) {
      rc = -ENOMEM;
      goto out;
    }
    m->st.system_allocs++;
  }
  m->blocks[i] = (zt__mem_block){.base = base, .size = size};
  m->open = i;
  m->st.reserved += size;
out:
  pthread_mutex_unlock(&m->mu);
  return rc;
}

void zt__mem_reserve_end(zt__mem *m) {
  pthread_mutex_lock(&m->mu);
  int i = m->open;
  m->open = -1;
  if (i >= 0 && m->blocks[i].live == 0) release_block(m, i);
  pthread_mutex_unlock(&m->mu);
}

void zt__mem_stats(zt__mem *m, zt_backend_mem *out) {
  pthread_mutex_lock(&m->mu);
  *out = m->st;
  pthread_mutex_unlock(&m->mu);
}
