/* float32 vectors for the native kernels (int8_matmul.c, decode_attention.c, rms_norm.c): 16 lanes
 * on a build for AVX-512, else 8 lanes on AVX2 with FMA; and loads and stores of bf16 or float32
 * arrays. native.py builds the kernels once per instruction set this CPU runs and loads the best. A
 * kernel's results depend on the build (the lane count orders its sums), never on the batch or the
 * thread count.
 */
#ifndef CONDUIT_SIMD_H
#define CONDUIT_SIMD_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#ifdef __AVX512F__
#define VL 16
typedef __m512 vec;
#define vzero _mm512_setzero_ps
#define vset1 _mm512_set1_ps
#define vload _mm512_loadu_ps
#define vstore _mm512_storeu_ps
#define vadd _mm512_add_ps
#define vsub _mm512_sub_ps
#define vmul _mm512_mul_ps
#define vmax _mm512_max_ps
#define vfmadd _mm512_fmadd_ps
#define vfnmadd _mm512_fnmadd_ps
static inline float vsum(vec v) { return _mm512_reduce_add_ps(v); }
static inline float vmax_lane(vec v) { return _mm512_reduce_max_ps(v); }

/* VL int8 values, widened to float32. */
static inline vec vload_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

static inline vec vload_bf16(const uint16_t *p) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

static inline __m256i narrow_u16(__m512i v) { return _mm512_cvtepi32_epi16(v); }

static inline vec vround(vec x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* y * 2^n for integral n */
static inline vec vscale2(vec y, vec n) { return _mm512_scalef_ps(y, n); }

#define VI_TYPE __m512i
#define vi_cast_ps _mm512_castps_si512
#define vi_srli _mm512_srli_epi32
#define vi_and _mm512_and_si512
#define vi_add _mm512_add_epi32
#define vi_set1 _mm512_set1_epi32
#define VBF16_STORE(p, h) _mm256_storeu_si256((__m256i *)(p), narrow_u16(h))

#else /* AVX2 + FMA */
#define VL 8
typedef __m256 vec;
#define vzero _mm256_setzero_ps
#define vset1 _mm256_set1_ps
#define vload _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vadd _mm256_add_ps
#define vsub _mm256_sub_ps
#define vmul _mm256_mul_ps
#define vmax _mm256_max_ps
#define vfmadd _mm256_fmadd_ps
#define vfnmadd _mm256_fnmadd_ps
static inline float vsum(vec v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline float vmax_lane(vec v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline vec vload_i8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

static inline vec vload_bf16(const uint16_t *p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

/* 8 values < 2^16 in 32-bit lanes -> 8 uint16 (packus works per 128-bit half: then join the halves). */
static inline __m128i narrow_u16(__m256i v) {
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0xD8);
    return _mm256_castsi256_si128(packed);
}

static inline vec vround(vec x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

/* y * 2^n for integral n in [-126, 127]: n goes straight into a float's exponent bits. */
static inline vec vscale2(vec y, vec n) {
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}

#define VI_TYPE __m256i
#define vi_cast_ps _mm256_castps_si256
#define vi_srli _mm256_srli_epi32
#define vi_and _mm256_and_si256
#define vi_add _mm256_add_epi32
#define vi_set1 _mm256_set1_epi32
#define VBF16_STORE(p, h) _mm_storeu_si128((__m128i *)(p), narrow_u16(h))
#endif

/* Round to bf16, nearest even, as torch converts (for finite values). */
static inline void vstore_bf16(uint16_t *p, vec v) {
    VI_TYPE bits = vi_cast_ps(v);
    VI_TYPE odd = vi_and(vi_srli(bits, 16), vi_set1(1));
    bits = vi_add(bits, vi_add(odd, vi_set1(0x7fff)));
    VBF16_STORE(p, vi_srli(bits, 16));
}

static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Round to nearest even, as torch converts; NaN stays NaN. */
static inline uint16_t float_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* Elements of a bf16 (bf16 != 0) or float32 array, read as float32 and stored rounded to the
 * array's type (bf16: to nearest even, as torch converts; the vector store assumes finite values). */
static inline float load_value(const void *p, int64_t i, int bf16) {
    return bf16 ? bf16_to_float(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline void store_value(void *p, int64_t i, float v, int bf16) {
    if (bf16)
        ((uint16_t *)p)[i] = float_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

/* VL elements from element i. */
static inline vec load_values(const void *p, int64_t i, int bf16) {
    return bf16 ? vload_bf16((const uint16_t *)p + i) : vload((const float *)p + i);
}

static inline void store_values(void *p, int64_t i, vec v, int bf16) {
    if (bf16)
        vstore_bf16((uint16_t *)p + i, v);
    else
        vstore((float *)p + i, v);
}

#endif
