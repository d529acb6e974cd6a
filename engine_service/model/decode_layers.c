/* Every decoder layer of a Llama decode step in one call, for x86-64 CPUs with AVX-512 or AVX2
 * (simd.h; built and loaded by native.py), on the other native kernels (included below):
 *
 *     for each layer:  qkv = int8(normed); rotate q and k; write k and v into the paged cache;
 *                      attend; h, normed = add_rms_norm(h, int8_o(attention));
 *                      h, normed = add_rms_norm(h, int8_down(silu(gate) * up)), the next layer's norm
 *                      (the model's final norm after the last layer)
 *
 * Why: a decode step's layers are some 25 small torch ops and native calls each, ~150 us of
 * Python and dispatch a layer here, about a third of a batch-1 step (benchmarks/RESULTS.md, "A
 * decode step in one native call"). This is the lean Llama forward's decode step (model/llama.py)
 * with that overhead gone, the CPU's stand-in for a captured CUDA graph.
 *
 * Same math, rounded where the lean forward rounds: every projection, the rotation's two products
 * and their sum, silu(gate) and its product with up are rounded to the model's dtype (bf16 or
 * float32); the matmuls, the attention and the norms are the very functions the lean forward calls,
 * except that from GEMM_MIN_ROWS rows a projection with packed panels runs the GEMM (the same
 * weights, summed in another order). silu differs too: e^x comes from decode_attention.c's
 * polynomial, within ~2 ulp of torch's, so a bf16 activation may rarely round the other way. Each
 * row is computed alone: its bits depend on the batch only through the side of GEMM_MIN_ROWS it is on.
 *
 * Small steps split each matmul's output channels across the threads; big ones give each thread its
 * own rows through every layer (split_rows below).
 */
#include "int8_matmul.c"
#include "decode_attention.c"
#include "rms_norm.c"

#include <omp.h>

typedef struct {
    const int8_t *weight; /* [n, k] */
    const float *scales;  /* [n] */
    const int8_t *panels; /* the same packed for conduit_int8_gemm, or NULL */
} Int8Weights;

/* Rows from which a projection with panels runs the GEMM: it beats the dot products there once
 * the multiply-adds bound the work (one layer's matmuls at 16 / 32 / 64 rows: 0.92 / 1.89 / 3.92
 * ms against 1.02 / 2.06 / 4.22; below, the dot kernel's prefetching streams the weights). */
#define GEMM_MIN_ROWS 16

static int project(const void *x, int bf16, int64_t rows, int64_t k, const Int8Weights *w, int gemm, void *y,
                   int64_t n) {
    if (w->panels != NULL && gemm) return conduit_int8_gemm(x, bf16, rows, k, w->panels, w->scales, y, n);
    return conduit_int8_matmul(x, bf16, rows, k, w->weight, w->scales, y, n);
}

typedef struct {
    Int8Weights qkv, o, gate_up, down;
    const void *post_attention_norm; /* [hidden] weights of the norm after attention */
    const void *next_norm;           /* the next layer's input norm, or the final norm after the last layer */
    void *k_cache, *v_cache;         /* this layer's cache, [slots, kv_heads, head_dim] */
} DecodeLayer;

typedef struct {
    int64_t num_layers, hidden, q_heads, kv_heads, head_dim, intermediate, block_size;
    float eps, scale;
    int bf16;
    const DecodeLayer *layers;
} DecodeModel;

#ifdef __AVX512F__
#define vdiv _mm512_div_ps
#define vmin _mm512_min_ps
#else
#define vdiv _mm256_div_ps
#define vmin _mm256_min_ps
#endif

/* silu(x) = x / (1 + e^-x), as torch computes it; e^-x from decode_attention.c's vexp (kept below
 * overflow: past it the quotient rounds to -0 either way). */
static inline vec vsilu(vec x) {
    return vdiv(x, vadd(vset1(1.0f), vexp(vmin(vsub(vzero(), x), vset1(88.0f)))));
}

