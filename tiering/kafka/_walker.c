/*
 * Deep validation of a magic v2 records section, compiled: one pass over the uncompressed records,
 * no allocation, the GIL released while it walks a large one.
 *
 * Record layout (KIP-98, all varints zigzag-encoded):
 *   length varint | attributes int8 | timestampDelta varlong | offsetDelta varint |
 *   keyLength varint (-1 = null) | key | valueLength varint (-1 = null) | value |
 *   headersCount varint | headers: keyLength varint (>= 0) | key | valueLength varint (-1 = null) | value
 *
 * Checks: every varint well formed (at most 5 bytes for a varint, 10 for a varlong), every length
 * inside its record, each record ending exactly at its declared length, offset deltas strictly
 * increasing inside [0, lastOffsetDelta], the record count equal to the header's, no trailing bytes.
 * The pure-Python reference decoder in records.py implements the same rules; tests compare the two.
 *
 * Also here, the rewriter's per-batch byte work for magic v2 batches (its hot path):
 *   scan_v2      the headers of the complete, valid v2 batches of a buffer, CRC-32C checked, in one call;
 *                it stops at the first entry it cannot vouch for, which the Python reader then handles
 *                (and reports with its own error message);
 *   put_v2       a batch laid out in an output buffer with a new records section, codec, length and CRC-32C;
 *   first_difference  the proof's comparison of a group of decoded batches with the originals, one call
 *                per group with the GIL released;
 *   exported     whether a view of a bytearray is alive (the reader refills a read chunk only when none is).
 * The v2 header layout is the table in batch.py; the offsets used here are the same named fields.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#if defined(__x86_64__) || defined(_M_X64)
#include <nmmintrin.h>
#define HAVE_SSE42_PATH 1
#endif

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} cursor;

static inline int64_t zigzag(uint64_t v) { return (int64_t)(v >> 1) ^ -(int64_t)(v & 1); }

/* Reads a zigzag varint of at most max_bytes bytes. Returns 0 on success, -1 truncated, -2 too long. */
static inline int read_varlong(cursor *c, int max_bytes, int64_t *out) {
    const uint8_t *p = c->p;
    if (c->end - p >= 2) {  /* one or two bytes: the lengths, deltas and counts of ordinary records */
        uint64_t b0 = p[0], b1 = p[1];
        if (!(b0 & 0x80)) {
            c->p = p + 1;
            *out = zigzag(b0);
            return 0;
        }
        if (!(b1 & 0x80)) {
            c->p = p + 2;
            *out = zigzag((b0 & 0x7F) | b1 << 7);
            return 0;
        }
    }
    const uint8_t *stop = c->end - p < max_bytes ? c->end : p + max_bytes;
    uint64_t value = 0;
    for (int shift = 0; p < stop; shift += 7) {
        uint8_t b = *p++;
        value |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            c->p = p;
            *out = zigzag(value);
            return 0;
        }
    }
    return p - c->p < max_bytes ? -1 : -2;
}

#define ERR_MAX 200

/* The careful walk: every check, and on the first failure a message naming the record, its position and
 * what is wrong. It starts at buf + from, `count` records and the offset delta `prev_delta` already seen. */
