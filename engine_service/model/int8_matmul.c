/* int8 weight-only matmul for x86-64 CPUs with AVX-512 or AVX2 (simd.h; bound as torch ops by
 * native_ops.cpp, built by native.py):
 *
 *     y[m, n] = (sum over k of x[m, k] * w[n, k]) * scales[n]
 *
 * x: [M, K] bf16 or float32 activations; w: [N, K] int8 weights, one float32 scale per output
 * channel n; y: [M, N] in x's type. Float32 sums, rounded once to the output type, as
 * torch._weight_int8pack_mm, and faster:
 *
 * - A decode step at a small batch is bound by streaming the weights. The hardware prefetcher
 *   stops at each 4 KB page, so every block of weight rows first asks for the bytes PREFETCH_AHEAD
 *   further on: a batch-1 layer's matmuls went from ~26 to ~39 GB/s here (benchmarks/RESULTS.md).
 * - Each weight vector is widened once and used for every row of x (PASS_ROWS at a time).
 * - With a few rows the multiply-adds bound the work, so bf16 activations on the AVX512_BF16 build
 *   (native.py builds it only for a CPU that has it) take `vdpbf16ps`: an int8 weight is exact in
 *   bf16, a bf16 x bf16 product exact in float32, and one instruction adds 32 of them in pairs
 *   (half the instructions of float32 FMAs; 8 rows ~1.8x faster). Otherwise x is widened to
 *   float32 and float32 FMAs run.
 *
 * Batch invariance: which path runs depends on the dtype, K and the build only, and every output
 * element is one accumulation over k in order, then one horizontal sum, whatever M, the block
 * shapes or the thread count; so a row's result never depends on the other rows (the engine's
 * --deterministic relies on it).
 * Threads: OpenMP over blocks of output channels, from the OpenMP runtime torch already loaded
 * (the same pool and thread count as torch's own kernels).
 */
#include <stdlib.h>

#include "kernels.h"
#include "simd.h"

#define PREFETCH_AHEAD 4096 /* bytes; 2-8 KB measured alike, 1 KB and 16 KB slower */
/* Rows of x per pass over the weights. AVX2's 16 registers hold fewer accumulators: two passes of
 * 4 rows (4 x 3 blocks) beat one of 8 rows (8 x 1), 24% at 8 rows and 31% at 4 (benchmarks/RESULTS.md). */
#if VL == 16
#define PASS_ROWS 8
#else
#define PASS_ROWS 4
#endif
#define MAX_OUTS 8          /* output channels per dot block */
/* Output channels a thread takes at once, through every pass: each pass's block width divides it,
 * and its weights (24 x K bytes) stay in cache for the passes after the first, which so read them
 * once from memory instead of once per pass (the step's matrices at 32 rows ~15% faster here, same bits). */
#define BLOCK_OUTS 24
#define LANES 16            /* K must be a multiple of this (checked by native_ops.cpp) */
#define PAIR_LANES 32       /* the bf16 path's step: K must be a multiple of it too */

/* Ask for the weight bytes PREFETCH_AHEAD past a block's start, as many as the block holds. */
static inline __attribute__((always_inline)) void prefetch_ahead(const int8_t *w, int64_t block_bytes,
                                                                 const char *w_end) {
    const char *ahead = (const char *)w + PREFETCH_AHEAD;
    for (int64_t i = 0; i < block_bytes; i += 64)
        if (ahead + i < w_end) _mm_prefetch(ahead + i, _MM_HINT_T0);
}

/* The ROWS x OUTS dot products of x's rows with the weight rows from w, into out[ROWS][OUTS].
 * Always inlined with constant ROWS and OUTS, so the accumulators live in registers. */