/* q and k heads of one row: out = x * cos + roll(x, head_dim / 2) * signed_sin, each product and the
 * sum rounded (as the lean forward's three bf16 ops). k heads go straight to the cache slot. No
 * fused multiply-adds: the float32 build rounds the two products as torch does. */
__attribute__((optimize("fp-contract=off")))
static void rotate_row(const void *qkv, const void *cos, const void *signed_sin, const DecodeModel *m, void *q_out,
                       void *k_out) {
    const int64_t d = m->head_dim, half = d / 2;
    const int bf16 = m->bf16;
    for (int64_t head = 0; head < m->q_heads + m->kv_heads; head++) {
        const int64_t in = head * d;
        void *dst = head < m->q_heads ? q_out : k_out;
        const int64_t out = (head < m->q_heads ? head : head - m->q_heads) * d;
        for (int64_t i = 0; i < d; i++) {
            const float x = load_value(qkv, in + i, bf16), rolled = load_value(qkv, in + (i + half) % d, bf16);
            const float a = rounded(x * load_value(cos, i, bf16), bf16);
            const float b = rounded(rolled * load_value(signed_sin, i, bf16), bf16);
            store_value(dst, out + i, a + b, bf16);
        }
    }
}

/* act[r] = silu(gate) * up over a row's [gate | up], silu rounded first. */
__attribute__((optimize("fp-contract=off")))
static void silu_mul_row(const void *gate_up, int64_t inter, int bf16, void *act) {
    int64_t i = 0;
    for (; i + VL <= inter; i += VL) {
        vec silu = rounded_vec(vsilu(load_values(gate_up, i, bf16)), bf16);
        store_values(act, i, vmul(silu, load_values(gate_up, inter + i, bf16)), bf16);
    }
    for (; i < inter; i++) {
        float g = load_value(gate_up, i, bf16);
        store_value(act, i, rounded(g / (1.0f + expf(-g)), bf16) * load_value(gate_up, inter + i, bf16), bf16);
    }
}

/* From how many rows the threads split a step's rows instead of each matmul's output channels: each
 * thread then runs every layer on its own rows and meets the others only at the step's end.
 * - Why: with the channels split, a thread preempted by another process (the engine's gRPC thread,
 *   the shim, a client) holds its partner at each of the step's ~150 barriers, and the serial parts
 *   (rotation, SiLU) leave the other cores spinning. On 2 cores, rows split are 5-10% faster from 8
 *   rows, 12-15% beside a load of 10-15% of a core, and slower at 4 (benchmarks/RESULTS.md).
 * - The cost: each thread streams all the weights, threads times the memory traffic, while the
 *   multiply-adds per thread shrink with threads; so the threshold grows with threads squared (2
 *   threads: 8 rows; 8 threads: 128, past the largest decode step, i.e. never).
 * - Rows are computed alone either way, so their bits do not change with the split. */
static int split_rows(int64_t rows, int64_t threads) { return threads > 1 && rows >= 2 * threads * threads; }

/* The layers over rows [0, rows) of the step's arrays, as offset by the caller; gemm: whether
 * projections with panels run the GEMM (decided on the whole step's rows, so a row's bits do not
 * depend on how the rows are split). */
