/*
 * Key compaction's record work, compiled: the log cleaner's key map and its retention filter over the records
 * section of a magic v2 batch, with no Python object per record.
 *
 *   KeyMap(slots, capacity, huge_pages=False)
 *                             Kafka's SkimpyOffsetMap: `slots` slots of 24 bytes (a key's MD5, then the offset
 *                             it was last seen at) probed as the broker probes them; full at `capacity` keys
 *                             (the broker: slots x log.cleaner.io.buffer.load.factor). A capacity of -1 makes
 *                             a map that grows instead (no bound on a pass). Two keys with the same MD5 are one
 *                             key here, as they are to the broker. `huge_pages`: the table is
 *                             expected to be mostly touched (see table_alloc).
 *   map.map_v2(section, base_offset, last_offset_delta, expected_count, start)
 *       -> (keys put, offset of the last put, full) or None: every record with a key at or past `start` put
 *          in order, stopping (full) at the first one that finds the map full (buildOffsetMapForSegment).
 *          The whole section is checked before anything is put, so None leaves the map as it was.
 *   map.filter_v2(section, base_offset, timestamp, log_append, last_offset_delta, expected_count,
 *                 latest_offset, drop_tombstones, has_horizon, horizon)
 *       -> (kept, superseded, without a key, tombstones dropped, tombstones kept, section or None, base
 *          timestamp, max timestamp) or None: the cleaner's shouldRetainRecord for a data batch. A record past
 *          `latest_offset` stays; else one without a key goes, one older than its key's latest goes, and a
 *          tombstone goes with `drop_tombstones` (its batch's delete horizon has passed). The kept records are
 *          re-encoded as builder.build_batch writes them against the batch's base offset and a base timestamp:
 *          `horizon` when the batch has one (`has_horizon`) or gets one (it keeps a tombstone and has none;
 *          `horizon` is then the one to stamp), else the first kept record's. The section is None when every
 *          record stays and no horizon is stamped: the batch is then copied byte for byte.
 *   map.get(key, default=-1), map.put(key, offset), len(map), map.full
 *       the same map record by record, for the Python reference's use of it.
 *
 * Records are read with the checks of _records.h; a section either function does not vouch for (including
 * a count other than `expected_count`, or an offset or timestamp delta out of range) answers None, and the
 * caller takes the Python reference, which names the problem or defines the outcome. A map serves one
 * caller at a time.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_records.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

/* ---- MD5 (RFC 1321) ------------------------------------------------------------------------------------- */

static const uint32_t MD5_K[64] = {
    0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
    0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
    0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
    0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
    0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
    0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
    0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
    0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391,
};

static inline uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#define ROTL(x, s) (((x) << (s)) | ((x) >> (32 - (s))))
#define MD5_F(b, c, d) (((b) & (c)) | (~(b) & (d)))
#define MD5_G(b, c, d) (((d) & (b)) | (~(d) & (c)))
#define MD5_H(b, c, d) ((b) ^ (c) ^ (d))
#define MD5_I(b, c, d) ((c) ^ ((b) | ~(d)))
#define LANES 4
#define SHORT_KEY 55 /* the longest key whose padded message is one block */

/* The 64 steps of RFC 1321 (four rounds of 16) over `lanes` blocks side by side: lane l's message words are
 * m[.][l], its state a[l]..d[l] (updated). The steps of one hash depend on each other, those of different lanes
 * do not, so lanes run in parallel (with a constant `lanes` the compiler makes vector code of the lane loops). */
