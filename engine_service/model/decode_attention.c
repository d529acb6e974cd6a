/* Decode attention read in place from the paged KV cache, for x86-64 CPUs with AVX-512 (built and
 * loaded by native.py): one query token per sequence, attending to its own cached context.
 *
 * q: the step's decode rows, [batch, q_heads, head_dim] with the given row and head strides
 * (elements); k_cache, v_cache: one layer's cache, [slots, kv_heads, head_dim] contiguous, slot =
 * block id * block_size + offset; block_ids: [batch, table_width] block tables; lens: [batch]
 * context lengths, the new token included (its k/v already written); window > 0: only the last
 * `window` positions (a sliding layer). out: [batch, q_heads, head_dim] contiguous. bf16 or
 * float32 throughout; float32 math, rounded once at the end.
 *
 * Why: torch's path gathers each sequence's blocks into contiguous tensors, then runs SDPA: two
 * copies and three calls a layer, ~45 us at batch 1 against ~10 us here (benchmarks/RESULTS.md).
 *
 * Each (sequence, kv head) is one task: the query heads that share the kv head (grouped-query
 * attention) are computed together, so each cached k/v row is read once. A sequence's result
 * depends only on its own query and context, never on the batch or the thread count.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define LANES 16          /* head_dim must be a multiple of this (checked by the caller) */
#define MAX_CHUNKS 16     /* and at most MAX_CHUNKS * LANES = 256 */

static inline __m512 load16(const void *p, int bf16) {
    if (!bf16) return _mm512_loadu_ps(p);
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

static inline void store16(void *p, __m512 v, int bf16) {
    if (!bf16) {
        _mm512_storeu_ps(p, v);
        return;
    }
    /* round to nearest even, as torch converts (attention outputs are finite) */
    __m512i bits = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    bits = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(bits, 16)));
}

/* e^x for x <= 0 (softmax numerators), within ~2 ulp: x = n ln2 + r, a degree-6 polynomial for e^r
 * (Cephes' expf), times 2^n. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, n);
}

/* Softmax numerators of s[0..n) in place; returns their sum. */
static float softmax_numerators(float *s, int64_t n) {
    __m512 top = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < n; i += LANES) {
        __mmask16 live = n - i >= LANES ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        top = _mm512_mask_max_ps(top, live, top, _mm512_maskz_loadu_ps(live, s + i));
    }
    __m512 peak = _mm512_set1_ps(_mm512_reduce_max_ps(top)), total = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += LANES) {
        __mmask16 live = n - i >= LANES ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, s + i), peak));
        _mm512_mask_storeu_ps(s + i, live, e);
        total = _mm512_mask_add_ps(total, live, total, e);
    }
    return _mm512_reduce_add_ps(total);
}

/* One sequence's query heads [group] that share kv head h.
 * scratch: group * (n + 2 * head_dim) floats: scores, the queries in float32, the sums. */
static void attend_group(const char *q, int64_t q_head_stride, const char *k_cache, const char *v_cache,
                         const int64_t *table, int64_t len, int64_t first, int64_t group, int64_t kv_heads,
                         int64_t h, int64_t head_dim, int64_t block_size, float scale, int bf16, size_t esize,
                         float *scratch, char *out) {
    const int64_t n = len - first, chunks = head_dim / LANES;
    float *scores = scratch, *queries = scratch + group * n, *acc = queries + group * head_dim;
    __m512 row[MAX_CHUNKS];
    for (int64_t g = 0; g < group; g++)
        for (int64_t c = 0; c < chunks; c++)
            _mm512_storeu_ps(queries + g * head_dim + c * LANES,
                             _mm512_mul_ps(load16(q + (size_t)(g * q_head_stride + c * LANES) * esize, bf16),
                                           _mm512_set1_ps(scale)));
    for (int64_t t = first; t < len; t++) {
        int64_t slot = table[t / block_size] * block_size + t % block_size;
        const char *k = k_cache + (size_t)(slot * kv_heads + h) * head_dim * esize;
        for (int64_t c = 0; c < chunks; c++) row[c] = load16(k + c * LANES * esize, bf16);
        for (int64_t g = 0; g < group; g++) {
            __m512 dot = _mm512_setzero_ps();
            for (int64_t c = 0; c < chunks; c++)
                dot = _mm512_fmadd_ps(_mm512_loadu_ps(queries + g * head_dim + c * LANES), row[c], dot);
            scores[g * n + (t - first)] = _mm512_reduce_add_ps(dot);
        }
    }
    float totals[group];
    for (int64_t g = 0; g < group; g++) totals[g] = softmax_numerators(scores + g * n, n);
    for (int64_t i = 0; i < group * head_dim; i++) acc[i] = 0.0f;
    for (int64_t t = first; t < len; t++) {
        int64_t slot = table[t / block_size] * block_size + t % block_size;
        const char *v = v_cache + (size_t)(slot * kv_heads + h) * head_dim * esize;
        for (int64_t c = 0; c < chunks; c++) row[c] = load16(v + c * LANES * esize, bf16);
        for (int64_t g = 0; g < group; g++) {
            __m512 weight = _mm512_set1_ps(scores[g * n + (t - first)]);
            float *a = acc + g * head_dim;
            for (int64_t c = 0; c < chunks; c++)
                _mm512_storeu_ps(a + c * LANES, _mm512_fmadd_ps(weight, row[c], _mm512_loadu_ps(a + c * LANES)));
        }
    }
    for (int64_t g = 0; g < group; g++) {
        __m512 inverse = _mm512_set1_ps(1.0f / totals[g]);
        for (int64_t c = 0; c < chunks; c++)
            store16(out + (size_t)(g * head_dim + c * LANES) * esize,
                    _mm512_mul_ps(_mm512_loadu_ps(acc + g * head_dim + c * LANES), inverse), bf16);
    }
}

/* Returns 0, or -1 when scratch memory could not be allocated. */
int conduit_decode_attention(const void *q, int64_t q_row_stride, int64_t q_head_stride, const void *k_cache,
                             const void *v_cache, const int64_t *block_ids, int64_t table_width,
                             const int64_t *lens, int64_t batch, int64_t q_heads, int64_t kv_heads,
                             int64_t head_dim, int64_t block_size, int64_t window, float scale, int bf16,
                             void *out) {
    const size_t esize = bf16 ? 2 : 4;
    const int64_t group = q_heads / kv_heads;
    int failed = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(| : failed)
    for (int64_t task = 0; task < batch * kv_heads; task++) {
        int64_t b = task / kv_heads, h = task % kv_heads, len = lens[b];
        int64_t first = window > 0 && len > window ? len - window : 0;
        float *scratch = malloc(sizeof(float) * group * (len - first + 2 * head_dim));
        if (scratch == NULL) {
            failed = 1;
            continue;
        }
        attend_group((const char *)q + (size_t)(b * q_row_stride + h * group * q_head_stride) * esize, q_head_stride,
                     k_cache, v_cache, block_ids + b * table_width, len, first, group, kv_heads, h, head_dim,
                     block_size, scale, bf16, esize, scratch,
                     (char *)out + (size_t)((b * q_heads + h * group) * head_dim) * esize);
        free(scratch);
    }
    return failed ? -1 : 0;
}