static inline __attribute__((always_inline)) void dot_block(const float *x, int rows, int outs, int64_t k_len,
                                                            const int8_t *w, const char *w_end, float *out) {
    vec acc[PASS_ROWS][MAX_OUTS];
    for (int m = 0; m < rows; m++)
        for (int r = 0; r < outs; r++) acc[m][r] = vzero();
    if (w_end != NULL) prefetch_ahead(w, outs * k_len, w_end);
    for (int64_t k = 0; k < k_len; k += VL) {
        for (int r = 0; r < outs; r++) {
            vec wv = vload_i8(w + r * k_len + k);
            for (int m = 0; m < rows; m++) acc[m][r] = vfmadd(wv, vload(x + m * k_len + k), acc[m][r]);
        }
    }
    for (int m = 0; m < rows; m++)
        for (int r = 0; r < outs; r++) out[m * outs + r] = vsum(acc[m][r]);
}

#ifdef __AVX512BF16__
#define HAVE_DPBF16 1
/* dot_block for bf16 rows of x, with vdpbf16ps (see the header); K a multiple of PAIR_LANES. */
static inline __attribute__((always_inline)) void dot_block_bf16(const uint16_t *x, int rows, int outs, int64_t k_len,
                                                                 const int8_t *w, const char *w_end, float *out) {
    __m512 acc[PASS_ROWS][MAX_OUTS];
    for (int m = 0; m < rows; m++)
        for (int r = 0; r < outs; r++) acc[m][r] = _mm512_setzero_ps();
    if (w_end != NULL) prefetch_ahead(w, outs * k_len, w_end);
    for (int64_t k = 0; k < k_len; k += PAIR_LANES) {
        for (int r = 0; r < outs; r++) {
            const int8_t *wr = w + r * k_len + k;
            __m512bh wv = _mm512_cvtne2ps_pbh(vload_i8(wr + LANES), vload_i8(wr)); /* exact: |w| <= 127 */
            for (int m = 0; m < rows; m++)
                acc[m][r] = _mm512_dpbf16_ps(acc[m][r], (__m512bh)_mm512_loadu_si512(x + m * k_len + k), wv);
        }
    }
    for (int m = 0; m < rows; m++)
        for (int r = 0; r < outs; r++) out[m * outs + r] = _mm512_reduce_add_ps(acc[m][r]);
}
#define DOT_BLOCK_BF16(ROWS, OUTS, w0, out) dot_block_bf16(xb, ROWS, OUTS, k, w0, m0 == 0 ? w_end : NULL, out)
#else
#define HAVE_DPBF16 0
#define DOT_BLOCK_BF16(ROWS, OUTS, w0, out) ((void)xb)
#endif

/* ROWS x OUTS dot products into out, by the call's path (pairs: vdpbf16ps on bf16 x). */
#define DOT_BLOCK(ROWS, OUTS, j, out)                                                                 \
    do {                                                                                              \
        if (pairs)                                                                                    \
            DOT_BLOCK_BF16(ROWS, OUTS, w + (n0 + (j)) * k, out);                                      \
        else                                                                                          \
            dot_block(xf + m0 * k, ROWS, OUTS, k, w + (n0 + (j)) * k, m0 == 0 ? w_end : NULL, out);   \
    } while (0)

/* Rows m0 .. m0 + ROWS of x against output channels n0 .. n0 + count, OUTS channels at a time (ROWS
 * x OUTS accumulators: at most 16 on AVX-512, 12 on AVX2, a margin under their 32 and 16 registers),
 * the last count % OUTS one at a time. */
#define PASS(ROWS, OUTS)                                                                              \
    do {                                                                                              \
        int64_t j = 0;                                                                                \
        for (; j + (OUTS) <= count; j += (OUTS)) {                                                    \
            float out[(ROWS) * (OUTS)];                                                               \
            DOT_BLOCK(ROWS, OUTS, j, out);                                                            \
            for (int m = 0; m < (ROWS); m++)                                                          \
                for (int r = 0; r < (OUTS); r++)                                                      \
                    store_value(y, (m0 + m) * n + n0 + j + r, out[m * (OUTS) + r] * scales[n0 + j + r], y_bf16);  \
        }                                                                                             \
        for (; j < count; j++) {                                                                      \
            float out[(ROWS)];                                                                        \
            DOT_BLOCK(ROWS, 1, j, out);                                                               \
            for (int m = 0; m < (ROWS); m++) store_value(y, (m0 + m) * n + n0 + j, out[m] * scales[n0 + j], y_bf16);  \
        }                                                                                             \
    } while (0)

