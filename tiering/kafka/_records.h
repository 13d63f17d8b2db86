/*
 * Reading and writing the records of a magic v2 records section, shared by the compiled modules that work on
 * records (_records.c, _keymap.c): a record is read as spans of the section, with the checks of _walker.c's
 * walk, and re-encoded as builder.encode_record writes it. Everything here is static: each module gets its
 * own copy.
 */
#ifndef TIERING_RECORDS_H
#define TIERING_RECORDS_H

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
static inline int read_record(cursor *c, int64_t prev_delta, int64_t last_offset_delta, record *out) {
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

static inline int reserve(out_buf *o, size_t more) {
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
static inline void put_fields(out_buf *o, const record *r, const uint8_t *end, void (*put_len)(out_buf *, int64_t)) {
    put_len(o, r->key == NULL ? -1 : r->key_len);
    put_bytes(o, r->key, r->key_len);
    put_len(o, r->value == NULL ? -1 : r->value_len);
    put_bytes(o, r->value, r->value_len);
    put_len(o, r->header_count);
    cursor h = {r->headers, end};
    for (int64_t i = 0; i < r->header_count; i++) {
        const uint8_t *k = NULL, *v = NULL;
        int64_t kn = 0, vn = 0;
        next_header(&h, &k, &kn, &v, &vn);
        put_len(o, kn);
        put_bytes(o, k, kn);
        put_len(o, v == NULL ? -1 : vn);
        put_bytes(o, v, vn);
    }
}

static inline int64_t wrapping_add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }

#define RELEASE_GIL_FROM (64 << 10) /* input bytes: below this the walk takes less than a GIL hand-over */

/* One record re-encoded as builder.encode_record writes it, with the deltas given (key, value and headers
 * from r, which ends at `end`): 0, or -2 when out of memory. */
static inline int put_record(out_buf *o, const record *r, const uint8_t *end, int64_t ts_delta,
                             int64_t offset_delta) {
    int64_t body = 1 + varint_size(ts_delta) + varint_size(offset_delta);
    body += r->key == NULL ? 1 : varint_size(r->key_len) + r->key_len;
    body += r->value == NULL ? 1 : varint_size(r->value_len) + r->value_len;
    body += varint_size(r->header_count);
    cursor h = {r->headers, end};
    for (int64_t i = 0; i < r->header_count; i++) {
        const uint8_t *k = NULL, *v = NULL;
        int64_t kn = 0, vn = 0;
        next_header(&h, &k, &kn, &v, &vn);
        body += varint_size(kn) + kn + (v == NULL ? 1 : varint_size(vn) + vn);
    }
    if (reserve(o, (size_t)(body + 10)) != 0) return -2;
    put_varint(o, body);
    o->buf[o->len++] = 0; /* attributes */
    put_varint(o, ts_delta);
    put_varint(o, offset_delta);
    put_fields(o, r, end, put_varint);
    return 0;
}

#endif
