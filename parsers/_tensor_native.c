/* One-pass statistics of F32/BF16/F16 bit patterns: the compiled kernel behind parsers._tensor_kernels.reduce_bits.
 *
 * Built by setup.py as the optional top-level module `_forensics_tensor_kernels` (where no compiler is found the
 * install goes on and reduce_bits keeps its numpy/numkong path). One call reads a block of raw patterns once and
 * returns what reduce_bits accumulates: the largest finite masked pattern, the zero, inf and NaN counts, the
 * Adam-epsilon counts and the sum of the squares of the finite values.
 *
 * The sum of squares. Every finite value is an exact float32 (BF16: its pattern << 16; F16: its masked pattern << 13,
 * which is |x| * 2**-112, exact also for subnormals; F32 itself), converted to float64, where its square is exact
 * (at most 48 significant bits). The squares are added in float64 in a fixed order that does not depend on the CPU:
 * element i of each full group of LANES goes to lane i % LANES (one rounding per addition, as numkong's and BLAS's
 * float64 accumulators), the lanes are then added in order 0..LANES-1, then the elements after the last full group
 * one by one. Non-finite elements add +0.0 (which changes no sum). F16 sums are scaled by 2**224 by the caller
 * (exact: a power of two). The AVX-512 and the portable loop give the same bits (tests/test_checkpoints.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define LANES 32

typedef struct {
    uint64_t top_plus1; /* largest finite masked pattern + 1 (0: no finite element) */
    uint64_t n_zero, n_inf, n_nan, n_pos, n_small;
    double lanes[LANES];
    double tail;
} result_t;

static inline float as_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The lane of element i % 32 for 16-bit patterns: the order in which the vector loop's unpack of 32 patterns into two
 * registers of 16 float32 (per 128-bit part: patterns 0-3 to the first, 4-7 to the second) hands them to its four
 * float64 accumulators of 8 lanes. */
static const uint8_t LANE16[LANES] = {0,  1,  2,  3,  16, 17, 18, 19, 4,  5,  6,  7,  20, 21, 22, 23,
                                      8,  9,  10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};

/* Portable loops (any CPU), element by element. */
static void reduce16_portable(const uint16_t *p, size_t n, uint32_t mask, uint32_t inf, int shift, int64_t small,
                              result_t *r) {
    uint32_t top = 0, any_fin = 0;
    uint64_t zeros = 0, ninf = 0, nnan = 0, pos = 0, nsmall = 0;
    size_t i = 0, full = n - n % LANES;
    for (; i < n; i++) {
        uint32_t b = p[i], a = b & mask;
        int fin = a < inf;
        zeros += a == 0;
        ninf += a == inf;
        nnan += a > inf;
        if (fin) {
            any_fin = 1;
            if (a > top) top = a;
        }
        if (small >= 0) {
            uint32_t t = (uint16_t)(b - 1);
            pos += t < inf;
            nsmall += (int64_t)t < small;
        }
        double d = fin ? (double)as_f32(a << shift) : 0.0;
        if (i < full)
            r->lanes[LANE16[i % LANES]] += d * d;
        else
            r->tail += d * d;
    }
    r->top_plus1 = any_fin ? (uint64_t)top + 1 : 0;
    r->n_zero = zeros, r->n_inf = ninf, r->n_nan = nnan, r->n_pos = pos, r->n_small = nsmall;
}

