/*
 * The rewriter's proof for zstd, compiled: decode every recompressed batch again and compare it with the
 * original records, byte for byte, without the GIL.
 *
 *   first_mismatch(news, originals)  one group on the calling thread, the GIL released once;
 *   ProofThread                      groups proven in order on a thread of its own that never takes the
 *                                    GIL: submit(news, originals) hands a group over, result() waits for
 *                                    the oldest one.
 *   decompress(data, limit)          the reader's zstd decode of one records section (below), or None.
 * Both answer the index of the first batch whose new bytes do not decode to its original records (a decode
 * error, a different length or different bytes), or -1.
 *
 * Why not the zstandard package on a Python thread: every time that thread needs the GIL back (after each
 * call, and to pick up work) the main thread can be made to wait, and on a virtual machine waking a vCPU
 * for that hand-off took about a millisecond: a thousand hand-offs cost a 256 MiB rewrite 0.5-2 s. Here
 * the proof thread only meets the main thread at a mutex, once per group. Each batch decodes into one
 * reused buffer (no fresh allocation, so no page faults), capped at the original's size, so a frame that
 * decodes to more is a mismatch, never a large allocation.
 *
 * libzstd is loaded at run time (dlopen): first the zstandard package's own build (its CFFI backend exports
 * the library's API), so that the verdicts here are the Python proof's, then the system's shared library if
 * it is at least Kafka's version (VERSION_MIN). Without either, `available()` is False and rewrite.py proves
 * through the zstandard package instead, slower. TIERING_NO_NATIVE_ZSTD=1 in the environment
 * leaves the library unloaded, for comparisons. A ProofThread serves one caller at a time
 * (a second caller, or a forked child, gets a RuntimeError, never a crash or a hang).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__unix__) || defined(__APPLE__)
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>
#define HAVE_NATIVE_PROOF 1
#endif

#define NO_MEMORY (-2)

typedef struct ZSTD_DCtx_s ZSTD_DCtx;
static ZSTD_DCtx *(*zstd_create)(void);
static size_t (*zstd_free)(ZSTD_DCtx *);
static size_t (*zstd_decompress)(ZSTD_DCtx *, void *, size_t, const void *, size_t);
static size_t (*zstd_frame_size)(const void *, size_t);
typedef struct { const void *src; size_t size, pos; } zstd_in;   /* ZSTD_inBuffer */
typedef struct { void *dst; size_t size, pos; } zstd_out;        /* ZSTD_outBuffer */
static size_t (*zstd_stream)(ZSTD_DCtx *, zstd_out *, zstd_in *);
static size_t (*zstd_reset)(ZSTD_DCtx *, int);
#define RESET_SESSION_ONLY 1  /* ZSTD_reset_session_only */
static unsigned (*zstd_is_error)(size_t);
static unsigned (*zstd_version)(void);
static char zstd_library[4096];  /* the file loaded, "" when none */

/* The oldest decoder whose verdicts are trusted: Kafka's zstd-jni 1.5.6. Each release since 1.5.4 refuses
 * more malformed frames (a bitstream not consumed to its end, reserved bits set, trailing bytes after the
 * sequences section), and a frame an older decoder accepts may be one Kafka's readers call corrupt. */
#define VERSION_MIN 10506

#ifdef HAVE_NATIVE_PROOF
static const char *const LIBRARIES[] = {"libzstd.so.1", "libzstd.so", "libzstd.1.dylib", "libzstd.dylib"};

/* 1 when the file opens and exports the decoder at VERSION_MIN or later (the functions then set); else 0. */
static int try_library(const char *file) {
    void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) return 0;
    *(void **)&zstd_create = dlsym(h, "ZSTD_createDCtx");
    *(void **)&zstd_free = dlsym(h, "ZSTD_freeDCtx");
    *(void **)&zstd_decompress = dlsym(h, "ZSTD_decompressDCtx");
    *(void **)&zstd_frame_size = dlsym(h, "ZSTD_findFrameCompressedSize");
    *(void **)&zstd_stream = dlsym(h, "ZSTD_decompressStream");
    *(void **)&zstd_reset = dlsym(h, "ZSTD_DCtx_reset");
    *(void **)&zstd_is_error = dlsym(h, "ZSTD_isError");
    *(void **)&zstd_version = dlsym(h, "ZSTD_versionNumber");
    if (zstd_create && zstd_free && zstd_decompress && zstd_frame_size && zstd_stream && zstd_reset &&
        zstd_is_error && zstd_version &&
        zstd_version() >= VERSION_MIN && strlen(file) < sizeof zstd_library) {
        strcpy(zstd_library, file);
        return 1;
    }
    dlclose(h);
    return 0;
}

