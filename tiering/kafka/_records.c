/*
 * The record layer of magic v2 batches, compiled: records read as spans of the uncompressed records
 * section (no Python object per record), for re-batching and its proof.
 *
 *   digest_v2(section, base_offset, timestamp, log_append, expected_count, last_offset_delta)
 *       -> the records' digest input (the bytes segment.Digests feeds SHA-256 for records_sha256:
 *          per record >q offset, >q timestamp, >i key length or -1, key, >i value length or -1, value,
 *          >i header count, per header >i key length, key, >i value length or -1, value), or None.
 *   merge_v2(sections, bases, log_append, base_offset)
 *       -> (records section, record count, first timestamp, max timestamp) of one merged batch, or None:
 *          every record of the sections in order, re-encoded as builder.encode_record writes it against
 *          the merged batch's base offset and first record's timestamp.
 *
 * A record's timestamp is its batch's `timestamp` plus its delta (int64, wrapping as Java does), or with
 * log_append the batch's `timestamp` itself (the max timestamp a LogAppendTime batch gives every record).
 * `bases` holds (base offset, timestamp, last offset delta) per section.
 *
 * Both read the records with the checks of _walker.c's walk (every varint well formed, every length inside
 * its record, each record ending at its declared length, offset deltas strictly increasing within
 * [0, lastOffsetDelta]; digest_v2 also the count) and answer None for anything they do not vouch for,
 * including a re-encoded offset outside int64 or a delta outside int32 / int64: the caller then takes the
 * pure-Python reference (records.decode_v2, builder.build_batch), which names the problem or defines the
 * outcome. So both engines give the same bytes and the same errors on every input.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} cursor;

typedef struct {
    int64_t timestamp_delta;
    int64_t offset_delta;
    const uint8_t *key, *value; /* NULL for a null key or value */
    int64_t key_len, value_len;
    const uint8_t *headers;     /* the first header's first byte */
    int64_t header_count;
} record;

static inline int64_t zigzag(uint64_t v) { return (int64_t)(v >> 1) ^ -(int64_t)(v & 1); }

/* A zigzag varint of at most max_bytes bytes: 0, or -1 when truncated or too long. */
static inline int read_var(cursor *c, int max_bytes, int64_t *out) {
    const uint8_t *p = c->p;
    const uint8_t *stop = c->end - p < max_bytes ? c->end : p + max_bytes;
    uint64_t value = 0;
    for (int shift = 0; p < stop; shift += 7) {
        uint8_t b = *p++;
        if (shift == 63 && (b & 0x7F) > 1) return -1; /* bits past the 64th: records.py keeps them, Java not */
        value |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            c->p = p;
            *out = zigzag(value);
            return 0;
        }
    }
    return -1;
}

/* A nullable length (-1 or 0..bytes left) and the span it covers. */
static inline int read_span(cursor *r, int nullable, const uint8_t **at, int64_t *len) {
    if (read_var(r, 5, len) != 0 || *len < (nullable ? -1 : 0) || *len > (int64_t)(r->end - r->p)) return -1;
    *at = *len < 0 ? NULL : r->p;
    if (*len > 0) r->p += *len;
    return 0;
}

/* One record from c (advanced past it), with the walk's checks: 0, or -1. */
static int read_record(cursor *c, int64_t prev_delta, int64_t last_offset_delta, record *out) {
    int64_t length;
    if (read_var(c, 5, &length) != 0 || length < 1 || length > (int64_t)(c->end - c->p)) return -1;
    cursor r = {c->p + 1, c->p + length}; /* past the attributes byte (unused) */
    c->p += length;
    if (read_var(&r, 10, &out->timestamp_delta) != 0 || read_var(&r, 5, &out->offset_delta) != 0) return -1;
    if (out->offset_delta <= prev_delta || out->offset_delta > last_offset_delta) return -1;
    if (read_span(&r, 1, &out->key, &out->key_len) != 0 || read_span(&r, 1, &out->value, &out->value_len) != 0)
        return -1;
    if (read_var(&r, 5, &out->header_count) != 0 || out->header_count < 0 ||
        out->header_count > (int64_t)(r.end - r.p))
        return -1;
    out->headers = r.p;
    for (int64_t h = 0; h < out->header_count; h++) {
        const uint8_t *at;
        int64_t n;
        if (read_span(&r, 0, &at, &n) != 0 || read_span(&r, 1, &at, &n) != 0) return -1;
    }
    return r.p == r.end ? 0 : -1;
}

/* The next header at h, in a record whose headers read_record checked. */
static inline void next_header(cursor *h, const uint8_t **key, int64_t *key_len, const uint8_t **value,
                               int64_t *value_len) {
    read_span(h, 0, key, key_len);
    read_span(h, 1, value, value_len);
}

/* ---- a growable output buffer ------------------------------------------------------------------------ */

typedef struct {
    uint8_t *buf;
    size_t len, cap;
} out_buf;

static int reserve(out_buf *o, size_t more) {
    if (o->len + more <= o->cap) return 0;
    size_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + more) {
        if (cap > SIZE_MAX / 2) return -1;
        cap *= 2;
    }
    uint8_t *grown = realloc(o->buf, cap);
    if (grown == NULL) return -1;
    o->buf = grown;
    o->cap = cap;
    return 0;
}

