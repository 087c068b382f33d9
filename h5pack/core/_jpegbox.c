/* Decode only a box of a JPEG: libjpeg's scanline API (jpeg_crop_scanline and
 * jpeg_skip_scanlines), the same decoder and pixels as a whole decode's box.
 *
 * See NOTE [ Decoding only the box ] in h5pack/core/jpegbox.py, which loads the library this
 * module calls (load()) and checks what this module returns. libjpeg is not linked at build
 * time: load(path) opens the libjpeg-turbo that Pillow (a dependency) already ships, or the
 * system's, and takes its functions by name, so building this needs only a C compiler, the
 * Python headers and the libjpeg headers kept beside this file (_libjpeg/).
 *
 * Errors: libjpeg's error_exit jumps back here (setjmp/longjmp, as libjpeg's own example
 * does); nothing is printed. Input that runs out (a truncated file) fails rather than being
 * padded. Warnings (corrupt data libjpeg recovers from) are counted, not printed, and the
 * decode goes on; the caller declines a decode that had any.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jpeglib.h"

/* The functions taken from the loaded library, by their libjpeg names. */
static struct {
    struct jpeg_error_mgr *(*std_error)(struct jpeg_error_mgr *);
    void (*create_decompress)(j_decompress_ptr, int, size_t);
    void (*destroy_decompress)(j_decompress_ptr);
    int (*read_header)(j_decompress_ptr, boolean);
    boolean (*start_decompress)(j_decompress_ptr);
    void (*crop_scanline)(j_decompress_ptr, JDIMENSION *, JDIMENSION *);
    JDIMENSION (*skip_scanlines)(j_decompress_ptr, JDIMENSION);
    JDIMENSION (*read_scanlines)(j_decompress_ptr, JSAMPARRAY, JDIMENSION);
    boolean (*resync_to_restart)(j_decompress_ptr, int);
} lib;
static void *lib_handle = NULL;

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int warnings;
    char message[JMSG_LENGTH_MAX];
} error_mgr;

static void on_error(j_common_ptr cinfo) {
    error_mgr *err = (error_mgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0) ((error_mgr *)cinfo->err)->warnings++;
}

/* A source over the whole file in memory that fails when the data runs out. */
static void src_init(j_decompress_ptr cinfo) { (void)cinfo; }
static void src_term(j_decompress_ptr cinfo) { (void)cinfo; }

static boolean src_fill(j_decompress_ptr cinfo) {
    /* Every byte was given at once: asking for more means the file is truncated. */
    error_mgr *err = (error_mgr *)cinfo->err;
    snprintf(err->message, sizeof err->message, "the data ends before the image does");
    longjmp(err->jump, 1);
    return FALSE;
}

static void src_skip(j_decompress_ptr cinfo, long count) {
    struct jpeg_source_mgr *src = cinfo->src;
    if (count <= 0) return;
    if ((size_t)count > src->bytes_in_buffer) src_fill(cinfo);
    src->next_input_byte += count;
    src->bytes_in_buffer -= (size_t)count;
}

static const char *symbol_names[] = {
    "jpeg_std_error",       "jpeg_CreateDecompress", "jpeg_destroy_decompress",
    "jpeg_read_header",     "jpeg_start_decompress", "jpeg_crop_scanline",
    "jpeg_skip_scanlines",  "jpeg_read_scanlines",   "jpeg_resync_to_restart",
};

