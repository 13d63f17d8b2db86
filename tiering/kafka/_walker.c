/*
 * Deep validation of a magic v2 records section, compiled: one pass over the uncompressed records,
 * no allocation, the GIL released while it walks.
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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} cursor;

/* Reads a zigzag varint of at most max_bytes bytes. Returns 0 on success. */
static int read_varlong(cursor *c, int max_bytes, int64_t *out) {
    uint64_t value = 0;
    int shift = 0;
    for (int i = 0; i < max_bytes; i++) {
        if (c->p >= c->end) return -1;           /* truncated */
        uint8_t b = *c->p++;
        value |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *out = (int64_t)((value >> 1) ^ (~(value & 1) + 1));
            return 0;
        }
        shift += 7;
    }
    return -2;                                    /* too long */
}

#define ERR_MAX 200

static int walk(const uint8_t *buf, Py_ssize_t len, int64_t expected_count, int64_t last_offset_delta,
                int64_t *count_out, char *err) {
    cursor c = {buf, buf + len};
    int64_t count = 0;
    int64_t prev_delta = -1;
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

static PyObject *walk_v2(PyObject *self, PyObject *args) {
    Py_buffer view;
    long long expected_count, last_offset_delta;
    if (!PyArg_ParseTuple(args, "y*LL", &view, &expected_count, &last_offset_delta)) return NULL;
    char err[ERR_MAX];
    int64_t count = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = walk((const uint8_t *)view.buf, view.len, expected_count, last_offset_delta, &count, err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (rc != 0) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    return PyLong_FromLongLong(count);
}

static PyMethodDef methods[] = {
    {"walk_v2", walk_v2, METH_VARARGS,
     "walk_v2(records, expected_count, last_offset_delta) -> count\n\n"
     "Validate every record of an uncompressed magic v2 records section; ValueError says what is wrong."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_walker", NULL, -1, methods};

PyMODINIT_FUNC PyInit__walker(void) { return PyModule_Create(&module); }