/* The file of the zstandard package's CFFI backend, which links libzstd in and exports its API (the C backend
 * hides it): the decoder of the Python proof, the same build and version. NULL when there is none. With the
 * GIL; never raises. */
static PyObject *package_library(void) {
    PyObject *util = PyImport_ImportModule("importlib.util");
    PyObject *spec = util == NULL ? NULL : PyObject_CallMethod(util, "find_spec", "s", "zstandard._cffi");
    PyObject *origin = spec == NULL || spec == Py_None ? NULL : PyObject_GetAttrString(spec, "origin");
    Py_XDECREF(spec);
    Py_XDECREF(util);
    PyErr_Clear();
    if (origin != NULL && !PyUnicode_Check(origin)) Py_CLEAR(origin);
    return origin;
}

/* The zstandard package's own libzstd first, so that the compiled verdict is the Python proof's; else the
 * system's, if recent enough. */
static void load_zstd(void) {
    PyObject *origin = package_library();
    const char *file = origin == NULL ? NULL : PyUnicode_AsUTF8(origin);
    PyErr_Clear();
    int loaded = file != NULL && try_library(file);
    Py_XDECREF(origin);
    for (size_t i = 0; !loaded && i < sizeof LIBRARIES / sizeof *LIBRARIES; i++) loaded = try_library(LIBRARIES[i]);
}
#endif

/* A group: for batch i, views[2i] its new bytes and views[2i + 1] the records they must decode to. */
typedef struct {
    Py_ssize_t n;
    Py_ssize_t acquired;
    Py_buffer *views;
} group;

static void group_release(group *g) {
    for (Py_ssize_t i = 0; i < g->acquired; i++) PyBuffer_Release(&g->views[i]);
    PyMem_Free(g->views);
    g->views = NULL;
    g->acquired = g->n = 0;
}

/* With the GIL. The views keep the objects' memory alive until group_release. 0, or -1 with an exception. */
static int group_acquire(group *g, PyObject *news, PyObject *originals) {
    g->n = g->acquired = 0;
    g->views = NULL;
    Py_ssize_t n = PySequence_Size(news);
    if (n < 0) return -1;
    if (PySequence_Size(originals) != n) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "news and originals differ in length");
        return -1;
    }
    g->views = PyMem_Calloc((size_t)(2 * n + 1), sizeof(Py_buffer));
    if (g->views == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    g->n = n;
    for (Py_ssize_t i = 0; i < 2 * n; i++) {
        PyObject *item = PySequence_GetItem(i % 2 ? originals : news, i / 2);
        int rc = item == NULL ? -1 : PyObject_GetBuffer(item, &g->views[i], PyBUF_SIMPLE);
        Py_XDECREF(item);
        if (rc != 0) {
            group_release(g);
            return -1;
        }
        g->acquired++;
    }
    return 0;
}

/* The largest window a streaming decoder accepts by default (libzstd's ZSTD_WINDOWLOG_LIMIT_DEFAULT): Kafka's
 * readers decode a batch as a stream, and refuse a frame that declares more. The one-shot decoder used here
 * ignores the window, so each frame's is checked first (RFC 8878, 3.1.1.1). */
#define WINDOW_MAX ((1ULL << 27) + 1)
#define FRAME_MAGIC 0xFD2FB528u
#define SKIPPABLE_MASK 0xFFFFFFF0u
#define SKIPPABLE_MAGIC 0x184D2A50u