static PyObject *jpegbox_load(PyObject *self, PyObject *args) {
    const char *path;
    (void)self;
    if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        PyErr_Format(PyExc_OSError, "cannot open %s: %s", path, dlerror());
        return NULL;
    }
    void **slots = (void **)&lib;
    size_t count = sizeof symbol_names / sizeof symbol_names[0];
    void *found[sizeof symbol_names / sizeof symbol_names[0]];
    for (size_t i = 0; i < count; i++) {
        found[i] = dlsym(handle, symbol_names[i]);
        if (found[i] == NULL) {
            PyErr_Format(PyExc_OSError, "%s has no %s", path, symbol_names[i]);
            dlclose(handle);
            return NULL;
        }
    }
    /* The library must take this header's decompressor: CreateDecompress checks the
     * version and the struct's size, and fails through error_exit if they differ. */
    struct jpeg_decompress_struct cinfo;
    error_mgr err;
    struct jpeg_error_mgr *(*std_error)(struct jpeg_error_mgr *) = found[0];
    void (*create)(j_decompress_ptr, int, size_t) = found[1];
    void (*destroy)(j_decompress_ptr) = found[2];
    cinfo.err = std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    if (setjmp(err.jump)) {
        PyErr_Format(PyExc_OSError, "%s does not take this decompressor: %s", path, err.message);
        dlclose(handle);
        return NULL;
    }
    create(&cinfo, JPEG_LIB_VERSION, sizeof cinfo);
    destroy(&cinfo);
    for (size_t i = 0; i < count; i++) slots[i] = found[i];
    lib_handle = handle; /* kept open for the life of the process */
    Py_RETURN_NONE;
}

/* decode_box(data, image_height, image_width, top, left, height, width, channels, out,
 *            reduction=1, canvas=0) -> (status, warnings)
 *
 * Decodes rows [top, top + height) and columns [left, left + width) of the JPEG `data`,
 * whose header must say image_height x image_width, decoded at 1 / reduction of its size
 * (libjpeg's DCT scaling: 1, 2, 4 or 8; the box is in the reduced image's pixels, whose
 * sides are the stored ones divided by `reduction`, rounded up), into the first height * width *
 * channels bytes of `out` (RGB for 3 channels, gray for 1), a writable C-contiguous buffer
 * of at least (height + 1) * min(width + 64, image_width) * channels bytes: libjpeg writes
 * each row of the widened region straight into it, and the box's rows are moved to the
 * front at the end. (A separate row buffer that each row is copied out of cost ~25% more
 * CPU per whole decode, measured here and in a plain C program.) With `canvas` set, `out`
 * is instead the whole (reduced) image, out_height x out_width x channels, and the decoded
 * region's pixels are written where they are in the image, the rest left as it was.
 * status: 0 done; 1 not a JPEG this decodes (other components or colour space: the caller
 * decodes it otherwise); 2 another size, or the box is outside the image; 3 libjpeg failed
 * (the caller's whole decode then raises its own error); 4 `out` is too small. warnings:
 * libjpeg's, for corrupt data it recovered from.
 */
/* The reduced image's sides: the stored ones divided by `reduction`, rounded up (libjpeg's
 * output size at that scale before any crop). */
static JDIMENSION image_rows(j_decompress_ptr cinfo, unsigned int reduction) {
    return (cinfo->image_height + reduction - 1) / reduction;
}

static JDIMENSION image_columns(j_decompress_ptr cinfo, unsigned int reduction) {
    return (cinfo->image_width + reduction - 1) / reduction;
}