/* Always inlined: each caller's constant `lanes` then unrolls and vectorizes (twice the speed measured). */
static inline __attribute__((always_inline)) void md5_rounds(int lanes, uint32_t m[16][LANES], uint32_t *a,
                                                             uint32_t *b, uint32_t *c, uint32_t *d) {
    uint32_t a0[LANES], b0[LANES], c0[LANES], d0[LANES];
    for (int l = 0; l < lanes; l++) {
        a0[l] = a[l];
        b0[l] = b[l];
        c0[l] = c[l];
        d0[l] = d[l];
    }
#define LANE_STEP(f, w, x, y, z, i, g, s)                                                  \
    for (int l = 0; l < lanes; l++) {                                                     \
        w[l] += f(x[l], y[l], z[l]) + MD5_K[i] + m[g][l];                                 \
        w[l] = x[l] + ROTL(w[l], s);                                                      \
    }
    for (int i = 0; i < 16; i += 4) {
        LANE_STEP(MD5_F, a, b, c, d, i, i, 7);
        LANE_STEP(MD5_F, d, a, b, c, i + 1, i + 1, 12);
        LANE_STEP(MD5_F, c, d, a, b, i + 2, i + 2, 17);
        LANE_STEP(MD5_F, b, c, d, a, i + 3, i + 3, 22);
    }
    for (int i = 16; i < 32; i += 4) {
        LANE_STEP(MD5_G, a, b, c, d, i, (5 * i + 1) % 16, 5);
        LANE_STEP(MD5_G, d, a, b, c, i + 1, (5 * i + 6) % 16, 9);
        LANE_STEP(MD5_G, c, d, a, b, i + 2, (5 * i + 11) % 16, 14);
        LANE_STEP(MD5_G, b, c, d, a, i + 3, (5 * i + 16) % 16, 20);
    }
    for (int i = 32; i < 48; i += 4) {
        LANE_STEP(MD5_H, a, b, c, d, i, (3 * i + 5) % 16, 4);
        LANE_STEP(MD5_H, d, a, b, c, i + 1, (3 * i + 8) % 16, 11);
        LANE_STEP(MD5_H, c, d, a, b, i + 2, (3 * i + 11) % 16, 16);
        LANE_STEP(MD5_H, b, c, d, a, i + 3, (3 * i + 14) % 16, 23);
    }
    for (int i = 48; i < 64; i += 4) {
        LANE_STEP(MD5_I, a, b, c, d, i, (7 * i) % 16, 6);
        LANE_STEP(MD5_I, d, a, b, c, i + 1, (7 * i + 7) % 16, 10);
        LANE_STEP(MD5_I, c, d, a, b, i + 2, (7 * i + 14) % 16, 15);
        LANE_STEP(MD5_I, b, c, d, a, i + 3, (7 * i + 21) % 16, 21);
    }
#undef LANE_STEP
    for (int l = 0; l < lanes; l++) {
        a[l] += a0[l];
        b[l] += b0[l];
        c[l] += c0[l];
        d[l] += d0[l];
    }
}

static const uint32_t MD5_INIT[4] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476};

static void put_digest(uint32_t a, uint32_t b, uint32_t c, uint32_t d, uint8_t out[16]) {
    const uint32_t h[4] = {a, b, c, d};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) out[4 * i + j] = (uint8_t)(h[i] >> (8 * j));
}

/* One 64-byte block into the state h. */
static void md5_block(uint32_t h[4], const uint8_t *p) {
    uint32_t m[16][LANES];
    for (int i = 0; i < 16; i++) m[i][0] = le32(p + 4 * i);
    md5_rounds(1, m, &h[0], &h[1], &h[2], &h[3]);
}

static void md5(const uint8_t *data, size_t len, uint8_t out[16]) {
    uint32_t h[4] = {MD5_INIT[0], MD5_INIT[1], MD5_INIT[2], MD5_INIT[3]};
    size_t full = len / 64 * 64;
    for (size_t i = 0; i < full; i += 64) md5_block(h, data + i);
    uint8_t tail[128] = {0};
    size_t rest = len - full, padded = rest < 56 ? 64 : 128;
    if (rest) memcpy(tail, data + full, rest);
    tail[rest] = 0x80;
    uint64_t bits = (uint64_t)len * 8;
    for (int i = 0; i < 8; i++) tail[padded - 8 + i] = (uint8_t)(bits >> (8 * i));
    md5_block(h, tail);
    if (padded == 128) md5_block(h, tail + 64);
    put_digest(h[0], h[1], h[2], h[3], out);
}

