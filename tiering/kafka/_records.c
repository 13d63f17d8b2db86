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
#include "_records.h"

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
            if (put_record(o, &r, c.p, ts_delta, offset_delta) != 0) return -2;
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