static PyObject *jpegbox_decode_box(PyObject *self, PyObject *args) {
    Py_buffer data, out;
    unsigned int image_height, image_width, top, left, height, width, channels;
    unsigned int reduction = 1;
    int canvas = 0;
    (void)self;
    if (lib_handle == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "no libjpeg loaded: call load(path) first");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "y*IIIIIIIw*|Ip", &data, &image_height, &image_width, &top,
                          &left, &height, &width, &channels, &out, &reduction, &canvas))
        return NULL;
    int status = 0;
    int warnings = 0;
    if ((channels != 1 && channels != 3) || height == 0 || width == 0 ||
        (reduction != 1 && reduction != 2 && reduction != 4 && reduction != 8)) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError,
                        "channels must be 1 or 3, the box not empty, reduction 1, 2, 4 or 8");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS;
    struct jpeg_decompress_struct cinfo;
    error_mgr err;
    struct jpeg_source_mgr src;
    cinfo.err = lib.std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    err.warnings = 0;
    volatile int created = 0;
    if (setjmp(err.jump)) {
        status = 3;
        goto done;
    }
    lib.create_decompress(&cinfo, JPEG_LIB_VERSION, sizeof cinfo);
    created = 1;
    src.next_input_byte = (const JOCTET *)data.buf;
    src.bytes_in_buffer = (size_t)data.len;
    src.init_source = src_init;
    src.fill_input_buffer = src_fill;
    src.skip_input_data = src_skip;
    src.resync_to_restart = lib.resync_to_restart;
    src.term_source = src_term;
    cinfo.src = &src;
    lib.read_header(&cinfo, TRUE);
    if (channels == 3 ? !(cinfo.num_components == 3 && (cinfo.jpeg_color_space == JCS_YCbCr ||
                                                         cinfo.jpeg_color_space == JCS_RGB))
                      : !(cinfo.num_components == 1 && cinfo.jpeg_color_space == JCS_GRAYSCALE)) {
        status = 1;
        goto done;
    }
    if (cinfo.image_height != image_height || cinfo.image_width != image_width) {
        status = 2;
        goto done;
    }
    cinfo.out_color_space = channels == 3 ? JCS_RGB : JCS_GRAYSCALE;
    cinfo.scale_num = 1;
    cinfo.scale_denom = reduction;
    lib.start_decompress(&cinfo);
    if ((unsigned long)top + height > cinfo.output_height ||
        (unsigned long)left + width > cinfo.output_width) {
        status = 2;
        goto done;
    }
    /* One column of margin on each side where the image goes on: the upsampler treats the
     * cropped region's edges as the image's, so their columns may differ from a whole
     * decode's; the columns inside do not. */
    JDIMENSION x = left > 0 ? left - 1 : 0;
    JDIMENSION end = left + width < cinfo.output_width ? left + width + 1 : left + width;
    JDIMENSION span = end - x;
    if (x > 0 || span < cinfo.output_width) lib.crop_scanline(&cinfo, &x, &span);
    /* Likewise one row above, decoded and dropped. */
    JDIMENSION first = top > 0 ? top - 1 : 0;
    size_t stride = (size_t)cinfo.output_width * channels;
    size_t offset = (size_t)(left - x) * channels;
    size_t row_bytes = (size_t)width * channels;
    JSAMPLE *base = (JSAMPLE *)out.buf;
    size_t room = (size_t)(top + height - first) * stride;
    if (canvas) { /* the image's own rows, the region at its place in them */
        stride = (size_t)image_columns(&cinfo, reduction) * channels;
        room = (size_t)image_rows(&cinfo, reduction) * stride;
        base += (size_t)first * stride + (size_t)x * channels;
    }
    if ((size_t)out.len < room) {
        status = 4;
        goto done;
    }
    if (first > 0 && lib.skip_scanlines(&cinfo, first) != first) {
        status = 3;
        goto done;
    }
    for (JDIMENSION y = first; y < top + height; y++) {
        JSAMPROW row = base + (size_t)(y - first) * stride;
        if (lib.read_scanlines(&cinfo, &row, 1) != 1) {
            status = 3;
            goto done;
        }
    }
    /* The box's rows to the front, in order: each moves to an address at or before its own. */
    if (!canvas && (offset != 0 || stride != row_bytes || first != top))
        for (JDIMENSION r = 0; r < height; r++)
            memmove(base + (size_t)r * row_bytes,
                    base + (size_t)(r + top - first) * stride + offset, row_bytes);
done:
    warnings = err.warnings;
    if (created) lib.destroy_decompress(&cinfo); /* also ends an unfinished decode */
    Py_END_ALLOW_THREADS;
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    return Py_BuildValue("ii", status, warnings);
}

static PyMethodDef methods[] = {
    {"load", jpegbox_load, METH_VARARGS,
     "load(path): take libjpeg's functions from the shared library at path."},
    {"decode_box", jpegbox_decode_box, METH_VARARGS,
     "decode_box(data, image_height, image_width, top, left, height, width, channels, out,"
     " reduction=1, canvas=False) -> (status, warnings)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jpegbox", "Decode only a box of a JPEG (libjpeg's scanline API).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__jpegbox(void) { return PyModule_Create(&module); }