static uint64_t le(const uint8_t *p, size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* A frame header's fields (RFC 8878, 3.1.1.1): the sizes of Frame_Content_Size and Dictionary_ID by their flags
 * (a content-size flag of 0 means 1 byte in a single-segment frame, none otherwise), and the window a
 * Window_Descriptor declares. */
#define BLOCK_MAX (128u << 10)
static const size_t FCS_BYTES[4] = {0, 2, 4, 8}, DID_BYTES[4] = {0, 1, 2, 4};

static size_t fcs_size(uint8_t fhd) { return FCS_BYTES[fhd >> 6] ? FCS_BYTES[fhd >> 6] : (size_t)((fhd & 0x20) != 0); }

static uint64_t descriptor_window(uint8_t wd) {
    uint64_t base = 1ULL << (10 + (wd >> 3));
    return base + (base / 8) * (wd & 7);
}

/* 1 when a frame of p[0..size) (its magic checked) holds only blocks a streaming decoder takes: at most
 * min(window, 128 KiB) each (RFC 8878, 3.1.1.2.4), where libzstd's one-shot decoder takes an RLE or raw block
 * of any size; 0 otherwise. (A compressed block is checked by its compressed size only: the proof decodes
 * frames the zstandard package has just written, whose blocks are within the maximum.) */
static int blocks_accepted(const uint8_t *p, size_t size, size_t at, uint64_t window) {
    uint64_t block_max = window < BLOCK_MAX ? window : BLOCK_MAX;
    for (;;) {
        if (at > size || size - at < 3) return 0;
        uint32_t header = (uint32_t)le(p + at, 3), type = (header >> 1) & 3, block = header >> 3;
        if (type == 3 || block > block_max) return 0;
        at += 3 + (type == 1 ? 1 : block);
        if (header & 1) return 1;
    }
}

/* 1 when every frame of p[0..n) declares a window a streaming decoder accepts and holds blocks it takes;
 * 0 otherwise, and for bytes that are not frames (the decoder then refuses them too). */
static int windows_accepted(const uint8_t *p, size_t n) {
    while (n > 0) {
        size_t size = zstd_frame_size(p, n);
        if (zstd_is_error(size) || size > n || size < 5) return 0;
        uint32_t magic = (uint32_t)le(p, 4);
        if ((magic & SKIPPABLE_MASK) != SKIPPABLE_MAGIC) {
            if (magic != FRAME_MAGIC) return 0;
            uint8_t fhd = p[4];
            int single = (fhd & 0x20) != 0;
            size_t fcs = fcs_size(fhd), at = 5 + (single ? 0 : 1) + DID_BYTES[fhd & 3];
            if (at + fcs > size) return 0;
            /* single-segment: the window is the content size */
            uint64_t window = single ? le(p + at, fcs) + (fcs == 2 ? 256 : 0) : descriptor_window(p[5]);
            if (window > WINDOW_MAX || !blocks_accepted(p, size, at + fcs, window)) return 0;
        }
        p += size;
        n -= size;
    }
    return 1;
}

/* Without the GIL: the first batch that does not decode to its original, -1 if none, NO_MEMORY. */
static Py_ssize_t group_first_mismatch(const group *g, ZSTD_DCtx *dctx, uint8_t **scratch, size_t *capacity) {
    for (Py_ssize_t i = 0; i < g->n; i++) {
        const Py_buffer *new = &g->views[2 * i], *original = &g->views[2 * i + 1];
        size_t want = (size_t)original->len;
        if (want > *capacity || *scratch == NULL) {
            uint8_t *bigger = realloc(*scratch, want ? want : 1);
            if (bigger == NULL) return NO_MEMORY;
            *scratch = bigger;
            *capacity = want ? want : 1;
        }
        if (new->len == 0) return i;  /* no frame at all: the codec's readers reject it, even for no records */
        if (!windows_accepted(new->buf, (size_t)new->len)) return i;
        size_t got = zstd_decompress(dctx, *scratch, want, new->buf, (size_t)new->len);
        if (zstd_is_error(got) || got != want || memcmp(*scratch, original->buf, want) != 0) return i;
    }
    return -1;
}

static int check_available(void) {
    if (zstd_library[0] != 0) return 0;
    PyErr_SetString(PyExc_RuntimeError, "no libzstd (1.5.6 or later) was found to load: see available()");
    return -1;
}

static PyObject *result_of(Py_ssize_t found) {
    if (found == NO_MEMORY) return PyErr_NoMemory();
    return PyLong_FromSsize_t(found);
}

static PyObject *first_mismatch(PyObject *self, PyObject *args) {
    PyObject *news, *originals;
    if (!PyArg_ParseTuple(args, "OO", &news, &originals) || check_available() != 0) return NULL;
    group g;
    if (group_acquire(&g, news, originals) != 0) return NULL;
    Py_ssize_t found;
    Py_BEGIN_ALLOW_THREADS
    uint8_t *scratch = NULL;
    size_t capacity = 0;
    ZSTD_DCtx *dctx = zstd_create();
    found = dctx == NULL ? NO_MEMORY : group_first_mismatch(&g, dctx, &scratch, &capacity);
    if (dctx != NULL) zstd_free(dctx);
    free(scratch);
    Py_END_ALLOW_THREADS
    group_release(&g);
    return result_of(found);
}

/* --- decompress(data, limit): a zstd records section decoded in one call ------------------------------------
 *
 * The reader's zstd path in Python (codecs.zstd_reference) costs about 4 us a batch around the decoder: the
 * frame walk, the output bound, the calls. This is the same walk and the same decoder call in C (the
 * zstandard package's decompress: one ZSTD_decompressStream into the frame's bound, which must end the
 * frame). It answers the decoded bytes, or None wherever the Python path would take another route or might
 * answer anything else: a frame the walk refuses (truncated, a reserved bit or block type, a skippable frame),
 * a frame with no content and no declared size, one without a declared size whose output is larger than its
 * window (below), a decoder error, more than MAX_FRAMES frames, bounds past
 * `limit`. None is never a verdict: the caller then runs the Python path, which decodes or names the
 * problem. So a batch decoded here is one the Python path decodes to the same bytes (the fuzz target `zstd`
 * holds that, and codecs uses this only when the library loaded is the zstandard package's own version). */

#define MAX_FRAMES 4096  /* codecs.MAX_ZSTD_FRAMES */

typedef struct {
    size_t start, end, bound;
    uint64_t window;  /* the window it declares (its content size when it is single-segment) */
    int sized;        /* the frame declares its content size (the bound) */
} frame;

/* codecs._zstd_frames' walk: the frames of p[0..n) and the sum of their output bounds; -1 on anything the
 * walk raises for, or a skippable frame (rare in Kafka: left to Python). */
static Py_ssize_t walk_frames(const uint8_t *p, size_t n, frame *frames, size_t *total) {
    size_t pos = 0, count = 0;
    *total = 0;
    while (pos < n) {
        if (count >= MAX_FRAMES || n - pos < 5) return -1;
        size_t start = pos;
        if ((uint32_t)le(p + pos, 4) != FRAME_MAGIC) return -1;
        uint8_t fhd = p[pos + 4];
        if (fhd & 0x08) return -1;
        int single = (fhd & 0x20) != 0;
        size_t fcs = fcs_size(fhd), at = pos + 5 + (single ? 0 : 1) + DID_BYTES[fhd & 3];
        if (at > n || fcs > n - at) return -1;
        pos = at + fcs;
        int sized = fcs != 0;
        uint64_t content = sized ? le(p + at, fcs) + (fcs == 2 ? 256 : 0) : 0;
        uint64_t bound = 0;
        for (;;) {
            if (n - pos < 3) return -1;
            uint32_t header = (uint32_t)le(p + pos, 3);
            pos += 3;
            uint32_t type = (header >> 1) & 3, size = header >> 3;
            if (type == 3) return -1;
            size_t skip = type == 1 ? 1 : size;
            if (skip > n - pos) return -1;
            pos += skip;
            bound += type == 2 ? BLOCK_MAX : size;
            if (header & 1) break;
        }
        if (fhd & 0x04) {
            if (n - pos < 4) return -1;
            pos += 4;
        }
        uint64_t out = sized ? content : bound;
        if (out == 0 || out > (uint64_t)PY_SSIZE_T_MAX - *total) return -1;
        frames[count].start = start;
        frames[count].end = pos;
        frames[count].bound = (size_t)out;
        frames[count].sized = sized;
        frames[count].window = sized ? out : descriptor_window(p[start + 5]);  /* unsized: not single-segment */
        *total += (size_t)out;
        count++;
    }
    return (Py_ssize_t)count;
}

static PyThread_type_lock shared_lock;  /* guards shared_dctx; a caller that finds it taken uses a fresh one */
static ZSTD_DCtx *shared_dctx;

static PyObject *decompress(PyObject *self, PyObject *args) {
    Py_buffer in;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "y*n", &in, &limit)) return NULL;
    PyObject *result = NULL;
    frame *frames = NULL;
    size_t total = 0;
    Py_ssize_t count = -1;
    if (zstd_library[0] == 0 || in.len == 0 || limit < 0) goto none;
    frames = PyMem_Malloc(sizeof(frame) * (in.len / 8 + 1 < MAX_FRAMES ? in.len / 8 + 1 : MAX_FRAMES));
    if (frames == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    count = walk_frames(in.buf, (size_t)in.len, frames, &total);
    if (count <= 0 || total > (size_t)limit) goto none;
    result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (result == NULL) goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
    size_t got = 0;
    int failed = 0;
    PyThread_type_lock lock = shared_lock;
    Py_BEGIN_ALLOW_THREADS
    int mine = lock != NULL && PyThread_acquire_lock(lock, NOWAIT_LOCK);
    ZSTD_DCtx *dctx;
    if (mine) {
        if (shared_dctx == NULL) shared_dctx = zstd_create();
        dctx = shared_dctx;
    } else {
        dctx = zstd_create();
    }
    failed = dctx == NULL;
    for (Py_ssize_t i = 0; i < count && !failed; i++) {
        /* The zstandard package's one call (ZstdDecompressor.decompress): a stream whose output holds the
         * frame's bound, which must end the frame. A frame with a declared size is decoded in one pass
         * within it; one without is decoded as a stream is, its window and block limits enforced. */
        zstd_in src = {(const uint8_t *)in.buf + frames[i].start, frames[i].end - frames[i].start, 0};
        zstd_out dst = {out + got, frames[i].bound, 0};
        size_t left = zstd_is_error(zstd_reset(dctx, RESET_SESSION_ONLY)) ? 1 : zstd_stream(dctx, &dst, &src);
        /* A stream decodes through a ring buffer of its window and a little more: once the output is past the
         * window, a match reaching further back than the window reads whatever the buffer held before, and the
         * answer depends on the decoder's history. Within the window it is determined, so beyond it, None. */
        if (zstd_is_error(left) || left != 0 || src.pos != src.size || (frames[i].sized && dst.pos != dst.size) ||
            (!frames[i].sized && dst.pos > frames[i].window))
            failed = 1;
        else
            got += dst.pos;
    }
    if (!mine && dctx != NULL) zstd_free(dctx);
    if (mine) PyThread_release_lock(lock);
    Py_END_ALLOW_THREADS
    if (failed) {
        Py_CLEAR(result);
        goto none;
    }
    if ((size_t)PyBytes_GET_SIZE(result) != got) _PyBytes_Resize(&result, (Py_ssize_t)got);
    goto done;
none:
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(frames);
    PyBuffer_Release(&in);
    return result;
}