static void reduce32_portable(const uint32_t *p, size_t n, int64_t small, result_t *r) {
    const uint32_t mask = 0x7FFFFFFFu, inf = 0x7F800000u;
    uint32_t top = 0, any_fin = 0;
    uint64_t zeros = 0, ninf = 0, nnan = 0, pos = 0, nsmall = 0;
    size_t i = 0, full = n - n % LANES;
    for (; i < n; i++) {
        uint32_t b = p[i], a = b & mask;
        int fin = a < inf;
        zeros += a == 0;
        ninf += a == inf;
        nnan += a > inf;
        if (fin) {
            any_fin = 1;
            if (a > top) top = a;
        }
        if (small >= 0) {
            uint32_t t = b - 1;
            pos += t < inf;
            nsmall += (int64_t)t < small;
        }
        double d = fin ? (double)as_f32(a) : 0.0;
        if (i < full)
            r->lanes[i % LANES] += d * d;
        else
            r->tail += d * d;
    }
    r->top_plus1 = any_fin ? (uint64_t)top + 1 : 0;
    r->n_zero = zeros, r->n_inf = ninf, r->n_nan = nnan, r->n_pos = pos, r->n_small = nsmall;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_AVX512 1

/* Squares of 16 float32 (one zmm) into two float64 accumulators of 8 lanes each. */
#define SQ16(F, A, B)                                                                                           \
    do {                                                                                                        \
        __m512d lo_ = _mm512_cvtps_pd(_mm512_castps512_ps256(F));                                               \
        __m512d hi_ = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(F), 1)));        \
        A = _mm512_fmadd_pd(lo_, lo_, A);                                                                       \
        B = _mm512_fmadd_pd(hi_, hi_, B);                                                                       \
    } while (0)

/* Zero counts per 16-bit lane, added to a uint64 every FLUSH iterations (a lane adds at most one per iteration). */
#define FLUSH 32768

__attribute__((target("avx512f,avx512bw"))) static uint64_t sum_epu16(__m512i v) {
    uint16_t t[32];
    uint64_t s = 0;
    _mm512_storeu_si512((void *)t, v);
    for (int j = 0; j < 32; j++) s += t[j];
    return s;
}

/* The 16-bit vector loop. masked = 0: assumes every pattern finite (the max tells afterwards whether one was not, and
 * then the block is reduced again with masked = 1, which zeroes the non-finite ones and counts them). */
__attribute__((target("avx512f,avx512bw"), always_inline)) static inline void reduce16_loop(
    const uint16_t *p, size_t full, uint32_t mask, uint32_t inf, int shift, int64_t small, int masked, result_t *r,
    uint32_t *top_out, int *fin_seen_out) {
    __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    const __m512i vmask = _mm512_set1_epi16((short)mask), vinf = _mm512_set1_epi16((short)inf);
    const __m512i one = _mm512_set1_epi16(1), zero = _mm512_setzero_si512();
    const __m512i vsmall = _mm512_set1_epi16((short)(small > 0xFFFF ? 0xFFFF : small < 0 ? 0 : small));
    const __m128i down = _mm_cvtsi32_si128(16 - shift);
    __m512i vtop = zero, zc = zero, pc = zero, sc = zero, ic = zero, nc = zero;
    __mmask32 fin_seen = 0;
    uint64_t zeros = 0, pos = 0, nsmall = 0, ninf = 0, nnan = 0;
    size_t it = 0;
    for (size_t i = 0; i < full; i += LANES) {
        __m512i b = _mm512_loadu_si512((const void *)(p + i)), a = _mm512_and_si512(b, vmask);
        zc = _mm512_mask_add_epi16(zc, _mm512_testn_epi16_mask(a, a), zc, one);
        if (masked) {
            __mmask32 fin = _mm512_cmplt_epu16_mask(a, vinf);
            fin_seen |= fin;
            ic = _mm512_mask_add_epi16(ic, _mm512_cmpeq_epi16_mask(a, vinf), ic, one);
            nc = _mm512_mask_add_epi16(nc, _mm512_cmpgt_epu16_mask(a, vinf), nc, one);
            a = _mm512_maskz_mov_epi16(fin, a); /* non-finite -> +0 */
        }
        vtop = _mm512_max_epu16(vtop, a);
        if (small >= 0) { /* patterns - 1: the positive ones become 0 .. inf - 1, +-0 and negatives wrap above */
            __m512i t = _mm512_sub_epi16(b, one);
            pc = _mm512_mask_add_epi16(pc, _mm512_cmplt_epu16_mask(t, vinf), pc, one);
            sc = _mm512_mask_add_epi16(sc, _mm512_cmplt_epu16_mask(t, vsmall), sc, one);
        }
        __m512i lo = _mm512_unpacklo_epi16(zero, a), hi = _mm512_unpackhi_epi16(zero, a); /* pattern << 16 */
        if (shift != 16) lo = _mm512_srl_epi32(lo, down), hi = _mm512_srl_epi32(hi, down);
        __m512 flo = _mm512_castsi512_ps(lo), fhi = _mm512_castsi512_ps(hi);
        SQ16(flo, a0, a1);
        SQ16(fhi, a2, a3);
        if (++it == FLUSH) {
            zeros += sum_epu16(zc), pos += sum_epu16(pc), nsmall += sum_epu16(sc);
            ninf += sum_epu16(ic), nnan += sum_epu16(nc);
            zc = pc = sc = ic = nc = zero, it = 0;
        }
    }
    zeros += sum_epu16(zc), pos += sum_epu16(pc), nsmall += sum_epu16(sc), ninf += sum_epu16(ic);
    nnan += sum_epu16(nc);
    double l[LANES];
    _mm512_storeu_pd(l, a0), _mm512_storeu_pd(l + 8, a1), _mm512_storeu_pd(l + 16, a2), _mm512_storeu_pd(l + 24, a3);
    for (int j = 0; j < LANES; j++) r->lanes[j] = l[j];
    uint16_t t16[LANES];
    _mm512_storeu_si512((void *)t16, vtop);
    uint32_t top = 0;
    for (int j = 0; j < LANES; j++)
        if (t16[j] > top) top = t16[j];
    *top_out = top;
    *fin_seen_out = masked ? fin_seen != 0 : full > 0;
    r->n_zero = zeros, r->n_inf = ninf, r->n_nan = nnan, r->n_pos = pos, r->n_small = nsmall;
}