static int layers_over_rows(const DecodeModel *m, const void *first_norm, int64_t rows, int gemm, char *h, char *normed,
                            const char *cos, const char *signed_sin, const int64_t *slots, const int64_t *block_ids,
                            int64_t table_width, const int64_t *lens) {
    const int bf16 = m->bf16;
    const size_t esize = bf16 ? 2 : 4;
    const int64_t d = m->head_dim, q_dim = m->q_heads * d, kv_dim = m->kv_heads * d;
    const int64_t qkv_dim = q_dim + 2 * kv_dim, hidden = m->hidden, inter = m->intermediate;
    char *scratch = malloc(esize * rows * (qkv_dim + 2 * q_dim + 3 * inter + hidden));
    if (scratch == NULL) return -1;
    char *qkv = scratch, *q = qkv + esize * rows * qkv_dim, *attended = q + esize * rows * q_dim;
    char *gate_up = attended + esize * rows * q_dim, *act = gate_up + esize * rows * 2 * inter;
    char *delta = act + esize * rows * inter;
    int failed = 0;
    conduit_add_rms_norm(h, NULL, first_norm, rows, hidden, m->eps, bf16, normed);
    for (int64_t l = 0; l < m->num_layers && !failed; l++) {
        const DecodeLayer *layer = &m->layers[l];
        failed |= project(normed, bf16, rows, hidden, &layer->qkv, gemm, qkv, qkv_dim);
        for (int64_t r = 0; r < rows; r++) {
            const char *row = qkv + esize * r * qkv_dim;
            char *k_slot = (char *)layer->k_cache + esize * slots[r] * kv_dim;
            rotate_row(row, cos + esize * r * d, signed_sin + esize * r * d, m, q + esize * r * q_dim, k_slot);
            memcpy((char *)layer->v_cache + esize * slots[r] * kv_dim, row + esize * (q_dim + kv_dim), esize * kv_dim);
        }
        failed |= conduit_decode_attention(q, q_dim, d, layer->k_cache, layer->v_cache, block_ids, table_width, lens,
                                           rows, m->q_heads, m->kv_heads, d, m->block_size, 0, m->scale, bf16,
                                           attended);
        failed |= project(attended, bf16, rows, q_dim, &layer->o, gemm, delta, hidden);
        conduit_add_rms_norm(h, delta, layer->post_attention_norm, rows, hidden, m->eps, bf16, normed);
        failed |= project(normed, bf16, rows, hidden, &layer->gate_up, gemm, gate_up, 2 * inter);
        for (int64_t r = 0; r < rows; r++)
            silu_mul_row(gate_up + esize * r * 2 * inter, inter, bf16, act + esize * r * inter);
        failed |= project(act, bf16, rows, inter, &layer->down, gemm, delta, hidden);
        conduit_add_rms_norm(h, delta, layer->next_norm, rows, hidden, m->eps, bf16, normed);
    }
    free(scratch);
    return failed;
}

/* h [rows, hidden]: the step's embeddings in, the last residual stream out; normed [rows, hidden]:
 * anything in, the final norm of h out. cos, signed_sin: [rows, head_dim], each row's position.
 * slots [rows]: each row's cache slot; block_ids [rows, table_width], lens [rows]: as
 * conduit_decode_attention takes them. first_norm: the first layer's input norm weights.
 * Returns 0, or -1 when scratch memory could not be allocated. */
int conduit_decode_layers(const DecodeModel *m, const void *first_norm, int64_t rows, void *h, void *normed,
                          const void *cos, const void *signed_sin, const int64_t *slots, const int64_t *block_ids,
                          int64_t table_width, const int64_t *lens) {
    const int gemm = rows >= GEMM_MIN_ROWS;
    if (!split_rows(rows, omp_get_max_threads()))
        return layers_over_rows(m, first_norm, rows, gemm, h, normed, cos, signed_sin, slots, block_ids, table_width,
                                lens) ? -1 : 0;
    const size_t esize = m->bf16 ? 2 : 4, row_bytes = esize * m->hidden, rope_bytes = esize * m->head_dim;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
        const int64_t r0 = rows * t / n, count = rows * (t + 1) / n - r0;
        omp_set_num_threads(1); /* the kernels' own parallel loops run on this thread alone */
        if (count > 0)
            failed |= layers_over_rows(m, first_norm, count, gemm, (char *)h + r0 * row_bytes,
                                       (char *)normed + r0 * row_bytes, (const char *)cos + r0 * rope_bytes,
                                       (const char *)signed_sin + r0 * rope_bytes, slots + r0,
                                       block_ids + r0 * table_width, table_width, lens + r0);
    }
    return failed ? -1 : 0;
}