static PyObject *available(PyObject *self, PyObject *unused) { return PyBool_FromLong(zstd_library[0] != 0); }

static PyObject *library(PyObject *self, PyObject *unused) {
    if (zstd_library[0] == 0) Py_RETURN_NONE;
    unsigned v = zstd_version();
    return PyUnicode_FromFormat("%s %u.%u.%u", zstd_library, v / 10000, v / 100 % 100, v % 100);
}

#ifdef HAVE_NATIVE_PROOF
typedef struct job {
    group g;
    Py_ssize_t found;
    int done;
    struct job *next;
} job;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t lock;
    pthread_cond_t wake;     /* the worker waits here for a job or stop */
    pthread_cond_t finished; /* result() waits here for its job */
    job *oldest, *newest;    /* submitted and not yet collected, in order */
    job *todo;               /* the first job the worker has not started */
    int stop, started;
    int busy;                /* a method is running (checked and set with the GIL): one caller at a time */
    pid_t owner;             /* the process that started the worker (a forked child has no worker) */
    pthread_t thread;
} ProofThread;

/* With the GIL, at the start of every method: one caller at a time (the methods release the GIL while they
 * wait), and not in a forked child of the process whose thread holds the groups. */
static int enter(ProofThread *self) {
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "a ProofThread is used by one thread at a time");
        return -1;
    }
    if (self->started && self->owner != getpid()) {
        PyErr_SetString(PyExc_RuntimeError, "a ProofThread can not be used in a forked child");
        return -1;
    }
    self->busy = 1;
    return 0;
}

