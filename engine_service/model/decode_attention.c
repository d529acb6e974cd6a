/* Decode attention read in place from the paged KV cache, for x86-64 CPUs with AVX-512 or AVX2
 * (simd.h; bound as a torch op by native_ops.cpp, built by native.py): one query token per sequence,
 * attending to its own cached context.
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
#include <math.h>
#include <stdlib.h>

#include "kernels.h"
#include "simd.h"

#define LANES 16                 /* head_dim must be a multiple of this (checked by native_ops.cpp) */
#define MAX_CHUNKS (256 / VL)    /* and at most 256 */
/* Cached rows are scattered in blocks, and each is a few cache lines, so the hardware prefetcher
 * does not keep up: each key row is asked for AHEAD rows before its turn, and each value row when
 * its key is read. That made a batch-32 step's attention ~3x faster (benchmarks/RESULTS.md). */
#define AHEAD 16
#define TILE 8 /* head_dim chunks summed in registers at once */

static inline void prefetch_row(const char *p, size_t bytes) {
    for (size_t i = 0; i < bytes; i += 64) _mm_prefetch(p + i, _MM_HINT_T0);
}

/* e^x for x <= 0 (softmax numerators), within ~2 ulp: x = n ln2 + r, a degree-6 polynomial for e^r
 * (Cephes' expf), times 2^n. */
static inline vec vexp(vec x) {
    x = vmax(x, vset1(-87.0f));
    vec n = vround(vmul(x, vset1(1.44269504088896341f)));
    vec r = vfnmadd(n, vset1(0.693359375f), x);
    r = vfnmadd(n, vset1(-2.12194440e-4f), r);
    vec p = vset1(1.9875691500e-4f);
    p = vfmadd(p, r, vset1(1.3981999507e-3f));
    p = vfmadd(p, r, vset1(8.3334519073e-3f));
    p = vfmadd(p, r, vset1(4.1665795894e-2f));
    p = vfmadd(p, r, vset1(1.6666665459e-1f));
    p = vfmadd(p, r, vset1(5.0000001201e-1f));
    vec y = vadd(vfmadd(vmul(p, r), r, r), vset1(1.0f));
    return vscale2(y, n);
}

/* Softmax numerators of s[0..n) in place; returns their sum. The last n % VL scores go through a
 * padded copy (-inf: they neither raise the peak nor add to the sum). */
static float softmax_numerators(float *s, int64_t n) {
    const int64_t whole = n - n % VL;
    float tail[VL];
    for (int i = 0; i < VL; i++) tail[i] = whole + i < n ? s[whole + i] : -INFINITY;
    vec top = vload(tail);
    for (int64_t i = 0; i < whole; i += VL) top = vmax(top, vload(s + i));
    vec peak = vset1(vmax_lane(top)), total = vzero();
    for (int64_t i = 0; i < whole; i += VL) {
        vec e = vexp(vsub(vload(s + i), peak));
        vstore(s + i, e);
        total = vadd(total, e);
    }
    if (whole < n) {
        vstore(tail, vexp(vsub(vload(tail), peak)));
        for (int i = whole; i < n; i++) s[i] = tail[i - whole];
        for (int i = n - whole; i < VL; i++) tail[i] = 0.0f;
        total = vadd(total, vload(tail));
    }
    return vsum(total);
}

/* One sequence's query heads [group] that share kv head h. scratch: n int64 (each cached row's byte
 * offset in k/v_cache), then group * (n + head_dim) floats (the scores, the queries in float32). */
static void attend_group(const char *q, int64_t q_head_stride, const char *k_cache, const char *v_cache,
                         const int64_t *table, int64_t len, int64_t first, int64_t group, int64_t kv_heads,
                         int64_t h, int64_t head_dim, int64_t block_size, float scale, int bf16, size_t esize,
                         int64_t *scratch, char *out) {
    const int64_t n = len - first, chunks = head_dim / VL;
    int64_t *offsets = scratch;
    float *scores = (float *)(offsets + n), *queries = scores + group * n;
    vec row[MAX_CHUNKS];
    for (int64_t g = 0; g < group; g++)
        for (int64_t c = 0; c < chunks; c++)
            vstore(queries + g * head_dim + c * VL,
                   vmul(load_values(q, g * q_head_stride + c * VL, bf16), vset1(scale)));
    const size_t row_bytes = head_dim * esize;
    for (int64_t t = first; t < len;) { /* each row's byte offset, block by block */
        const int64_t base = (table[t / block_size] * block_size * kv_heads + h) * row_bytes;
        for (int64_t o = t % block_size; o < block_size && t < len; o++, t++)
            offsets[t - first] = base + o * kv_heads * row_bytes;
    }
    for (int64_t i = 0; i < n && i < AHEAD; i++) prefetch_row(k_cache + offsets[i], row_bytes);
    for (int64_t i = 0; i < n; i++) {
        if (i + AHEAD < n) prefetch_row(k_cache + offsets[i + AHEAD], row_bytes);
        prefetch_row(v_cache + offsets[i], row_bytes);
        const char *k = k_cache + offsets[i];
        for (int64_t c = 0; c < chunks; c++) row[c] = load_values(k, c * VL, bf16);
        for (int64_t g = 0; g < group; g++) {
            vec dot = vzero();
            for (int64_t c = 0; c < chunks; c++) dot = vfmadd(vload(queries + g * head_dim + c * VL), row[c], dot);
            scores[g * n + i] = vsum(dot);
        }
    }
    float totals[group];
    for (int64_t g = 0; g < group; g++) totals[g] = softmax_numerators(scores + g * n, n);
    /* out = scores . V / total, per query head and per TILE chunks of head_dim, summed in registers. */
    for (int64_t g = 0; g < group; g++) {
        const float *weights = scores + g * n;
        const vec inverse = vset1(1.0f / totals[g]);
        for (int64_t c0 = 0; c0 < chunks; c0 += TILE) {
            const int64_t tile = chunks - c0 < TILE ? chunks - c0 : TILE;
            vec sums[TILE];
            for (int64_t c = 0; c < tile; c++) sums[c] = vzero();
            for (int64_t i = 0; i < n; i++) {
                const char *v = v_cache + offsets[i] + c0 * VL * esize;
                const vec weight = vset1(weights[i]);
                for (int64_t c = 0; c < tile; c++) sums[c] = vfmadd(weight, load_values(v, c * VL, bf16), sums[c]);
            }
            for (int64_t c = 0; c < tile; c++)
                store_values(out, g * head_dim + (c0 + c) * VL, vmul(sums[c], inverse), bf16); /* finite */
        }
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
        int64_t *scratch = malloc(sizeof(int64_t) * (len - first) + sizeof(float) * group * (len - first + head_dim));
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