static int walk(const uint8_t *buf, Py_ssize_t len, Py_ssize_t from, int64_t count, int64_t prev_delta,
                int64_t expected_count, int64_t last_offset_delta, int64_t *count_out, char *err) {
    cursor c = {buf + from, buf + len};
    int64_t v;
    int rc;
    while (c.p < c.end) {
        Py_ssize_t rec_pos = (Py_ssize_t)(c.p - buf);
        if ((rc = read_varlong(&c, 5, &v)) != 0) {
            snprintf(err, ERR_MAX, "record %lld at records byte %zd: %s length varint", (long long)count,
                     rec_pos, rc == -1 ? "truncated" : "overlong");
            return -1;
        }
        if (v < 0 || v > (int64_t)(c.end - c.p)) {
            snprintf(err, ERR_MAX, "record %lld at records byte %zd: length %lld outside the %zd bytes left",
                     (long long)count, rec_pos, (long long)v, (Py_ssize_t)(c.end - c.p));
            return -1;
        }
        cursor r = {c.p, c.p + v};
        c.p += v;
        if (r.p >= r.end) {
            snprintf(err, ERR_MAX, "record %lld at records byte %zd: no attributes byte", (long long)count, rec_pos);
            return -1;
        }
        r.p++; /* attributes: unused */
        const char *field = "timestampDelta";
        if ((rc = read_varlong(&r, 10, &v)) != 0) goto bad_varint;
        field = "offsetDelta";
        if ((rc = read_varlong(&r, 5, &v)) != 0) goto bad_varint;
        if (v <= prev_delta || v > last_offset_delta) {
            snprintf(err, ERR_MAX,
                     "record %lld at records byte %zd: offset delta %lld not in (%lld, %lld] (must increase "
                     "and stay within lastOffsetDelta)",
                     (long long)count, rec_pos, (long long)v, (long long)prev_delta, (long long)last_offset_delta);
            return -1;
        }
        prev_delta = v;
        for (int kv = 0; kv < 2; kv++) {
            field = kv == 0 ? "keyLength" : "valueLength";
            if ((rc = read_varlong(&r, 5, &v)) != 0) goto bad_varint;
            if (v < -1 || v > (int64_t)(r.end - r.p)) goto bad_length;
            if (v > 0) r.p += v;
        }
        field = "headersCount";
        if ((rc = read_varlong(&r, 5, &v)) != 0) goto bad_varint;
        if (v < 0 || v > (int64_t)(r.end - r.p)) goto bad_length;
        int64_t headers = v;
        for (int64_t h = 0; h < headers; h++) {
            field = "header keyLength";
            if ((rc = read_varlong(&r, 5, &v)) != 0) goto bad_varint;
            if (v < 0 || v > (int64_t)(r.end - r.p)) goto bad_length;
            r.p += v;
            field = "header valueLength";
            if ((rc = read_varlong(&r, 5, &v)) != 0) goto bad_varint;
            if (v < -1 || v > (int64_t)(r.end - r.p)) goto bad_length;
            if (v > 0) r.p += v;
        }
        if (r.p != r.end) {
            snprintf(err, ERR_MAX, "record %lld at records byte %zd: %zd bytes left after the last header",
                     (long long)count, rec_pos, (Py_ssize_t)(r.end - r.p));
            return -1;
        }
        count++;
        continue;
    bad_varint:
        snprintf(err, ERR_MAX, "record %lld at records byte %zd: %s %s varint", (long long)count, rec_pos,
                 rc == -1 ? "truncated" : "overlong", field);
        return -1;
    bad_length:
        snprintf(err, ERR_MAX, "record %lld at records byte %zd: %s %lld outside the record", (long long)count,
                 rec_pos, field, (long long)v);
        return -1;
    }
    if (count != expected_count) {
        snprintf(err, ERR_MAX, "record count %lld differs from the header's recordsCount %lld", (long long)count,
                 (long long)expected_count);
        return -1;
    }
    *count_out = count;
    return 0;
}

/* A varint of one to three bytes at p, decoded without a loop: its byte count, or 0 when it is longer (the
 * careful walk takes over then). The caller guarantees three readable bytes at p. */
static inline int varint3(const uint8_t *p, uint64_t *raw) {
    uint64_t b0 = p[0];
    if (!(b0 & 0x80)) { *raw = b0; return 1; }
    uint64_t b1 = p[1];
    if (!(b1 & 0x80)) { *raw = (b0 & 0x7F) | b1 << 7; return 2; }
    uint64_t b2 = p[2];
    if (!(b2 & 0x80)) { *raw = (b0 & 0x7F) | (b1 & 0x7F) << 7 | b2 << 14; return 3; }
    return 0;
}

/* A length field (zigzag raw value) at p within a record ending at e: NULL (-1) when `nullable`, else
 * 0..bytes left. Sets *n to the bytes it covers (0 for NULL). 0 when it is anything else. */
