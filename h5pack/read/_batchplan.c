/* The first PCG64 outputs of each sample's generator, for a whole batch at once.
 *
 * The C half of h5pack/read/batchplan.py (NOTE [ Planning a batch at once ]): for each index
 * i, the stream of read.boxes.sample_rng(seed, epoch, i), which is numpy's
 * PCG64(SeedSequence(entropy)), entropy being the 32-bit words of the seed, the epoch, the
 * index and the crop tag. This computes what read.boxes.pcg64_states and numpy's
 * random_raw compute (SeedSequence's hashmix/mix pool of 4 words, generate_state(4, uint64),
 * PCG64's seeding, then its steps and XSL-RR outputs), without a Python object per sample;
 * tests/test_batchplan.py checks it against them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

typedef unsigned __int128 u128;

#define INIT_A 0x43B0D7E5u
#define MULT_A 0x931E8875u
#define INIT_B 0x8B51F9DDu
#define MULT_B 0x58F38DEDu
#define MIX_L 0xCA01F9DDu
#define MIX_R 0x4973F715u
#define POOL 4
#define MAX_WORDS 16

static inline uint32_t hashmix(uint32_t value, uint32_t *hash_const) {
    value ^= *hash_const;
    *hash_const *= MULT_A;
    value *= *hash_const;
    return value ^ (value >> 16);
}

static inline uint32_t mix(uint32_t x, uint32_t y) {
    uint32_t result = x * MIX_L - y * MIX_R;
    return result ^ (result >> 16);
}

static inline uint64_t xsl_rr(u128 state) {
    uint64_t xored = (uint64_t)(state >> 64) ^ (uint64_t)state;
    unsigned rot = (unsigned)(state >> 122);
    return (xored >> rot) | (xored << ((64 - rot) & 63));
}

/* raw_outputs(prefix, indices, suffix, out): out[j, :] = the first out.shape[1] outputs of
 * PCG64(SeedSequence(prefix + [indices[j]] + suffix)); prefix and suffix uint32 words,
 * indices int64 values in [0, 2**32), out a C-contiguous uint64 (len(indices), n) buffer. */
static PyObject *batchplan_raw_outputs(PyObject *self, PyObject *args) {
    Py_buffer prefix, indices, suffix, out;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*y*w*", &prefix, &indices, &suffix, &out)) return NULL;
    size_t n_prefix = (size_t)prefix.len / 4, n_suffix = (size_t)suffix.len / 4;
    size_t count = (size_t)indices.len / 8;
    size_t n_raw = count ? (size_t)out.len / 8 / count : 0;
    const char *problem = NULL;
    if (n_prefix + 1 + n_suffix > MAX_WORDS)
        problem = "too many entropy words";
    else if (count && (size_t)out.len != count * n_raw * 8)
        problem = "out must hold len(indices) * n uint64 values";
    const int64_t *idx = (const int64_t *)indices.buf;
    for (size_t j = 0; problem == NULL && j < count; j++)
        if (idx[j] < 0 || idx[j] > 0xFFFFFFFFLL) problem = "indices must be in [0, 2**32)";
    if (problem != NULL) {
        PyBuffer_Release(&prefix);
        PyBuffer_Release(&indices);
        PyBuffer_Release(&suffix);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    const u128 mult = ((u128)2549297995355413924ULL << 64) | 4865540595714422341ULL;
    uint32_t entropy[MAX_WORDS];
    memcpy(entropy, prefix.buf, n_prefix * 4);
    memcpy(entropy + n_prefix + 1, suffix.buf, n_suffix * 4);
    size_t n_words = n_prefix + 1 + n_suffix;
    uint64_t *result = (uint64_t *)out.buf;
    Py_BEGIN_ALLOW_THREADS;
    for (size_t j = 0; j < count; j++) {
        entropy[n_prefix] = (uint32_t)idx[j];
        uint32_t hash_const = INIT_A, pool[POOL];
        for (size_t i = 0; i < POOL; i++) pool[i] = hashmix(i < n_words ? entropy[i] : 0, &hash_const);
        for (size_t src = 0; src < POOL; src++)
            for (size_t dst = 0; dst < POOL; dst++)
                if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], &hash_const));
        for (size_t src = POOL; src < n_words; src++)
            for (size_t dst = 0; dst < POOL; dst++)
                pool[dst] = mix(pool[dst], hashmix(entropy[src], &hash_const));
        uint32_t words[2 * POOL];
        hash_const = INIT_B;
        for (size_t i = 0; i < 2 * POOL; i++) {
            uint32_t value = pool[i % POOL] ^ hash_const;
            hash_const *= MULT_B;
            value *= hash_const;
            words[i] = value ^ (value >> 16);
        }
        uint64_t w[4];
        for (size_t k = 0; k < 4; k++) w[k] = (uint64_t)words[2 * k] | ((uint64_t)words[2 * k + 1] << 32);
        u128 inc = ((((u128)w[2] << 64) | w[3]) << 1) | 1;
        u128 state = inc + (((u128)w[0] << 64) | w[1]); /* state 0, one step, plus initstate */
        state = state * mult + inc;
        for (size_t r = 0; r < n_raw; r++) {
            state = state * mult + inc;
            result[j * n_raw + r] = xsl_rr(state);
        }
    }
    Py_END_ALLOW_THREADS;
    PyBuffer_Release(&prefix);
    PyBuffer_Release(&indices);
    PyBuffer_Release(&suffix);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"raw_outputs", batchplan_raw_outputs, METH_VARARGS,
     "raw_outputs(prefix, indices, suffix, out): each sample's first PCG64 outputs."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_batchplan", "The first PCG64 outputs of a batch's generators.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__batchplan(void) { return PyModule_Create(&module); }