static void *worker(void *arg) {
    ProofThread *self = arg;
    uint8_t *scratch = NULL;
    size_t capacity = 0;
    ZSTD_DCtx *dctx = zstd_create();
    pthread_mutex_lock(&self->lock);
    for (;;) {
        while (self->todo == NULL && !self->stop) pthread_cond_wait(&self->wake, &self->lock);
        if (self->stop) break;
        job *j = self->todo;
        self->todo = j->next;
        pthread_mutex_unlock(&self->lock);
        Py_ssize_t found = dctx == NULL ? NO_MEMORY : group_first_mismatch(&j->g, dctx, &scratch, &capacity);
        pthread_mutex_lock(&self->lock);
        j->found = found;
        j->done = 1;
        pthread_cond_broadcast(&self->finished);
    }
    pthread_mutex_unlock(&self->lock);
    if (dctx != NULL) zstd_free(dctx);
    free(scratch);
    return NULL;
}

static PyObject *thread_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    if ((kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0) || !PyArg_ParseTuple(args, ":ProofThread")) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "ProofThread() takes no arguments");
        return NULL;
    }
    if (check_available() != 0) return NULL;
    ProofThread *self = (ProofThread *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    pthread_mutex_init(&self->lock, NULL);
    pthread_cond_init(&self->wake, NULL);
    pthread_cond_init(&self->finished, NULL);
    return (PyObject *)self;
}

