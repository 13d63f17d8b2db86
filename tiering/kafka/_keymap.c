/*
 * Key compaction's record work, compiled: the log cleaner's key map and its retention filter over the records
 * section of a magic v2 batch, with no Python object per record.
 *
 *   KeyMap(slots, capacity)   Kafka's SkimpyOffsetMap: `slots` slots of 24 bytes (a key's MD5, then the offset
 *                             it was last seen at) probed as the broker probes them; full at `capacity` keys
 *                             (the broker: slots x log.cleaner.io.buffer.load.factor). A capacity of -1 makes
 *                             a map that grows instead (no bound on a pass). Two keys with the same MD5 are one
 *                             key here, as they are to the broker.
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
#define MD5_STEP(f, a, b, c, d, i, g, s)               \
    do {                                               \
        (a) += f((b), (c), (d)) + MD5_K[i] + m[g];     \
        (a) = (b) + ROTL((a), (s));                    \
    } while (0)

/* One 64-byte block, the 64 steps of RFC 1321 written out (four rounds of 16). */
static void md5_block(uint32_t h[4], const uint8_t *p) {
    uint32_t m[16], a = h[0], b = h[1], c = h[2], d = h[3];
    for (int i = 0; i < 16; i++) m[i] = le32(p + 4 * i);
    for (int i = 0; i < 16; i += 4) {
        MD5_STEP(MD5_F, a, b, c, d, i, i, 7);
        MD5_STEP(MD5_F, d, a, b, c, i + 1, i + 1, 12);
        MD5_STEP(MD5_F, c, d, a, b, i + 2, i + 2, 17);
        MD5_STEP(MD5_F, b, c, d, a, i + 3, i + 3, 22);
    }
    for (int i = 16; i < 32; i += 4) {
        MD5_STEP(MD5_G, a, b, c, d, i, (5 * i + 1) % 16, 5);
        MD5_STEP(MD5_G, d, a, b, c, i + 1, (5 * i + 6) % 16, 9);
        MD5_STEP(MD5_G, c, d, a, b, i + 2, (5 * i + 11) % 16, 14);
        MD5_STEP(MD5_G, b, c, d, a, i + 3, (5 * i + 16) % 16, 20);
    }
    for (int i = 32; i < 48; i += 4) {
        MD5_STEP(MD5_H, a, b, c, d, i, (3 * i + 5) % 16, 4);
        MD5_STEP(MD5_H, d, a, b, c, i + 1, (3 * i + 8) % 16, 11);
        MD5_STEP(MD5_H, c, d, a, b, i + 2, (3 * i + 11) % 16, 16);
        MD5_STEP(MD5_H, b, c, d, a, i + 3, (3 * i + 14) % 16, 23);
    }
    for (int i = 48; i < 64; i += 4) {
        MD5_STEP(MD5_I, a, b, c, d, i, (7 * i) % 16, 6);
        MD5_STEP(MD5_I, d, a, b, c, i + 1, (7 * i + 7) % 16, 10);
        MD5_STEP(MD5_I, c, d, a, b, i + 2, (7 * i + 14) % 16, 15);
        MD5_STEP(MD5_I, b, c, d, a, i + 3, (7 * i + 21) % 16, 21);
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
}

static void md5(const uint8_t *data, size_t len, uint8_t out[16]) {
    uint32_t h[4] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476};
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
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) out[4 * i + j] = (uint8_t)(h[i] >> (8 * j));
}

/* ---- the map -------------------------------------------------------------------------------------------- */

#define HASH 16
#define SLOT 24
#define GROWING_FIRST_SLOTS 65536
/* The broker's dedupe buffer is at most 2 GiB a thread: slots of 24 bytes in an int-sized buffer. */
#define SLOTS_MAX (INT32_MAX / SLOT)