__attribute__((target("avx512f,avx512bw"))) static void reduce16_avx512(const uint16_t *p, size_t n, uint32_t mask,
                                                                         uint32_t inf, int shift, int64_t small,
                                                                         result_t *r) {
    size_t full = n - n % LANES;
    uint32_t top;
    int fin_seen;
    reduce16_loop(p, full, mask, inf, shift, small, 0, r, &top, &fin_seen);
    if (top >= inf) { /* a NaN or inf among them: again, masked */
        memset(r, 0, sizeof *r);
        reduce16_loop(p, full, mask, inf, shift, small, 1, r, &top, &fin_seen);
    }
    result_t rest;
    memset(&rest, 0, sizeof rest);
    reduce16_portable(p + full, n - full, mask, inf, shift, small, &rest);
    r->tail = rest.tail;
    if (rest.top_plus1 && rest.top_plus1 - 1 > top) top = (uint32_t)(rest.top_plus1 - 1);
    r->top_plus1 = (fin_seen || rest.top_plus1) ? (uint64_t)top + 1 : 0;
    r->n_zero += rest.n_zero, r->n_inf += rest.n_inf, r->n_nan += rest.n_nan;
    r->n_pos += rest.n_pos, r->n_small += rest.n_small;
}

__attribute__((target("avx512f"))) static uint64_t sum_epu32(__m512i v) {
    uint32_t t[16];
    uint64_t s = 0;
    _mm512_storeu_si512((void *)t, v);
    for (int j = 0; j < 16; j++) s += t[j];
    return s;
}