/* Stop the worker (it finishes the group in hand) and drop what was not collected. With the GIL, busy set
 * (or from dealloc). In a forked child there is no worker to stop. */
static void thread_stop(ProofThread *self) {
    int ours = self->started && self->owner == getpid();  /* else no worker here (its lock may be a copy) */
    self->started = 0;
    if (ours) {
        pthread_mutex_lock(&self->lock);
        self->stop = 1;
        pthread_cond_signal(&self->wake);
        pthread_mutex_unlock(&self->lock);
        Py_BEGIN_ALLOW_THREADS
        pthread_join(self->thread, NULL);
        Py_END_ALLOW_THREADS
    }
    self->stop = 1;
    while (self->oldest != NULL) {
        job *j = self->oldest;
        self->oldest = j->next;
        group_release(&j->g);
        PyMem_Free(j);
    }
    self->newest = self->todo = NULL;
}

static PyObject *thread_submit(ProofThread *self, PyObject *args) {
    PyObject *news, *originals;
    if (!PyArg_ParseTuple(args, "OO", &news, &originals) || enter(self) != 0) return NULL;
    PyObject *answer = NULL;
    job *j = NULL;
    if (self->stop) {
        PyErr_SetString(PyExc_RuntimeError, "the proof thread is closed");
        goto out;
    }
    j = PyMem_Calloc(1, sizeof(job));
    if (j == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    if (group_acquire(&j->g, news, originals) != 0) goto out;
    if (!self->started) {
        if (pthread_create(&self->thread, NULL, worker, self) != 0) {
            group_release(&j->g);
            PyErr_SetString(PyExc_RuntimeError, "could not start the proof thread");
            goto out;
        }
        self->started = 1;
        self->owner = getpid();
    }
    pthread_mutex_lock(&self->lock);
    if (self->newest != NULL) self->newest->next = j;
    else self->oldest = j;
    self->newest = j;
    if (self->todo == NULL) self->todo = j;
    pthread_cond_signal(&self->wake);
    pthread_mutex_unlock(&self->lock);
    j = NULL;  /* queued */
    answer = Py_NewRef(Py_None);
out:
    PyMem_Free(j);
    self->busy = 0;
    return answer;
}

static PyObject *thread_result(ProofThread *self, PyObject *unused) {
    if (enter(self) != 0) return NULL;
    job *j = self->oldest;
    if (j == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "no group was submitted and not yet collected");
        self->busy = 0;
        return NULL;
    }
    pthread_mutex_lock(&self->lock);
    int done = j->done;
    pthread_mutex_unlock(&self->lock);
    if (!done) {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&self->lock);
        while (!j->done) pthread_cond_wait(&self->finished, &self->lock);
        pthread_mutex_unlock(&self->lock);
        Py_END_ALLOW_THREADS
    }
    pthread_mutex_lock(&self->lock);
    self->oldest = j->next;
    if (self->newest == j) self->newest = NULL;
    pthread_mutex_unlock(&self->lock);
    Py_ssize_t found = j->found;
    group_release(&j->g);
    PyMem_Free(j);
    self->busy = 0;
    return result_of(found);
}

