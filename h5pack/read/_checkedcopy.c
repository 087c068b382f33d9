/* Copy a batch of mapped raw samples into their rows, each checked against its XXH3-64 as
 * it is copied: one pass over the stored bytes, no Python per sample.
 *
 * See NOTE [ Checked as copied ] in h5pack/read/reader.py, which calls copy() and raises
 * the error that names the sample. Each sample is copied in blocks of BLOCK bytes and each
 * block is hashed from the row just written, while it is still in the core's first-level
 * cache: the mapping (the page cache) is read once, by the copy. XXH3 is xxHash's own code
 * (_xxhash/, BSD 2-Clause): on x86 its dispatcher picks the widest vector unit the CPU has
 * (SSE2, AVX2, AVX-512) at run time, as the xxhash package's build does; elsewhere the
 * compiler's default for the target.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__) || defined(_M_IX86)
/* defines XXH_INLINE_ALL and includes xxhash.h, then the dispatching entry points */
#include "xxh_x86dispatch.c"
#define DIGEST_UPDATE XXH3_64bits_update_dispatch
#else
#define XXH_INLINE_ALL
#include "xxhash.h"
#define DIGEST_UPDATE XXH3_64bits_update
#endif

/* 16 KiB: a block and its copy fit in the first-level cache (measured against 4, 8, 32 and
 * 64 KiB and against whole samples; BENCHMARKS.md "FFCV side by side", run 10). */
#define BLOCK 16384

/* Return the number of int64 (or uint64) items of a buffer, or -1 with TypeError set. */
static Py_ssize_t items64(const Py_buffer *view, const char *what) {
    if (view->len % 8 != 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a buffer of 64-bit integers", what);
        return -1;
    }
    return view->len / 8;
}

PyDoc_STRVAR(copy_doc,
             "copy(source, out, starts, rows, sample_bytes, recorded=None) -> int\n\n"
             "Copy sample k, the sample_bytes bytes of source at starts[k], into row rows[k]\n"
             "of out (sample_bytes bytes each), for every k, checking each sample's XXH3-64\n"
             "against recorded[k] (uint64) as it is copied; no check without recorded.\n"
             "Return the k of the first sample whose digest differs (its row and the rows\n"
             "after it are then not all written), or -1 when all match. starts and rows are\n"
             "int64 buffers. Raises ValueError for a sample or row outside its buffer.");

static PyObject *copy(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer source, out, starts, rows, recorded = {0};
    Py_ssize_t size;
    PyObject *recorded_obj = Py_None;
    if (!PyArg_ParseTuple(args, "y*w*y*y*n|O", &source, &out, &starts, &rows, &size,
                          &recorded_obj))
        return NULL;
    int checked = recorded_obj != Py_None;
    PyObject *result = NULL;
    if (checked && PyObject_GetBuffer(recorded_obj, &recorded, PyBUF_SIMPLE) < 0) {
        checked = 0;
        goto done;
    }
    Py_ssize_t count = items64(&starts, "starts");
    if (count < 0) goto done;
    if (items64(&rows, "rows") != count || (checked && items64(&recorded, "recorded") != count)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "starts, rows and recorded differ in length");
        goto done;
    }
    if (size <= 0) {
        PyErr_SetString(PyExc_ValueError, "sample_bytes must be positive");
        goto done;
    }
    const int64_t *at = starts.buf, *row = rows.buf;
    for (Py_ssize_t k = 0; k < count; k++) {
        if (at[k] < 0 || at[k] > source.len - size || row[k] < 0 || row[k] >= out.len / size) {
            PyErr_Format(PyExc_ValueError,
                         "sample %zd (start %lld, row %lld) is outside its buffer", k,
                         (long long)at[k], (long long)row[k]);
            goto done;
        }
    }
    const char *from = source.buf;
    char *into = out.buf;
    const uint64_t *expected = checked ? recorded.buf : NULL;
    Py_ssize_t bad = -1;
    if (!checked) {
        Py_BEGIN_ALLOW_THREADS;
        for (Py_ssize_t k = 0; k < count; k++) memcpy(into + row[k] * size, from + at[k], size);
        Py_END_ALLOW_THREADS;
        result = PyLong_FromSsize_t(bad);
        goto done;
    }
    XXH3_state_t *state = XXH3_createState();
    if (state == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t k = 0; k < count && bad < 0; k++) {
        const char *sample = from + at[k];
        char *target = into + row[k] * size;
        XXH3_64bits_reset(state);
        for (Py_ssize_t done_bytes = 0; done_bytes < size; done_bytes += BLOCK) {
            size_t n = (size_t)(size - done_bytes < BLOCK ? size - done_bytes : BLOCK);
            memcpy(target + done_bytes, sample + done_bytes, n);
            DIGEST_UPDATE(state, target + done_bytes, n);
        }
        if (XXH3_64bits_digest(state) != expected[k]) bad = k;
    }
    Py_END_ALLOW_THREADS;
    XXH3_freeState(state);
    result = PyLong_FromSsize_t(bad);
done:
    PyBuffer_Release(&source);
    PyBuffer_Release(&out);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&rows);
    if (checked) PyBuffer_Release(&recorded);
    return result;
}

PyDoc_STRVAR(digest_doc, "digest(data) -> int\n\nThe XXH3-64 (seed 0) of a buffer's bytes.");

static PyObject *digest(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer data;
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) < 0) return NULL;
    XXH3_state_t *state = XXH3_createState();
    if (state == NULL) {
        PyBuffer_Release(&data);
        return PyErr_NoMemory();
    }
    XXH3_64bits_reset(state);
    DIGEST_UPDATE(state, data.buf, (size_t)data.len);
    uint64_t value = XXH3_64bits_digest(state);
    XXH3_freeState(state);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLongLong(value);
}

static PyMethodDef methods[] = {
    {"copy", copy, METH_VARARGS, copy_doc},
    {"digest", digest, METH_O, digest_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_checkedcopy",
    "Raw samples copied and checked in one pass (NOTE [ Checked as copied ]).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__checkedcopy(void) { return PyModule_Create(&module); }