/* Returns 0, or -1 when its scratch memory could not be allocated. */
int conduit_int8_matmul(const void *x, int x_bf16, int64_t m_len, int64_t k, const int8_t *w,
                        const float *scales, void *y, int64_t n) {
    const int y_bf16 = x_bf16;
    /* The AVX512_BF16 build runs only on CPUs with it (native.py), so the CPU check always passes
     * there; it stays because without it GCC compiled this function's weight stream ~1.5x slower at
     * one row over a 28 MB matrix (the lm_head: 2.37 against 1.51 ms on one thread, same bits;
     * benchmarks/RESULTS.md). */
    const int pairs = HAVE_DPBF16 && x_bf16 && k % PAIR_LANES == 0 && __builtin_cpu_supports("avx512bf16");
    const char *w_end = (const char *)w + n * k;
    float *xf = pairs ? NULL : malloc(sizeof(float) * m_len * k); /* x as float32 */
    if (!pairs && xf == NULL) return -1;
    for (int64_t i = 0; !pairs && i < m_len * k; i++)
        xf[i] = load_value(x, i, x_bf16);
    const int64_t blocks = (n + BLOCK_OUTS - 1) / BLOCK_OUTS;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t n0 = b * BLOCK_OUTS, count = n - n0 < BLOCK_OUTS ? n - n0 : BLOCK_OUTS;
        for (int64_t m0 = 0; m0 < m_len; m0 += PASS_ROWS) {
            const int rows = m_len - m0 < PASS_ROWS ? (int)(m_len - m0) : PASS_ROWS;
            const uint16_t *xb = (const uint16_t *)x + m0 * k; /* the pass's rows of x, as bf16 (pairs) */
#if VL == 16
            switch (rows) {
                case 1: PASS(1, 8); break;
                case 2: PASS(2, 8); break;
                case 3: PASS(3, 4); break;
                case 4: PASS(4, 4); break;
                case 5: PASS(5, 3); break;
                case 6: PASS(6, 2); break;
                case 7: PASS(7, 2); break;
                default: PASS(8, 2); break;
            }
#else
            switch (rows) { /* 1 and 2 rows: 4 channels a block beat 8 and 6 (fewer weight streams), ~15% and ~6% */
                case 1: PASS(1, 4); break;
                case 2: PASS(2, 4); break;
                case 3: PASS(3, 4); break;
                default: PASS(4, 3); break;
            }
#endif
        }
    }
    free(xf);
    return 0;
}

/* ---- Many rows (prompt chunks, big steps): a GEMM over weights packed in panels ----
 *
 * With many rows the multiply-adds bound the work, and the dot products above spend a horizontal
 * sum and a widening per weight vector and pass. Here the weights are packed once in panels of
 * PANEL output channels, [K][PANEL] int8 each (conduit_int8_pack), so a vector of weights is PANEL /
 * VL channels at one k: each weight vector is widened once and multiplied with GEMM_ROWS rows' x[k]
 * broadcast (GEMM_ROWS x 2 accumulators, the classic register tile). Each output element is one
 * chain of multiply-adds over k in order, then scaled: its bits depend on neither M nor the
 * blocking nor the threads (but differ from the dot products' lane-wise sums above).
 */
#define PANEL (2 * VL)
#define GEMM_ROWS 6
#define GEMM_BLOCK_ROWS 96 /* rows of x (float32) kept in L2 while every panel passes over them */

/* Output channels per panel, for the caller's sizing of `packed`. */
int conduit_int8_panel(void) { return PANEL; }