#define FAST_LENGTH(nullable, n)                                                                        \
    do {                                                                                                \
        if (p >= e || !(k = varint3(p, &raw))) goto careful;                                            \
        p += k;                                                                                         \
        if (raw & 1) {                                                                                  \
            if (!(nullable) || raw != 1) goto careful;                                                  \
            n = 0;                                                                                      \
        } else {                                                                                        \
            n = (Py_ssize_t)(raw >> 1);                                                                 \
            if (n > e - p) goto careful;                                                                \
        }                                                                                               \
    } while (0)

/* The fast walk: the records of ordinary shape (varints of at most three bytes, three readable bytes after
 * the record), with the same checks as the careful walk but no bookkeeping for messages. It accepts only
 * what the careful walk accepts and stops at the start of the first record it does not vouch for (the last
 * one always: nothing is readable after it), which the careful walk then takes from there. Returns that
 * position; *count and *prev_delta carry the state on. About half the instructions of the careful walk. */
static Py_ssize_t walk_fast(const uint8_t *buf, Py_ssize_t len, int64_t last_offset_delta, int64_t *count,
                            int64_t *prev_delta) {
    const uint8_t *end = buf + len, *rec = buf;
    int64_t n = *count, prev = *prev_delta;
    while (end - rec >= 3) {
        const uint8_t *p = rec, *e;
        uint64_t raw;
        int k;
        Py_ssize_t size, skip;
        if (!(k = varint3(p, &raw)) || (raw & 1)) break;  /* length: not negative */
        p += k;
        size = (Py_ssize_t)(raw >> 1);
        if (size == 0 || size > end - p - 3) break;  /* an attributes byte; three readable bytes after */
        e = p + size;
        p++;  /* attributes */
        if (p >= e || !(k = varint3(p, &raw))) goto careful;  /* timestampDelta: any value */
        p += k;
        if (p >= e || !(k = varint3(p, &raw))) goto careful;  /* offsetDelta */
        p += k;
        int64_t delta = zigzag(raw);
        if (delta <= prev || delta > last_offset_delta) goto careful;
        FAST_LENGTH(1, skip);  /* keyLength */
        p += skip;
        FAST_LENGTH(1, skip);  /* valueLength */
        p += skip;
        Py_ssize_t headers;
        FAST_LENGTH(0, headers);  /* headersCount: not negative, at most one a byte left */
        for (Py_ssize_t h = 0; h < headers; h++) {
            FAST_LENGTH(0, skip);  /* header keyLength */
            p += skip;
            FAST_LENGTH(1, skip);  /* header valueLength */
            p += skip;
        }
        if (p != e) goto careful;
        prev = delta;
        n++;
        rec = e;
        continue;
    careful:
        break;
    }
    *count = n;
    *prev_delta = prev;
    return (Py_ssize_t)(rec - buf);
}
#undef FAST_LENGTH

/* Both walks: the fast one as far as it goes, the careful one from there (with `fast` 0: the careful one
 * alone, which the tests compare it with). */
static int walk_all(const uint8_t *buf, Py_ssize_t len, int64_t expected_count, int64_t last_offset_delta,
                    int fast, int64_t *count_out, char *err) {
    int64_t count = 0, prev_delta = -1;
    Py_ssize_t from = fast ? walk_fast(buf, len, last_offset_delta, &count, &prev_delta) : 0;
    return walk(buf, len, from, count, prev_delta, expected_count, last_offset_delta, count_out, err);
}

#define RELEASE_GIL_FROM (1 << 20) /* records bytes: a walk of less takes a few hundred microseconds at most */