/* The MD5s of LANES keys of at most SHORT_KEY bytes, side by side (md5_rounds); each out[l] as md5() gives it. */
static void md5_short_lanes(const uint8_t *const keys[LANES], const size_t lens[LANES], uint8_t *const out[LANES]) {
    uint32_t m[16][LANES], a[LANES], b[LANES], c[LANES], d[LANES];
    for (int l = 0; l < LANES; l++) {
        uint8_t block[64] = {0};
        memcpy(block, keys[l], lens[l]);
        block[lens[l]] = 0x80;
        uint64_t bits = (uint64_t)lens[l] * 8;
        for (int i = 0; i < 8; i++) block[56 + i] = (uint8_t)(bits >> (8 * i));
        for (int i = 0; i < 16; i++) m[i][l] = le32(block + 4 * i);
        a[l] = MD5_INIT[0];
        b[l] = MD5_INIT[1];
        c[l] = MD5_INIT[2];
        d[l] = MD5_INIT[3];
    }
    md5_rounds(LANES, m, a, b, c, d);
    for (int l = 0; l < LANES; l++) put_digest(a[l], b[l], c[l], d[l], out[l]);
}

/* ---- the map -------------------------------------------------------------------------------------------- */

#define HASH 16
#define SLOT 24
#define GROWING_FIRST_SLOTS 65536
/* The broker's dedupe buffer is at most 2 GiB a thread: slots of 24 bytes in an int-sized buffer. */
#define SLOTS_MAX (INT32_MAX / SLOT)
/* A growing map is not the broker's: it may pass that size, up to the slots a probe can reach (an int's). */
#define GROWING_SLOTS_MAX ((int64_t)1 << 31)

/* The table: zeroed memory from the system, its pages taken as keys land in them. With `huge` (a map expected
 * to touch most of its pages anyway) on Linux, its own mapping asking for huge pages: a probe lands anywhere
 * in a table of up to 2 GiB, and with 4 KiB pages nearly every one also misses the TLB. */
typedef struct {
    uint8_t *at;
    void *mapping;
    size_t mapped;
} table_mem;

static int table_alloc(table_mem *t, size_t bytes, int want_huge) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (!want_huge) {
        t->at = calloc(bytes, 1);
        t->mapping = NULL;
        t->mapped = 0;
        return t->at == NULL ? -1 : 0;
    }
    const size_t huge = (size_t)2 << 20;
    size_t mapped = bytes + huge;
    void *p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return -1;
    uintptr_t aligned = ((uintptr_t)p + huge - 1) & ~(uintptr_t)(huge - 1);
    madvise((void *)aligned, bytes, MADV_HUGEPAGE);
    t->at = (uint8_t *)aligned;
    t->mapping = p;
    t->mapped = mapped;
    return 0;
#else
    (void)want_huge;
    t->at = calloc(bytes, 1);
    t->mapping = NULL;
    t->mapped = 0;
    return t->at == NULL ? -1 : 0;
#endif
}

static void table_free(table_mem *t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (t->mapping != NULL) munmap(t->mapping, t->mapped);
    else free(t->at);
#else
    free(t->at);
#endif
    t->at = NULL;
    t->mapping = NULL;
}

typedef struct {
    PyObject_HEAD
    table_mem mem;
    uint8_t *table;
    int64_t slots;
    int64_t capacity; /* keys before the map is full; -1: it grows */
    int64_t size;
    int huge;
} KeyMap;

static inline int is_empty(const uint8_t *slot) {
    static const uint8_t zero[SLOT] = {0};
    return memcmp(slot, zero, SLOT) == 0;
}