static inline void put_be64(out_buf *o, int64_t v) {
    uint64_t u = (uint64_t)v;
    for (int i = 7; i >= 0; i--) o->buf[o->len++] = (uint8_t)(u >> (8 * i));
}

static inline void put_be32(out_buf *o, int64_t v) {
    uint32_t u = (uint32_t)(int32_t)v;
    for (int i = 3; i >= 0; i--) o->buf[o->len++] = (uint8_t)(u >> (8 * i));
}

static inline void put_bytes(out_buf *o, const uint8_t *p, int64_t n) {
    if (n > 0) {
        memcpy(o->buf + o->len, p, (size_t)n);
        o->len += (size_t)n;
    }
}

static inline int varint_size(int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    int n = 1;
    while (z >= 0x80) {
        z >>= 7;
        n++;
    }
    return n;
}

static inline void put_varint(out_buf *o, int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    while (z >= 0x80) {
        o->buf[o->len++] = (uint8_t)(z | 0x80);
        z >>= 7;
    }
    o->buf[o->len++] = (uint8_t)z;
}

/* A record's key, value and headers (the record ends at `end`), each length written by put_len: a big-endian
 * int32 in the digest's input, a varint in a records section. The caller reserved the room. */
static void put_fields(out_buf *o, const record *r, const uint8_t *end, void (*put_len)(out_buf *, int64_t)) {
    put_len(o, r->key == NULL ? -1 : r->key_len);
    put_bytes(o, r->key, r->key_len);
    put_len(o, r->value == NULL ? -1 : r->value_len);
    put_bytes(o, r->value, r->value_len);
    put_len(o, r->header_count);
    cursor h = {r->headers, end};
    for (int64_t i = 0; i < r->header_count; i++) {
        const uint8_t *k, *v;
        int64_t kn, vn;
        next_header(&h, &k, &kn, &v, &vn);
        put_len(o, kn);
        put_bytes(o, k, kn);
        put_len(o, v == NULL ? -1 : vn);
        put_bytes(o, v, vn);
    }
}

static inline int64_t wrapping_add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }

#define RELEASE_GIL_FROM (64 << 10) /* input bytes: below this the walk takes less than a GIL hand-over */

/* ---- digest_v2 ------------------------------------------------------------------------------------------ */

static int digest_walk(const uint8_t *buf, Py_ssize_t len, int64_t base_offset, int64_t timestamp, int log_append,
                       int64_t expected_count, int64_t last_offset_delta, out_buf *o) {
    cursor c = {buf, buf + len};
    int64_t count = 0, prev = -1;
    record r;
    while (c.p < c.end) {
        if (read_record(&c, prev, last_offset_delta, &r) != 0) return -1;
        prev = r.offset_delta;
        int64_t offset;
        if (__builtin_add_overflow(base_offset, r.offset_delta, &offset)) return -1;
        /* the record's bytes bound its key, value and headers; 28 bytes of fixed fields, 8 per header */
        if (reserve(o, 28 + (size_t)(c.p - r.headers) + (size_t)r.key_len * (r.key_len > 0) +
                           (size_t)r.value_len * (r.value_len > 0) + 8 * (size_t)r.header_count) != 0)
            return -2;
        put_be64(o, offset);
        put_be64(o, log_append ? timestamp : wrapping_add(timestamp, r.timestamp_delta));
        put_fields(o, &r, c.p, put_be32);
        count++;
    }
    return count == expected_count ? 0 : -1;
}