static PyObject *walk_v2(PyObject *self, PyObject *args) {
    Py_buffer view;
    long long expected_count, last_offset_delta;
    int fast = 1;
    if (!PyArg_ParseTuple(args, "y*LL|p", &view, &expected_count, &last_offset_delta, &fast)) return NULL;
    char err[ERR_MAX];
    int64_t count = 0;
    int rc;
    if (view.len < RELEASE_GIL_FROM) {  /* microseconds: less than handing the GIL over and back */
        rc = walk_all((const uint8_t *)view.buf, view.len, expected_count, last_offset_delta, fast, &count, err);
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = walk_all((const uint8_t *)view.buf, view.len, expected_count, last_offset_delta, fast, &count, err);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    if (rc != 0) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    return PyLong_FromLongLong(count);
}

/* fast_prefix(records, last_offset_delta) -> (position, count): how far the fast walk goes (for the tests). */
static PyObject *fast_prefix(PyObject *self, PyObject *args) {
    Py_buffer view;
    long long last_offset_delta;
    if (!PyArg_ParseTuple(args, "y*L", &view, &last_offset_delta)) return NULL;
    int64_t count = 0, prev_delta = -1;
    Py_ssize_t position = walk_fast((const uint8_t *)view.buf, view.len, last_offset_delta, &count, &prev_delta);
    PyBuffer_Release(&view);
    return Py_BuildValue("(nL)", position, (long long)count);
}

/* ---- CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as java.util.zip.CRC32C ---------------- */

static uint32_t crc_table[8][256];
static int use_hw_crc = 0;
#ifdef HAVE_SSE42_PATH
static void crc_hw_init(void);
#endif

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int t = 1; t < 8; t++) crc_table[t][n] = (crc_table[t - 1][n] >> 8) ^ crc_table[0][crc_table[t - 1][n] & 0xFF];
#ifdef HAVE_SSE42_PATH
    __builtin_cpu_init();
    use_hw_crc = __builtin_cpu_supports("sse4.2");
    if (use_hw_crc) crc_hw_init();
#endif
}

/* Software CRC-32C, slicing by 8 (the fallback off x86-64 or without SSE 4.2). */
static uint32_t crc32c_sw(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) { crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF]; n--; }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;  /* little-endian hosts: the CRC's low byte meets the first byte */
        crc = crc_table[7][w & 0xFF] ^ crc_table[6][(w >> 8) & 0xFF] ^ crc_table[5][(w >> 16) & 0xFF] ^
              crc_table[4][(w >> 24) & 0xFF] ^ crc_table[3][(w >> 32) & 0xFF] ^ crc_table[2][(w >> 40) & 0xFF] ^
              crc_table[1][(w >> 48) & 0xFF] ^ crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
#endif
    while (n--) crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF];
    return ~crc;
}

#ifdef HAVE_SSE42_PATH
/*
 * Hardware CRC-32C. The crc32 instruction has a latency of three cycles and a throughput of one a cycle, so
 * long buffers run three independent lanes at once and combine them: a CRC register advanced over n zero
 * bytes is a linear map (a 32x32 matrix over GF(2), as zlib's crc32_combine does it), tabulated once
 * for each lane length. The method is Mark Adler's (crc32c.c, 2013).
 */
#define LANE_LONG 8192
#define LANE_SHORT 256
static uint32_t shift_long[4][256], shift_short[4][256];

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    for (; vec; vec >>= 1, mat++)
        if (vec & 1) sum ^= *mat;
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat) {
    for (int n = 0; n < 32; n++) square[n] = gf2_times(mat, mat[n]);
}

/* The operator advancing a CRC register over `len` zero bytes, as four byte-indexed tables. */
static void zeros_tables(uint32_t tables[4][256], size_t len) {
    uint32_t even[32], odd[32], *op = even;
    odd[0] = 0x82F63B78u; /* one zero bit */
    for (int n = 1; n < 32; n++) odd[n] = 1u << (n - 1);
    gf2_square(even, odd); /* two zero bits */
    gf2_square(odd, even); /* four zero bits */
    for (;;) {             /* squaring doubles: one zero byte, then two, four, ... until len's bits are used */
        gf2_square(even, odd);
        len >>= 1;
        if (len == 0) { op = even; break; }
        gf2_square(odd, even);
        len >>= 1;
        if (len == 0) { op = odd; break; }
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int k = 0; k < 4; k++) tables[k][n] = gf2_times(op, n << (8 * k));
}

static inline uint32_t shift_crc(uint32_t tables[4][256], uint32_t crc) {
    return tables[0][crc & 0xFF] ^ tables[1][(crc >> 8) & 0xFF] ^ tables[2][(crc >> 16) & 0xFF] ^ tables[3][crc >> 24];
}