/* SkimpyOffsetMap.positionOf: an int read from the hash (big-endian, at min(attempt, 12)) plus how far the
 * attempt is past 12, its absolute value (Utils.abs: 0 for Integer.MIN_VALUE) modulo the slots. */
static inline uint8_t *slot_of(const KeyMap *m, const uint8_t *hash, int64_t attempt) {
    int64_t at = attempt < HASH - 4 ? attempt : HASH - 4;
    uint32_t word = (uint32_t)hash[at] << 24 | (uint32_t)hash[at + 1] << 16 | (uint32_t)hash[at + 2] << 8 |
                    (uint32_t)hash[at + 3];
    int32_t probe = (int32_t)(word + (uint32_t)(attempt > HASH - 4 ? attempt - (HASH - 4) : 0));
    int64_t positive = probe == INT32_MIN ? 0 : (probe < 0 ? -(int64_t)probe : probe);
    return m->table + (positive % m->slots) * SLOT;
}

static inline void set_offset(uint8_t *slot, int64_t offset) { memcpy(slot + HASH, &offset, sizeof offset); }

static inline int64_t offset_at(const uint8_t *slot) {
    int64_t offset;
    memcpy(&offset, slot + HASH, sizeof offset);
    return offset;
}

/* SkimpyOffsetMap.get: the offset stored for the hash, or -1. */
static int64_t map_get(const KeyMap *m, const uint8_t *hash) {
    int64_t max_attempts = m->slots + HASH - 4;
    for (int64_t attempt = 0; attempt < max_attempts; attempt++) {
        const uint8_t *slot = slot_of(m, hash, attempt);
        if (is_empty(slot)) return -1;
        if (memcmp(slot, hash, HASH) == 0) return offset_at(slot);
    }
    return -1;
}

/* SkimpyOffsetMap.put into a map with a free slot. */
static void map_store(KeyMap *m, const uint8_t *hash, int64_t offset) {
    for (int64_t attempt = 0;; attempt++) {
        uint8_t *slot = slot_of(m, hash, attempt);
        if (is_empty(slot)) {
            memcpy(slot, hash, HASH);
            set_offset(slot, offset);
            m->size++;
            return;
        }
        if (memcmp(slot, hash, HASH) == 0) {
            set_offset(slot, offset);
            return;
        }
    }
}

/* A growing map doubled once it holds half its slots (at the broker's 0.9, an insert probes ten slots on
 * average, each a likely cache miss; a bounded map keeps the broker's load factor): 0, or -1 when it may not
 * grow further. */
static int make_room(KeyMap *m) {
    if (m->capacity >= 0 || m->size < m->slots / 2) return 0;
    if (m->slots * 2 > GROWING_SLOTS_MAX) return -1;
    KeyMap bigger = *m;
    bigger.slots = m->slots * 2;
    bigger.size = 0;
    if (table_alloc(&bigger.mem, (size_t)bigger.slots * SLOT, m->huge) != 0) return -1;
    bigger.table = bigger.mem.at;
    for (int64_t i = 0; i < m->slots; i++) {
        const uint8_t *slot = m->table + i * SLOT;
        if (!is_empty(slot)) map_store(&bigger, slot, offset_at(slot));
    }
    table_free(&m->mem);
    m->mem = bigger.mem;
    m->table = bigger.table;
    m->slots = bigger.slots;
    return 0;
}

static inline int map_full(const KeyMap *m) { return m->capacity >= 0 && m->size >= m->capacity; }

/* ---- a section's records, read once -------------------------------------------------------------------- */

typedef struct {
    record r;
    const uint8_t *end; /* where the record ends (its headers run up to here) */
    int64_t offset;
    uint8_t hash[HASH];
    uint8_t hashed, keep;
} entry;

/* The keys of the entries marked `hashed` hashed, LANES short ones at a time, and each one's first slot
 * prefetched, so that the table's cache misses overlap. */