static PyObject *digest_v2(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer view;
    long long base_offset, timestamp, expected_count, last_offset_delta;
    int log_append;
    if (!PyArg_ParseTuple(args, "y*LLpLL", &view, &base_offset, &timestamp, &log_append, &expected_count,
                          &last_offset_delta))
        return NULL;
    out_buf o = {NULL, 0, 0};
    int rc;
    if (view.len < RELEASE_GIL_FROM) {
        rc = digest_walk(view.buf, view.len, base_offset, timestamp, log_append, expected_count, last_offset_delta,
                         &o);
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = digest_walk(view.buf, view.len, base_offset, timestamp, log_append, expected_count, last_offset_delta,
                         &o);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    PyObject *result = NULL;
    if (rc == 0) result = PyBytes_FromStringAndSize((const char *)o.buf, (Py_ssize_t)o.len);
    else if (rc == -2) PyErr_NoMemory();
    else result = Py_NewRef(Py_None);
    free(o.buf);
    return result;
}

/* ---- merge_v2 ------------------------------------------------------------------------------------------- */

typedef struct {
    Py_buffer view;
    int64_t base_offset, timestamp, last_offset_delta;
} source;

/* The merged section into o; *count, *first_ts, *max_ts set. 0, -1 (not vouched for) or -2 (no memory). */
static int merge_walk(const source *sources, Py_ssize_t n, int log_append, int64_t base_offset, out_buf *o,
                      int64_t *count, int64_t *first_ts, int64_t *max_ts) {
    int64_t records = 0, max = INT64_MIN, first = 0;
    for (Py_ssize_t s = 0; s < n; s++) {
        const source *src = &sources[s];
        cursor c = {src->view.buf, (const uint8_t *)src->view.buf + src->view.len};
        int64_t prev = -1;
        record r;
        while (c.p < c.end) {
            if (read_record(&c, prev, src->last_offset_delta, &r) != 0) return -1;
            prev = r.offset_delta;
            int64_t ts = log_append ? src->timestamp : wrapping_add(src->timestamp, r.timestamp_delta);
            if (records == 0) first = ts;
            int64_t offset, offset_delta, ts_delta;
            if (__builtin_add_overflow(src->base_offset, r.offset_delta, &offset) ||
                __builtin_sub_overflow(offset, base_offset, &offset_delta) || offset_delta < 0 ||
                offset_delta > INT32_MAX || __builtin_sub_overflow(ts, first, &ts_delta))
                return -1;
            if (ts > max) max = ts;
            /* the body as builder.encode_record lays it out, then its length in front */
            int64_t body = 1 + varint_size(ts_delta) + varint_size(offset_delta);
            body += r.key == NULL ? 1 : varint_size(r.key_len) + r.key_len;
            body += r.value == NULL ? 1 : varint_size(r.value_len) + r.value_len;
            body += varint_size(r.header_count);
            cursor h = {r.headers, c.p};
            for (int64_t i = 0; i < r.header_count; i++) {
                const uint8_t *k, *v;
                int64_t kn, vn;
                next_header(&h, &k, &kn, &v, &vn);
                body += varint_size(kn) + kn + (v == NULL ? 1 : varint_size(vn) + vn);
            }
            if (reserve(o, (size_t)(body + 10)) != 0) return -2;
            put_varint(o, body);
            o->buf[o->len++] = 0; /* attributes */
            put_varint(o, ts_delta);
            put_varint(o, offset_delta);
            put_fields(o, &r, c.p, put_varint);
            records++;
        }
    }
    *count = records;
    *first_ts = first;
    *max_ts = records ? max : -1;
    return 0;
}

static PyObject *merge_v2(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *sections, *bases;
    int log_append;
    long long base_offset;
    if (!PyArg_ParseTuple(args, "OOpL", &sections, &bases, &log_append, &base_offset)) return NULL;
    PyObject *secs = PySequence_Fast(sections, "sections must be a sequence");
    if (secs == NULL) return NULL;
    PyObject *bs = PySequence_Fast(bases, "bases must be a sequence");
    if (bs == NULL) {
        Py_DECREF(secs);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(secs), got = 0;
    PyObject *result = NULL;
    source *sources = NULL;
    if (PySequence_Fast_GET_SIZE(bs) != n) {
        PyErr_SetString(PyExc_ValueError, "sections and bases differ in length");
        goto done;
    }
    sources = PyMem_Calloc(n ? (size_t)n : 1, sizeof *sources);
    if (sources == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t total = 0;
    for (; got < n; got++) {
        source *s = &sources[got];
        long long bo, ts, lod;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(bs, got), "LLL;bases holds (base offset, timestamp, last "
                              "offset delta) tuples", &bo, &ts, &lod))
            goto done;
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(secs, got), &s->view, PyBUF_SIMPLE) != 0) goto done;
        s->base_offset = bo;
        s->timestamp = ts;
        s->last_offset_delta = lod;
        total += s->view.len;
    }
    out_buf o = {NULL, 0, 0};
    int64_t count = 0, first = 0, max = -1;
    int rc;
    if (total < RELEASE_GIL_FROM) {
        rc = merge_walk(sources, n, log_append, base_offset, &o, &count, &first, &max);
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = merge_walk(sources, n, log_append, base_offset, &o, &count, &first, &max);
        Py_END_ALLOW_THREADS
    }
    if (rc == 0) /* y# makes None of a NULL buffer: no records leave it unallocated */
        result = Py_BuildValue("(y#LLL)", o.buf ? (const char *)o.buf : "", (Py_ssize_t)o.len, (long long)count,
                               (long long)first, (long long)max);
    else if (rc == -2) PyErr_NoMemory();
    else result = Py_NewRef(Py_None);
    free(o.buf);
done:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&sources[i].view);
    PyMem_Free(sources);
    Py_DECREF(secs);
    Py_DECREF(bs);
    return result;
}

static PyMethodDef methods[] = {
    {"digest_v2", digest_v2, METH_VARARGS,
     "digest_v2(section, base_offset, timestamp, log_append, expected_count, last_offset_delta) -> bytes | None\n\n"
     "The records' digest input (what segment.Digests hashes for records_sha256), or None for a section it\n"
     "does not vouch for (the Python decoder then names the problem)."},
    {"merge_v2", merge_v2, METH_VARARGS,
     "merge_v2(sections, bases, log_append, base_offset) -> (section, count, first_timestamp, max_timestamp) | None\n\n"
     "The records of consecutive batches re-encoded as one batch's, or None (the Python builder then decides)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_records", NULL, -1, methods};

PyMODINIT_FUNC PyInit__records(void) { return PyModule_Create(&module); }