/* packed [ceil(n / PANEL)][k][PANEL] from w [n, k]; channels past n are zeros. */
void conduit_int8_pack(const int8_t *w, int64_t n, int64_t k, int8_t *packed) {
    const int64_t panels = (n + PANEL - 1) / PANEL;
    for (int64_t p = 0; p < panels; p++)
        for (int64_t kk = 0; kk < k; kk++)
            for (int64_t j = 0; j < PANEL; j++) {
                const int64_t c = p * PANEL + j;
                packed[(p * k + kk) * PANEL + j] = c < n ? w[c * k + kk] : 0;
            }
}

static inline __attribute__((always_inline)) void gemm_tile(const float *x, int rows, int64_t k, const int8_t *panel,
                                                             const float *scales, int64_t c0, int64_t n, void *y,
                                                             int y_bf16) {
    vec acc[GEMM_ROWS][2];
    for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = vzero();
    for (int64_t kk = 0; kk < k; kk++) {
        const vec w0 = vload_i8(panel + kk * PANEL), w1 = vload_i8(panel + kk * PANEL + VL);
        for (int r = 0; r < rows; r++) {
            const vec xv = vset1(x[r * k + kk]);
            acc[r][0] = vfmadd(xv, w0, acc[r][0]);
            acc[r][1] = vfmadd(xv, w1, acc[r][1]);
        }
    }
    float out[PANEL];
    for (int r = 0; r < rows; r++) {
        vstore(out, acc[r][0]);
        vstore(out + VL, acc[r][1]);
        for (int j = 0; j < PANEL && c0 + j < n; j++) store_value(y, r * n + c0 + j, out[j] * scales[c0 + j], y_bf16);
    }
}

/* y [m, n] = x [m, k] . w^T, scaled per channel, as conduit_int8_matmul but on packed panels.
 * Returns 0, or -1 when its scratch memory could not be allocated. */
int conduit_int8_gemm(const void *x, int x_bf16, int64_t m_len, int64_t k, const int8_t *packed,
                      const float *scales, void *y, int64_t n) {
    float *xf = malloc(sizeof(float) * m_len * k);
    if (xf == NULL) return -1;
    for (int64_t i = 0; i < m_len * k; i++) xf[i] = load_value(x, i, x_bf16);
    const int64_t panels = (n + PANEL - 1) / PANEL;
    for (int64_t b0 = 0; b0 < m_len; b0 += GEMM_BLOCK_ROWS) {
        const int64_t b1 = b0 + GEMM_BLOCK_ROWS < m_len ? b0 + GEMM_BLOCK_ROWS : m_len;
#pragma omp parallel for schedule(static)
        for (int64_t p = 0; p < panels; p++) {
            const int8_t *panel = packed + p * k * PANEL;
            for (int64_t m0 = b0; m0 < b1; m0 += GEMM_ROWS) {
                const int rows = b1 - m0 < GEMM_ROWS ? (int)(b1 - m0) : GEMM_ROWS;
                const float *xr = xf + m0 * k;
                char *yr = (char *)y + (size_t)m0 * n * (x_bf16 ? 2 : 4);
                switch (rows) {
                    case 1: gemm_tile(xr, 1, k, panel, scales, p * PANEL, n, yr, x_bf16); break;
                    case 2: gemm_tile(xr, 2, k, panel, scales, p * PANEL, n, yr, x_bf16); break;
                    case 3: gemm_tile(xr, 3, k, panel, scales, p * PANEL, n, yr, x_bf16); break;
                    case 4: gemm_tile(xr, 4, k, panel, scales, p * PANEL, n, yr, x_bf16); break;
                    case 5: gemm_tile(xr, 5, k, panel, scales, p * PANEL, n, yr, x_bf16); break;
                    default: gemm_tile(xr, GEMM_ROWS, k, panel, scales, p * PANEL, n, yr, x_bf16); break;
                }
            }
        }
    }
    free(xf);
    return 0;
}