static void hash_entries(const KeyMap *m, entry *all, size_t n) {
    entry *lane[LANES];
    const uint8_t *keys[LANES];
    size_t lens[LANES], waiting = 0;
    uint8_t *outs[LANES];
    for (size_t i = 0; i <= n; i++) {
        entry *e = i < n ? &all[i] : NULL;
        if (e != NULL && !e->hashed) continue;
        if (e != NULL && e->r.key_len > SHORT_KEY) {
            md5(e->r.key, (size_t)e->r.key_len, e->hash);
            __builtin_prefetch(slot_of(m, e->hash, 0));
            continue;
        }
        if (e != NULL) lane[waiting++] = e;
        if (waiting == LANES || (e == NULL && waiting > 0)) {
            for (size_t l = 0; l < LANES; l++) {
                entry *x = lane[l < waiting ? l : 0]; /* a short group repeats its first key */
                keys[l] = x->r.key;
                lens[l] = (size_t)x->r.key_len;
                outs[l] = x->hash;
            }
            md5_short_lanes(keys, lens, outs);
            for (size_t l = 0; l < waiting; l++) __builtin_prefetch(slot_of(m, lane[l]->hash, 0));
            waiting = 0;
        }
    }
}

/* Every record of a section, checked (_records.h) and counted against `expected_count`, into *out (freed by
 * the caller), the keys of those with an offset in [hash_from, hash_to] hashed (hash_entries). 0, -1 (not
 * vouched for) or -2 (no memory). */
static int read_entries(const KeyMap *m, const uint8_t *buf, Py_ssize_t len, int64_t base_offset,
                        int64_t last_offset_delta, int64_t expected_count, int64_t hash_from, int64_t hash_to,
                        out_buf *out, size_t *n) {
    cursor c = {buf, buf + len};
    int64_t prev = -1;
    *n = 0;
    while (c.p < c.end) {
        if (reserve(out, sizeof(entry)) != 0) return -2;
        entry *e = (entry *)out->buf + *n;
        if (read_record(&c, prev, last_offset_delta, &e->r) != 0 ||
            __builtin_add_overflow(base_offset, e->r.offset_delta, &e->offset))
            return -1;
        prev = e->r.offset_delta;
        e->end = c.p;
        e->keep = 0;
        e->hashed = e->r.key != NULL && e->offset >= hash_from && e->offset <= hash_to;
        out->len += sizeof(entry);
        ++*n;
    }
    if ((int64_t)*n != expected_count) return -1;
    hash_entries(m, (entry *)out->buf, *n);
    return 0;
}

/* ---- map_v2 --------------------------------------------------------------------------------------------- */

/* 0 with *puts, *last, *full set; -1 (not vouched for, nothing put); -2 (no memory, or the map cannot grow). */
static int map_walk(KeyMap *m, const uint8_t *buf, Py_ssize_t len, int64_t base_offset, int64_t last_offset_delta,
                    int64_t expected_count, int64_t start, int64_t *puts, int64_t *last, int *full) {
    out_buf entries = {NULL, 0, 0};
    size_t n;
    int rc = read_entries(m, buf, len, base_offset, last_offset_delta, expected_count, start, INT64_MAX, &entries,
                          &n);
    *puts = 0;
    *full = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const entry *e = (const entry *)entries.buf + i;
        if (!e->hashed) continue;
        if (map_full(m)) {
            *full = 1;
            break;
        }
        if (make_room(m) != 0) {
            rc = -2;
            break;
        }
        map_store(m, e->hash, e->offset);
        *last = e->offset;
        ++*puts;
    }
    free(entries.buf);
    return rc;
}

#define RELEASE_GIL_FROM (64 << 10) /* input bytes: below this the walk takes less than a GIL hand-over */

