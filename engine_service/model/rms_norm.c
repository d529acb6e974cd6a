/* The residual add and the RMSNorm after it, in one call, for x86-64 CPUs with AVX-512 or AVX2
 * (simd.h; bound as a torch op by native_ops.cpp, built by native.py):
 *
 *     h = h + delta                                    (in place, rounded to h's type; delta may be NULL)
 *     out = weight * to_type(h * 1 / sqrt(mean(h^2) + eps))
 *
 * h, delta, out: [rows, dim] contiguous; weight: [dim]; all bf16 or all float32. This is
 * transformers' LlamaRMSNorm after the residual add, rounding where it rounds: float32 statistics,
 * the normalized row rounded to the input's type, then the weight applied in that type.
 *
 * Why: in the lean Llama forward each of these is ~10 small torch ops (the casts, pow, mean,
 * rsqrt, the products and the add), ~60 us a layer at batch 1 (benchmarks/RESULTS.md).
 * The sum of squares is taken in another order than torch's, so a row can differ from
 * transformers' in the last bit of the float32 statistics (and rarely of a bf16 output); each row
 * is computed alone, so its bits never depend on the other rows or on the thread count.
 */
#include <math.h>

#include "kernels.h"
#include "simd.h"

/* The value as the type rounds it (bf16: to nearest even, as torch converts). */
static inline float rounded(float v, int bf16) { return bf16 ? bf16_to_float(float_to_bf16(v)) : v; }

/* The vector's values as the type rounds them. */
static inline vec rounded_vec(vec v, int bf16) {
    if (!bf16) return v;
    uint16_t half[VL];
    vstore_bf16(half, v);
    return vload_bf16(half);
}

static void norm_row(void *h, const void *delta, const void *weight, int64_t dim, float eps, int bf16, void *out) {
    const int64_t whole = dim - dim % VL;
    vec squares = vzero();
    float tail_squares = 0.0f;
    for (int64_t i = 0; i < whole; i += VL) {
        vec x = load_values(h, i, bf16);
        if (delta != NULL) {
            x = rounded_vec(vadd(x, load_values(delta, i, bf16)), bf16);
            store_values(h, i, x, bf16);
        }
        squares = vfmadd(x, x, squares);
    }
    for (int64_t i = whole; i < dim; i++) {
        float x = load_value(h, i, bf16);
        if (delta != NULL) {
            x = rounded(x + load_value(delta, i, bf16), bf16);
            store_value(h, i, x, bf16);
        }
        tail_squares += x * x;
    }
    const float inverse = 1.0f / sqrtf((vsum(squares) + tail_squares) / (float)dim + eps);
    for (int64_t i = 0; i < whole; i += VL) {
        vec normed = rounded_vec(vmul(load_values(h, i, bf16), vset1(inverse)), bf16);
        store_values(out, i, vmul(load_values(weight, i, bf16), normed), bf16);
    }
    for (int64_t i = whole; i < dim; i++)
        store_value(out, i, load_value(weight, i, bf16) * rounded(load_value(h, i, bf16) * inverse, bf16), bf16);
}

void conduit_add_rms_norm(void *h, const void *delta, const void *weight, int64_t rows, int64_t dim, float eps,
                          int bf16, void *out) {
    const size_t row_bytes = (size_t)dim * (bf16 ? 2 : 4);
#pragma omp parallel for schedule(static) if (rows * dim >= 65536)
    for (int64_t r = 0; r < rows; r++)
        norm_row((char *)h + r * row_bytes, delta == NULL ? NULL : (const char *)delta + r * row_bytes, weight, dim,
                 eps, bf16, (char *)out + r * row_bytes);
}