static void crc_hw_init(void) {
    zeros_tables(shift_long, LANE_LONG);
    zeros_tables(shift_short, LANE_SHORT);
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c0 = ~crc, c1, c2, w0, w1, w2;
    while (n && ((uintptr_t)p & 7)) { c0 = _mm_crc32_u8((uint32_t)c0, *p++); n--; }
    static const size_t lanes[2] = {LANE_LONG, LANE_SHORT};
    for (int l = 0; l < 2; l++) {
        size_t lane = lanes[l];
        uint32_t (*tables)[256] = l == 0 ? shift_long : shift_short;
        while (n >= 3 * lane) {
            c1 = c2 = 0;
            for (const uint8_t *end = p + lane; p < end; p += 8) {
                memcpy(&w0, p, 8);
                memcpy(&w1, p + lane, 8);
                memcpy(&w2, p + 2 * lane, 8);
                c0 = _mm_crc32_u64(c0, w0);
                c1 = _mm_crc32_u64(c1, w1);
                c2 = _mm_crc32_u64(c2, w2);
            }
            c0 = shift_crc(tables, (uint32_t)c0) ^ (uint32_t)c1;
            c0 = shift_crc(tables, (uint32_t)c0) ^ (uint32_t)c2;
            p += 2 * lane;
            n -= 3 * lane;
        }
    }
    while (n >= 8) {
        memcpy(&w0, p, 8);
        c0 = _mm_crc32_u64(c0, w0);
        p += 8;
        n -= 8;
    }
    while (n--) c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return ~(uint32_t)c0;
}
#endif

static uint32_t crc32c(uint32_t crc, const uint8_t *p, size_t n) {
#ifdef HAVE_SSE42_PATH
    if (use_hw_crc) return crc32c_hw(crc, p, n);
#endif
    return crc32c_sw(crc, p, n);
}

static PyObject *crc_call(PyObject *args, uint32_t (*fn)(uint32_t, const uint8_t *, size_t)) {
    Py_buffer view;
    unsigned int start = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &view, &start)) return NULL;
    uint32_t crc = fn(start, (const uint8_t *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

static PyObject *py_crc32c(PyObject *self, PyObject *args) { return crc_call(args, crc32c); }
static PyObject *py_crc32c_portable(PyObject *self, PyObject *args) { return crc_call(args, crc32c_sw); }

/* ---- magic v2 batch headers (field table: batch.py) ------------------------------------------- */

#define LOG_OVERHEAD 12
#define LENGTH_AT 8
#define MAGIC_AT 16
#define CRC_AT 17
#define ATTRIBUTES_AT 21
#define LAST_OFFSET_DELTA_AT 23
#define MAX_TIMESTAMP_AT 35
#define RECORDS_COUNT_AT 57
#define V2_HEADER_SIZE 61
#define CODEC_MASK 0x07
#define CONTROL_BIT 0x20
#define MAX_CODEC 4

static inline uint64_t be64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    return v;
}
static inline uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}

/*
 * scan_v2(buffer, start, max_total) -> list of (start, total, base_offset, last_offset, max_timestamp,
 *                                               attributes, records_count)
 * Every complete magic v2 batch from `start` on whose header passes the same checks as batch.py's
 * parse_v2_header and whose CRC-32C matches; stops before the first entry that is incomplete, not v2,
 * larger than max_total (log overhead included) or fails a check, and returns what it found.
 */