static PyObject *no_room(const KeyMap *m) {
    return PyErr_Format(PyExc_MemoryError, "the key map could not grow (it holds %lld slots; at most %lld)",
                        (long long)m->slots, (long long)GROWING_SLOTS_MAX);
}

/* 0, or -1 with an exception for a map whose __init__ did not run (no table yet). */
static int ready(const KeyMap *m) {
    if (m->table != NULL) return 0;
    PyErr_SetString(PyExc_ValueError, "the key map has no table: KeyMap(slots, capacity) was not called");
    return -1;
}

static PyObject *KeyMap_map_v2(KeyMap *self, PyObject *args) {
    if (ready(self) != 0) return NULL;
    Py_buffer view;
    long long base_offset, last_offset_delta, expected_count, start;
    if (!PyArg_ParseTuple(args, "y*LLLL", &view, &base_offset, &last_offset_delta, &expected_count, &start))
        return NULL;
    int64_t puts = 0, last = -1;
    int full = 0, rc;
    if (view.len < RELEASE_GIL_FROM) {
        rc = map_walk(self, view.buf, view.len, base_offset, last_offset_delta, expected_count, start, &puts, &last,
                      &full);
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = map_walk(self, view.buf, view.len, base_offset, last_offset_delta, expected_count, start, &puts, &last,
                      &full);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    if (rc == -2) return no_room(self);
    if (rc != 0) Py_RETURN_NONE;
    return Py_BuildValue("(LLO)", (long long)puts, (long long)last, full ? Py_True : Py_False);
}

/* ---- filter_v2 ------------------------------------------------------------------------------------------ */

typedef struct {
    int64_t base_offset, timestamp, last_offset_delta, expected_count, latest_offset, horizon;
    int log_append, drop_tombstones, has_horizon;
} batch_facts;

typedef struct {
    int64_t kept, superseded, no_key, tombstones_dropped, tombstones_kept, base_ts, max_ts;
    int copied; /* every record kept and no horizon stamped: no section */
} filtered;

/* Whether the cleaner keeps the record, its reason counted in f when it does not. */
static int keeps(const KeyMap *m, const batch_facts *b, const entry *e, filtered *f) {
    if (e->offset > b->latest_offset) return 1;
    if (e->r.key == NULL) {
        f->no_key++;
        return 0;
    }
    if (e->offset < map_get(m, e->hash)) {
        f->superseded++;
        return 0;
    }
    if (e->r.value == NULL && b->drop_tombstones) {
        f->tombstones_dropped++;
        return 0;
    }
    return 1;
}

/* The kept records into o (unless copied), f set: 0, -1 (not vouched for) or -2 (no memory). */
static int filter_walk(const KeyMap *m, const uint8_t *buf, Py_ssize_t len, const batch_facts *b, out_buf *o,
                       filtered *f) {
    out_buf entries = {NULL, 0, 0};
    size_t n;
    int rc = read_entries(m, buf, len, b->base_offset, b->last_offset_delta, b->expected_count, INT64_MIN,
                          b->latest_offset, &entries, &n);
    if (rc != 0) {
        free(entries.buf);
        return rc;
    }
    entry *all = (entry *)entries.buf;
    int64_t first_ts = 0;
    for (size_t i = 0; i < n; i++) {
        entry *e = &all[i];
        e->keep = (uint8_t)keeps(m, b, e, f);
        if (!e->keep) continue;
        int64_t ts = b->log_append ? b->timestamp : wrapping_add(b->timestamp, e->r.timestamp_delta);
        if (f->kept == 0 || ts > f->max_ts) f->max_ts = ts;
        if (f->kept == 0) first_ts = ts;
        f->kept++;
        f->tombstones_kept += e->r.value == NULL;
    }
    int stamp = !b->has_horizon && f->tombstones_kept > 0;
    f->copied = f->kept == (int64_t)n && !stamp;
    f->base_ts = b->has_horizon || stamp ? b->horizon : first_ts;
    if (f->kept == 0) f->max_ts = -1;
    for (size_t i = 0; rc == 0 && !f->copied && i < n; i++) {
        const entry *e = &all[i];
        if (!e->keep) continue;
        int64_t ts = b->log_append ? b->timestamp : wrapping_add(b->timestamp, e->r.timestamp_delta), ts_delta;
        if (__builtin_sub_overflow(ts, f->base_ts, &ts_delta)) rc = -1;
        else if (put_record(o, &e->r, e->end, ts_delta, e->r.offset_delta) != 0) rc = -2;
    }
    free(entries.buf);
    return rc;
}

static PyObject *KeyMap_filter_v2(KeyMap *self, PyObject *args) {
    if (ready(self) != 0) return NULL;
    Py_buffer view;
    batch_facts b;
    long long base_offset, timestamp, last_offset_delta, expected_count, latest_offset, horizon;
    if (!PyArg_ParseTuple(args, "y*LLpLLLppL", &view, &base_offset, &timestamp, &b.log_append, &last_offset_delta,
                          &expected_count, &latest_offset, &b.drop_tombstones, &b.has_horizon, &horizon))
        return NULL;
    b.base_offset = base_offset;
    b.timestamp = timestamp;
    b.last_offset_delta = last_offset_delta;
    b.expected_count = expected_count;
    b.latest_offset = latest_offset;
    b.horizon = horizon;
    out_buf o = {NULL, 0, 0};
    filtered f = {0};
    int rc;
    if (view.len < RELEASE_GIL_FROM) {
        rc = filter_walk(self, view.buf, view.len, &b, &o, &f);
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = filter_walk(self, view.buf, view.len, &b, &o, &f);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    PyObject *result = NULL;
    if (rc == 0) {
        PyObject *section = f.copied ? Py_NewRef(Py_None)
                                     : PyBytes_FromStringAndSize(o.buf ? (const char *)o.buf : "", (Py_ssize_t)o.len);
        if (section != NULL)
            result = Py_BuildValue("(LLLLLNLL)", (long long)f.kept, (long long)f.superseded, (long long)f.no_key,
                                   (long long)f.tombstones_dropped, (long long)f.tombstones_kept, section,
                                   (long long)f.base_ts, (long long)f.max_ts);
    } else if (rc == -2) {
        PyErr_NoMemory();
    } else {
        result = Py_NewRef(Py_None);
    }
    free(o.buf);
    return result;
}

/* ---- record by record, and the type ---------------------------------------------------------------------- */

static int hash_of(PyObject *key, uint8_t hash[HASH]) {
    Py_buffer view;
    if (PyObject_GetBuffer(key, &view, PyBUF_SIMPLE) != 0) return -1;
    md5(view.buf, (size_t)view.len, hash);
    PyBuffer_Release(&view);
    return 0;
}

static PyObject *KeyMap_get(KeyMap *self, PyObject *args) {
    if (ready(self) != 0) return NULL;
    PyObject *key, *fallback = NULL;
    if (!PyArg_ParseTuple(args, "O|O", &key, &fallback)) return NULL;
    uint8_t hash[HASH];
    if (hash_of(key, hash) != 0) return NULL;
    int64_t offset = map_get(self, hash);
    if (offset < 0 && fallback != NULL) return Py_NewRef(fallback);
    return PyLong_FromLongLong(offset);
}

static PyObject *KeyMap_put(KeyMap *self, PyObject *args) {
    if (ready(self) != 0) return NULL;
    PyObject *key;
    long long offset;
    if (!PyArg_ParseTuple(args, "OL", &key, &offset)) return NULL;
    uint8_t hash[HASH];
    if (hash_of(key, hash) != 0) return NULL;
    if (map_full(self)) {
        PyErr_SetString(PyExc_OverflowError, "the key map is full");
        return NULL;
    }
    if (make_room(self) != 0) return no_room(self);
    map_store(self, hash, offset);
    Py_RETURN_NONE;
}

static PyObject *KeyMap_full(KeyMap *self, void *unused) { return PyBool_FromLong(map_full(self)); }

static Py_ssize_t KeyMap_len(KeyMap *self) { return (Py_ssize_t)self->size; }

static int KeyMap_init(KeyMap *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"slots", "capacity", "huge_pages", NULL};
    long long slots, capacity;
    int huge = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LL|p", names, &slots, &capacity, &huge)) return -1;
    if (capacity < 0) slots = slots > GROWING_FIRST_SLOTS ? slots : GROWING_FIRST_SLOTS;
    if (slots < 1 || slots > SLOTS_MAX || capacity < -1 || capacity >= slots) {
        PyErr_Format(PyExc_ValueError, "a key map of 1 to %lld slots holding fewer keys than slots (or -1: grows)",
                     (long long)SLOTS_MAX);
        return -1;
    }
    table_mem mem;
    if (table_alloc(&mem, (size_t)slots * SLOT, huge) != 0) {
        PyErr_NoMemory();
        return -1;
    }
    table_free(&self->mem);
    self->mem = mem;
    self->table = mem.at;
    self->slots = slots;
    self->capacity = capacity;
    self->size = 0;
    self->huge = huge;
    return 0;
}

static void KeyMap_dealloc(KeyMap *self) {
    table_free(&self->mem);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *KeyMap_slots(KeyMap *self, void *unused) { return PyLong_FromLongLong(self->slots); }

static PyMethodDef KeyMap_methods[] = {
    {"map_v2", (PyCFunction)KeyMap_map_v2, METH_VARARGS,
     "map_v2(section, base_offset, last_offset_delta, expected_count, start) -> (puts, last, full) | None"},
    {"filter_v2", (PyCFunction)KeyMap_filter_v2, METH_VARARGS,
     "filter_v2(section, base_offset, timestamp, log_append, last_offset_delta, expected_count, latest_offset,\n"
     "          drop_tombstones, has_horizon, horizon)\n"
     "-> (kept, superseded, no_key, tombstones_dropped, tombstones_kept, section | None, base_ts, max_ts) | None"},
    {"get", (PyCFunction)KeyMap_get, METH_VARARGS, "get(key, default=-1) -> the key's offset, or default"},
    {"put", (PyCFunction)KeyMap_put, METH_VARARGS, "put(key, offset): OverflowError when the map is full"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef KeyMap_getset[] = {
    {"full", (getter)KeyMap_full, NULL, "whether the map holds its capacity of keys", NULL},
    {"slots", (getter)KeyMap_slots, NULL, "the slots of the table now", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods KeyMap_sequence = {.sq_length = (lenfunc)KeyMap_len};

static PyTypeObject KeyMapType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tiering.kafka._keymap.KeyMap",
    .tp_basicsize = sizeof(KeyMap),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "KeyMap(slots, capacity, huge_pages=False): the log cleaner's offset map (see _keymap.c)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)KeyMap_init,
    .tp_dealloc = (destructor)KeyMap_dealloc,
    .tp_methods = KeyMap_methods,
    .tp_getset = KeyMap_getset,
    .tp_as_sequence = &KeyMap_sequence,
};

static PyObject *md5_of(PyObject *Py_UNUSED(self), PyObject *arg) {
    uint8_t hash[HASH];
    if (hash_of(arg, hash) != 0) return NULL;
    return PyBytes_FromStringAndSize((const char *)hash, HASH);
}

static PyMethodDef methods[] = {
    {"md5", md5_of, METH_O, "md5(data) -> the 16-byte MD5 the map keys by (for tests against hashlib)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_keymap", NULL, -1, methods};

PyMODINIT_FUNC PyInit__keymap(void) {
    if (PyType_Ready(&KeyMapType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "KeyMap", (PyObject *)&KeyMapType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