typedef struct {
    PyObject_HEAD
    uint8_t *table;
    int64_t slots;
    int64_t capacity; /* keys before the map is full; -1: it grows */
    int64_t size;
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
    if (m->slots * 2 > SLOTS_MAX) return -1;
    KeyMap bigger = *m;
    bigger.slots = m->slots * 2;
    bigger.size = 0;
    bigger.table = calloc((size_t)bigger.slots, SLOT);
    if (bigger.table == NULL) return -1;
    for (int64_t i = 0; i < m->slots; i++) {
        const uint8_t *slot = m->table + i * SLOT;
        if (!is_empty(slot)) map_store(&bigger, slot, offset_at(slot));
    }
    free(m->table);
    m->table = bigger.table;
    m->slots = bigger.slots;
    return 0;
}

static inline int map_full(const KeyMap *m) { return m->capacity >= 0 && m->size >= m->capacity; }

/* ---- map_v2 --------------------------------------------------------------------------------------------- */

/* 0 with *puts, *last, *full set; -1 (not vouched for, nothing put); -2 (the map cannot grow). */
static int map_walk(KeyMap *m, const uint8_t *buf, Py_ssize_t len, int64_t base_offset, int64_t last_offset_delta,
                    int64_t expected_count, int64_t start, int64_t *puts, int64_t *last, int *full) {
    cursor c = {buf, buf + len};
    int64_t count = 0, prev = -1, offset;
    record r;
    while (c.p < c.end) {
        if (read_record(&c, prev, last_offset_delta, &r) != 0) return -1;
        if (__builtin_add_overflow(base_offset, r.offset_delta, &offset)) return -1;
        prev = r.offset_delta;
        count++;
    }
    if (count != expected_count) return -1;
    c.p = buf;
    prev = -1;
    *puts = 0;
    *full = 0;
    while (c.p < c.end) {
        read_record(&c, prev, last_offset_delta, &r);
        prev = r.offset_delta;
        offset = base_offset + r.offset_delta;
        if (r.key == NULL || offset < start) continue;
        if (map_full(m)) {
            *full = 1;
            return 0;
        }
        if (make_room(m) != 0) return -2;
        uint8_t hash[HASH];
        md5(r.key, (size_t)r.key_len, hash);
        map_store(m, hash, offset);
        *last = offset;
        ++*puts;
    }
    return 0;
}

#define RELEASE_GIL_FROM (64 << 10) /* input bytes: below this the walk takes less than a GIL hand-over */

static PyObject *no_room(void) {
    return PyErr_Format(PyExc_MemoryError, "the key map cannot grow past %lld slots", (long long)SLOTS_MAX);
}