static PyObject *scan_v2(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start;
    long long max_total;
    if (!PyArg_ParseTuple(args, "y*nL", &view, &start, &max_total)) return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL) { PyBuffer_Release(&view); return NULL; }
    const uint8_t *buf = (const uint8_t *)view.buf;
    Py_ssize_t pos = start < 0 ? view.len : start;
    while (view.len - pos >= V2_HEADER_SIZE) {
        const uint8_t *b = buf + pos;
        int64_t base = (int64_t)be64(b);
        int32_t length = (int32_t)be32(b + LENGTH_AT);
        if (b[MAGIC_AT] != 2 || length < V2_HEADER_SIZE - LOG_OVERHEAD) break;
        int64_t total = (int64_t)length + LOG_OVERHEAD;
        if (total > max_total || total > view.len - pos) break;
        int attributes = (int16_t)((b[ATTRIBUTES_AT] << 8) | b[ATTRIBUTES_AT + 1]);
        int32_t last_delta = (int32_t)be32(b + LAST_OFFSET_DELTA_AT);
        int32_t count = (int32_t)be32(b + RECORDS_COUNT_AT);
        int codec = attributes & CODEC_MASK;
        if (codec > MAX_CODEC || count < 0 || last_delta < 0 || base > INT64_MAX - last_delta) break;
        if (count > 0 && (int64_t)count - 1 > last_delta) break;
        if ((attributes & CONTROL_BIT) && codec != 0) break;
        /* The GIL stays held: a batch's CRC takes about a microsecond, less than handing the GIL over. */
        if (crc32c(0, b + ATTRIBUTES_AT, (size_t)(total - ATTRIBUTES_AT)) != be32(b + CRC_AT)) break;
        long long fields[7] = {pos, total, base, base + last_delta, (long long)(int64_t)be64(b + MAX_TIMESTAMP_AT),
                               attributes, count};
        PyObject *item = PyTuple_New(7);
        for (int i = 0; item != NULL && i < 7; i++) {
            PyObject *v = PyLong_FromLongLong(fields[i]);
            if (v == NULL) { Py_CLEAR(item); break; }
            PyTuple_SET_ITEM(item, i, v);
        }
        if (item == NULL || PyList_Append(out, item) != 0) {
            Py_XDECREF(item);
            Py_DECREF(out);
            PyBuffer_Release(&view);
            return NULL;
        }
        Py_DECREF(item);
        pos += (Py_ssize_t)total;
    }
    PyBuffer_Release(&view);
    return out;
}

/* put_v2(out, at, batch, codec, payload) -> end: lays the batch out at out[at:end], its records section being
 * `payload`: the batch's 61-byte header with codec bits, batchLength and CRC-32C made for that payload (every
 * other field as it was), then the payload. The rewriter's output buffer is filled this way, one call a batch;
 * `out` must not overlap `batch` or `payload` (the rewriter's never do: output buffers are its own). */
static PyObject *put_v2(PyObject *self, PyObject *args) {
    Py_buffer out, batch, payload;
    Py_ssize_t at;
    int codec;
    if (!PyArg_ParseTuple(args, "w*ny*iy*", &out, &at, &batch, &codec, &payload)) return NULL;
    PyObject *result = NULL;
    if (batch.len < V2_HEADER_SIZE || codec < 0 || codec > MAX_CODEC ||
        payload.len > (Py_ssize_t)INT32_MAX - (V2_HEADER_SIZE - LOG_OVERHEAD)) {
        PyErr_SetString(PyExc_ValueError, "put_v2: a batch of >= 61 bytes, a codec 0..4 and a payload < 2 GiB");
        goto done;
    }
    if (at < 0 || at > out.len || out.len - at < V2_HEADER_SIZE + payload.len) {
        PyErr_Format(PyExc_ValueError, "put_v2: %zd bytes from %zd do not fit a buffer of %zd",
                     V2_HEADER_SIZE + payload.len, at, out.len);
        goto done;
    }
    uint8_t *h = (uint8_t *)out.buf + at;
    memcpy(h, batch.buf, V2_HEADER_SIZE);  /* (out must not overlap batch or payload: see the docstring) */
    memcpy(h + V2_HEADER_SIZE, payload.buf, (size_t)payload.len);
    h[ATTRIBUTES_AT + 1] = (uint8_t)((h[ATTRIBUTES_AT + 1] & ~CODEC_MASK) | codec);
    put_be32(h + LENGTH_AT, (uint32_t)(payload.len + V2_HEADER_SIZE - LOG_OVERHEAD));
    put_be32(h + CRC_AT, crc32c(0, h + ATTRIBUTES_AT, (size_t)(V2_HEADER_SIZE - ATTRIBUTES_AT + payload.len)));
    result = PyLong_FromSsize_t(at + V2_HEADER_SIZE + payload.len);
done:
    PyBuffer_Release(&out);
    PyBuffer_Release(&batch);
    PyBuffer_Release(&payload);
    return result;
}