/* The 32-bit vector loop, masked as reduce16_loop. */
__attribute__((target("avx512f,avx512bw"), always_inline)) static inline void reduce32_loop(
    const uint32_t *p, size_t full, int64_t small, int masked, result_t *r, uint32_t *top_out, int *fin_seen_out) {
    __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    const __m512i vmask = _mm512_set1_epi32(0x7FFFFFFF), vinf = _mm512_set1_epi32(0x7F800000);
    const __m512i one = _mm512_set1_epi32(1), zero = _mm512_setzero_si512();
    const __m512i vsmall = _mm512_set1_epi32((int)(small > 0xFFFFFFFFLL ? 0xFFFFFFFFu : small < 0 ? 0u : (uint32_t)small));
    __m512i vtop = zero, zc = zero, pc = zero, sc = zero, ic = zero, nc = zero;
    __mmask16 fin_seen = 0;
    for (size_t i = 0; i < full; i += LANES) {
        __m512i bx = _mm512_loadu_si512((const void *)(p + i)), by = _mm512_loadu_si512((const void *)(p + i + 16));
        __m512i x = _mm512_and_si512(bx, vmask), y = _mm512_and_si512(by, vmask);
        zc = _mm512_mask_add_epi32(zc, _mm512_testn_epi32_mask(x, x), zc, one);
        zc = _mm512_mask_add_epi32(zc, _mm512_testn_epi32_mask(y, y), zc, one);
        if (masked) {
            __mmask16 fx = _mm512_cmplt_epu32_mask(x, vinf), fy = _mm512_cmplt_epu32_mask(y, vinf);
            fin_seen |= fx | fy;
            ic = _mm512_mask_add_epi32(ic, _mm512_cmpeq_epi32_mask(x, vinf), ic, one);
            ic = _mm512_mask_add_epi32(ic, _mm512_cmpeq_epi32_mask(y, vinf), ic, one);
            nc = _mm512_mask_add_epi32(nc, _mm512_cmpgt_epu32_mask(x, vinf), nc, one);
            nc = _mm512_mask_add_epi32(nc, _mm512_cmpgt_epu32_mask(y, vinf), nc, one);
            x = _mm512_maskz_mov_epi32(fx, x);
            y = _mm512_maskz_mov_epi32(fy, y);
        }
        vtop = _mm512_max_epu32(vtop, _mm512_max_epu32(x, y));
        if (small >= 0) {
            __m512i tx = _mm512_sub_epi32(bx, one), ty = _mm512_sub_epi32(by, one);
            pc = _mm512_mask_add_epi32(pc, _mm512_cmplt_epu32_mask(tx, vinf), pc, one);
            pc = _mm512_mask_add_epi32(pc, _mm512_cmplt_epu32_mask(ty, vinf), pc, one);
            sc = _mm512_mask_add_epi32(sc, _mm512_cmplt_epu32_mask(tx, vsmall), sc, one);
            sc = _mm512_mask_add_epi32(sc, _mm512_cmplt_epu32_mask(ty, vsmall), sc, one);
        }
        __m512 f = _mm512_castsi512_ps(x), g = _mm512_castsi512_ps(y);
        SQ16(f, a0, a1);
        SQ16(g, a2, a3);
    }
    double l[LANES];
    _mm512_storeu_pd(l, a0), _mm512_storeu_pd(l + 8, a1), _mm512_storeu_pd(l + 16, a2), _mm512_storeu_pd(l + 24, a3);
    for (int j = 0; j < LANES; j++) r->lanes[j] = l[j];
    uint32_t t32[16];
    _mm512_storeu_si512((void *)t32, vtop);
    uint32_t top = 0;
    for (int j = 0; j < 16; j++)
        if (t32[j] > top) top = t32[j];
    *top_out = top;
    *fin_seen_out = masked ? fin_seen != 0 : full > 0;
    r->n_zero = sum_epu32(zc), r->n_inf = sum_epu32(ic), r->n_nan = sum_epu32(nc);
    r->n_pos = sum_epu32(pc), r->n_small = sum_epu32(sc);
}