static PyObject *KeyMap_map_v2(KeyMap *self, PyObject *args) {
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
    if (rc == -2) return no_room();
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

/* Whether the cleaner keeps record r (at `offset`), its reason counted in f when it does not. */
static int keeps(const KeyMap *m, const batch_facts *b, const record *r, int64_t offset, filtered *f) {
    if (offset > b->latest_offset) return 1;
    if (r->key == NULL) {
        f->no_key++;
        return 0;
    }
    uint8_t hash[HASH];
    md5(r->key, (size_t)r->key_len, hash);
    if (offset < map_get(m, hash)) {
        f->superseded++;
        return 0;
    }
    if (r->value == NULL && b->drop_tombstones) {
        f->tombstones_dropped++;
        return 0;
    }
    return 1;
}

/* The kept records into o (unless copied), f set: 0, -1 (not vouched for) or -2 (no memory). */
static int filter_walk(const KeyMap *m, const uint8_t *buf, Py_ssize_t len, const batch_facts *b, out_buf *o,
                       filtered *f) {
    cursor c = {buf, buf + len};
    int64_t count = 0, prev = -1, first_ts = 0;
    out_buf flags = {NULL, 0, 0};
    record r;
    while (c.p < c.end) {
        int64_t offset;
        if (read_record(&c, prev, b->last_offset_delta, &r) != 0 ||
            __builtin_add_overflow(b->base_offset, r.offset_delta, &offset)) {
            free(flags.buf);
            return -1;
        }
        prev = r.offset_delta;
        count++;
        int keep = keeps(m, b, &r, offset, f);
        if (reserve(&flags, 1) != 0) {
            free(flags.buf);
            return -2;
        }
        flags.buf[flags.len++] = (uint8_t)keep;
        if (!keep) continue;
        int64_t ts = b->log_append ? b->timestamp : wrapping_add(b->timestamp, r.timestamp_delta);
        if (f->kept == 0 || ts > f->max_ts) f->max_ts = ts;
        if (f->kept == 0) first_ts = ts;
        f->kept++;
        f->tombstones_kept += r.value == NULL;
    }
    if (count != b->expected_count) {
        free(flags.buf);
        return -1;
    }
    int stamp = !b->has_horizon && f->tombstones_kept > 0;
    f->copied = f->kept == count && !stamp;
    f->base_ts = b->has_horizon || stamp ? b->horizon : first_ts;
    if (f->kept == 0) f->max_ts = -1;
    if (f->copied) {
        free(flags.buf);
        return 0;
    }
    c.p = buf;
    prev = -1;
    for (size_t i = 0; c.p < c.end; i++) {
        read_record(&c, prev, b->last_offset_delta, &r);
        prev = r.offset_delta;
        if (!flags.buf[i]) continue;
        int64_t ts = b->log_append ? b->timestamp : wrapping_add(b->timestamp, r.timestamp_delta), ts_delta;
        if (__builtin_sub_overflow(ts, f->base_ts, &ts_delta)) {
            free(flags.buf);
            return -1;
        }
        if (put_record(o, &r, c.p, ts_delta, r.offset_delta) != 0) {
            free(flags.buf);
            return -2;
        }
    }
    free(flags.buf);
    return 0;
}

static PyObject *KeyMap_filter_v2(KeyMap *self, PyObject *args) {
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
    PyObject *key, *fallback = NULL;
    if (!PyArg_ParseTuple(args, "O|O", &key, &fallback)) return NULL;
    uint8_t hash[HASH];
    if (hash_of(key, hash) != 0) return NULL;
    int64_t offset = map_get(self, hash);
    if (offset < 0 && fallback != NULL) return Py_NewRef(fallback);
    return PyLong_FromLongLong(offset);
}

static PyObject *KeyMap_put(KeyMap *self, PyObject *args) {
    PyObject *key;
    long long offset;
    if (!PyArg_ParseTuple(args, "OL", &key, &offset)) return NULL;
    uint8_t hash[HASH];
    if (hash_of(key, hash) != 0) return NULL;
    if (map_full(self)) {
        PyErr_SetString(PyExc_OverflowError, "the key map is full");
        return NULL;
    }
    if (make_room(self) != 0) return no_room();
    map_store(self, hash, offset);
    Py_RETURN_NONE;
}

static PyObject *KeyMap_full(KeyMap *self, void *unused) { return PyBool_FromLong(map_full(self)); }

static Py_ssize_t KeyMap_len(KeyMap *self) { return (Py_ssize_t)self->size; }

static int KeyMap_init(KeyMap *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"slots", "capacity", NULL};
    long long slots, capacity;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LL", names, &slots, &capacity)) return -1;
    if (capacity < 0) slots = slots > GROWING_FIRST_SLOTS ? slots : GROWING_FIRST_SLOTS;
    if (slots < 1 || slots > SLOTS_MAX || capacity < -1 || capacity >= slots) {
        PyErr_Format(PyExc_ValueError, "a key map of 1 to %lld slots holding fewer keys than slots (or -1: grows)",
                     (long long)SLOTS_MAX);
        return -1;
    }
    uint8_t *table = calloc((size_t)slots, SLOT);
    if (table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    free(self->table);
    self->table = table;
    self->slots = slots;
    self->capacity = capacity;
    self->size = 0;
    return 0;
}

static void KeyMap_dealloc(KeyMap *self) {
    free(self->table);
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
    .tp_doc = "KeyMap(slots, capacity): the log cleaner's offset map (see _keymap.c)",
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