/* first_difference(a, b) -> index of the first pair of buffers that differ (length or bytes), or -1.
 * `a` and `b` are sequences of buffers of the same length; the comparison runs without the GIL. */
static PyObject *first_difference(PyObject *self, PyObject *args) {
    PyObject *a, *b;
    if (!PyArg_ParseTuple(args, "OO", &a, &b)) return NULL;
    Py_ssize_t n = PySequence_Size(a);
    if (n < 0) return NULL;
    if (PySequence_Size(b) != n) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "first_difference: sequences of different lengths");
        return NULL;
    }
    Py_buffer *views = PyMem_Calloc((size_t)(2 * n + 1), sizeof(Py_buffer));
    if (views == NULL) return PyErr_NoMemory();
    Py_ssize_t got = 0, found = -1;
    int ok = 1;
    for (Py_ssize_t i = 0; i < n && ok; i++) {
        for (int side = 0; side < 2 && ok; side++) {
            PyObject *item = PySequence_GetItem(side == 0 ? a : b, i);
            if (item == NULL || PyObject_GetBuffer(item, &views[got], PyBUF_SIMPLE) != 0) ok = 0;
            else got++;
            Py_XDECREF(item);  /* the buffer view keeps what it exposes alive */
        }
    }
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_buffer *x = &views[2 * i], *y = &views[2 * i + 1];
            if (x->len != y->len || memcmp(x->buf, y->buf, (size_t)x->len) != 0) { found = i; break; }
        }
        Py_END_ALLOW_THREADS
    }
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    return ok ? PyLong_FromSsize_t(found) : NULL;
}

/* exported(chunk) -> whether any buffer view of the bytearray is alive. Every memoryview derived from one
 * holds its export until it is released, so False means nothing can see the bytes change. */
static PyObject *exported(PyObject *self, PyObject *chunk) {
    if (!PyByteArray_CheckExact(chunk)) {
        PyErr_SetString(PyExc_TypeError, "exported() takes a bytearray");
        return NULL;
    }
    return PyBool_FromLong(((PyByteArrayObject *)chunk)->ob_exports > 0);
}

static PyMethodDef methods[] = {
    {"walk_v2", walk_v2, METH_VARARGS,
     "walk_v2(records, expected_count, last_offset_delta, fast=True) -> count\n\n"
     "Validate every record of an uncompressed magic v2 records section; ValueError says what is wrong.\n"
     "fast=False: the careful walk alone (the same verdicts and messages; the tests compare them)."},
    {"fast_prefix", fast_prefix, METH_VARARGS,
     "fast_prefix(records, last_offset_delta) -> (position, count): where the fast walk hands over."},
    {"crc32c", py_crc32c, METH_VARARGS, "crc32c(data, crc=0) -> CRC-32C of data, continuing from crc."},
    {"crc32c_portable", py_crc32c_portable, METH_VARARGS,
     "crc32c_portable(data, crc=0) -> the same by the table-driven code (used where SSE 4.2 is missing)."},
    {"scan_v2", scan_v2, METH_VARARGS,
     "scan_v2(buffer, start, max_total) -> [(start, total, base_offset, last_offset, max_timestamp, attributes,\n"
     "records_count)] for the complete, CRC-valid v2 batches from start, up to the first it cannot vouch for."},
    {"put_v2", put_v2, METH_VARARGS,
     "put_v2(out, at, batch, codec, payload) -> end: the batch with payload as its records section (codec bits,\n"
     "length and CRC made for it) written into the writable buffer out from at (not overlapping the others)."},
    {"first_difference", first_difference, METH_VARARGS,
     "first_difference(a, b) -> index of the first differing pair of buffers, or -1 (GIL released)."},
    {"exported", exported, METH_O, "exported(chunk) -> whether a buffer view of the bytearray is alive."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_walker", NULL, -1, methods};

PyMODINIT_FUNC PyInit__walker(void) {
    crc_init();
    return PyModule_Create(&module);
}