__attribute__((target("avx512f,avx512bw"))) static void reduce32_avx512(const uint32_t *p, size_t n, int64_t small,
                                                                         result_t *r) {
    size_t full = n - n % LANES;
    uint32_t top;
    int fin_seen;
    reduce32_loop(p, full, small, 0, r, &top, &fin_seen);
    if (top >= 0x7F800000u) {
        memset(r, 0, sizeof *r);
        reduce32_loop(p, full, small, 1, r, &top, &fin_seen);
    }
    result_t rest;
    memset(&rest, 0, sizeof rest);
    reduce32_portable(p + full, n - full, small, &rest);
    r->tail = rest.tail;
    if (rest.top_plus1 && rest.top_plus1 - 1 > top) top = (uint32_t)(rest.top_plus1 - 1);
    r->top_plus1 = (fin_seen || rest.top_plus1) ? (uint64_t)top + 1 : 0;
    r->n_zero += rest.n_zero, r->n_inf += rest.n_inf, r->n_nan += rest.n_nan;
    r->n_pos += rest.n_pos, r->n_small += rest.n_small;
}
#endif

static int use_avx512 = 0;

/* reduce(patterns, itemsize, mask, inf, shift, small, portable) ->
 *     (top, n_zero, n_inf, n_nan, n_pos, n_small, sumsq)
 * patterns: a C-contiguous buffer of uint16 (itemsize 2) or uint32 (itemsize 4) patterns as stored (little-endian);
 * top: the largest finite masked pattern, -1 when nothing finite; small: the Adam-epsilon pattern, -1 for none (then
 * n_pos and n_small are 0); portable: 1 forces the portable loop (tests). The GIL is released while it runs. */
static PyObject *reduce(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buf;
    int itemsize, shift, portable;
    unsigned int mask, inf;
    long long small;
    if (!PyArg_ParseTuple(args, "y*iIIiLp", &buf, &itemsize, &mask, &inf, &shift, &small, &portable)) return NULL;
    if ((itemsize != 2 && itemsize != 4) || buf.len % itemsize || shift < 0 || shift > 16 || small < -1 ||
        small >= (itemsize == 2 ? 0x10000LL : 0x100000000LL) ||
        (itemsize == 4 && (mask != 0x7FFFFFFFu || inf != 0x7F800000u || shift != 0))) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "reduce: unsupported pattern layout");
        return NULL;
    }
    size_t n = (size_t)buf.len / (size_t)itemsize;
    result_t r;
    memset(&r, 0, sizeof r);
    Py_BEGIN_ALLOW_THREADS
#ifdef HAVE_AVX512
    if (use_avx512 && !portable) {
        if (itemsize == 2)
            reduce16_avx512((const uint16_t *)buf.buf, n, mask, inf, shift, small, &r);
        else
            reduce32_avx512((const uint32_t *)buf.buf, n, small, &r);
    } else
#endif
    if (itemsize == 2)
        reduce16_portable((const uint16_t *)buf.buf, n, mask, inf, shift, small, &r);
    else
        reduce32_portable((const uint32_t *)buf.buf, n, small, &r);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    double s = 0.0;
    for (int j = 0; j < LANES; j++) s += r.lanes[j];
    s += r.tail;
    return Py_BuildValue("(LKKKKKd)", (long long)r.top_plus1 - 1, (unsigned long long)r.n_zero,
                         (unsigned long long)r.n_inf, (unsigned long long)r.n_nan, (unsigned long long)r.n_pos,
                         (unsigned long long)r.n_small, s);
}

static PyMethodDef methods[] = {
    {"reduce", reduce, METH_VARARGS, "One-pass statistics of a block of F32/BF16/F16 bit patterns (see the source)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_forensics_tensor_kernels",
                                    "Compiled one-pass reducer of F32/BF16/F16 bit patterns (parsers/_tensor_native.c).",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__forensics_tensor_kernels(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
#ifdef HAVE_AVX512
    __builtin_cpu_init();
    use_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#endif
    PyModule_AddIntConstant(m, "LANES", LANES);
    PyModule_AddStringConstant(m, "ISA", use_avx512 ? "avx512" : "portable");
    return m;
}