static PyObject *thread_close(ProofThread *self, PyObject *unused) {
    if (self->busy) {  /* no fork check: closing in a forked child only drops the groups */
        PyErr_SetString(PyExc_RuntimeError, "a ProofThread is used by one thread at a time");
        return NULL;
    }
    self->busy = 1;
    thread_stop(self);
    self->busy = 0;
    Py_RETURN_NONE;
}

static void thread_dealloc(ProofThread *self) {
    thread_stop(self);
    pthread_cond_destroy(&self->finished);
    pthread_cond_destroy(&self->wake);
    pthread_mutex_destroy(&self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef thread_methods[] = {
    {"submit", (PyCFunction)thread_submit, METH_VARARGS,
     "submit(news, originals): hand a group over (the buffers are held until its result is collected)."},
    {"result", (PyCFunction)thread_result, METH_NOARGS,
     "result() -> first mismatching index of the oldest uncollected group, or -1 (waits, GIL released)."},
    {"close", (PyCFunction)thread_close, METH_NOARGS,
     "close(): stop the thread after the group in hand; uncollected groups are dropped."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ProofThreadType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tiering.kafka._proof.ProofThread",
    .tp_basicsize = sizeof(ProofThread),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ProofThread(): zstd groups proven in submission order on a thread that never takes the GIL.",
    .tp_new = thread_new,
    .tp_dealloc = (destructor)thread_dealloc,
    .tp_methods = thread_methods,
};
#endif

static PyMethodDef methods[] = {
    {"available", available, METH_NOARGS, "available() -> whether a libzstd (1.5.6 or later) was loaded."},
    {"library", library, METH_NOARGS, "library() -> the libzstd file and version loaded, or None."},
    {"decompress", decompress, METH_VARARGS,
     "decompress(data, limit) -> a zstd records section decoded, or None where codecs' Python path decides."},
    {"first_mismatch", first_mismatch, METH_VARARGS,
     "first_mismatch(news, originals) -> index of the first zstd batch not decoding to its original, or -1."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_proof", NULL, -1, methods};

PyMODINIT_FUNC PyInit__proof(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
#ifdef HAVE_NATIVE_PROOF
    if (getenv("TIERING_NO_NATIVE_ZSTD") == NULL) load_zstd();
    if (shared_lock == NULL) shared_lock = PyThread_allocate_lock();
    if (PyType_Ready(&ProofThreadType) < 0 || PyModule_AddObjectRef(m, "ProofThread", (PyObject *)&ProofThreadType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#endif
    return m;
}
