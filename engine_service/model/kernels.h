/* The native kernels' C entry points (int8_matmul.c, decode_attention.c, rms_norm.c), declared once
 * for their definitions and for native_ops.cpp, which binds them as torch ops and checks every
 * shape, dtype and index they read before calling them: these functions trust their arguments.
 * Those returning int return 0, or -1 when their scratch memory could not be allocated.
 */
#ifndef CONDUIT_KERNELS_H
#define CONDUIT_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* y [m, n] = x [m, k] . w [n, k]^T * scales [n]; x and y bf16 (x_bf16) or float32, K a multiple of 16. */
int conduit_int8_matmul(const void *x, int x_bf16, int64_t m_len, int64_t k, const int8_t *w, const float *scales,
                        void *y, int64_t n);
/* Output channels per panel of the GEMM's packed weights. */
int conduit_int8_panel(void);
/* packed [ceil(n / panel)][k][panel] from w [n, k]; channels past n are zeros. */
void conduit_int8_pack(const int8_t *w, int64_t n, int64_t k, int8_t *packed);
/* As conduit_int8_matmul, on weights from conduit_int8_pack. */
int conduit_int8_gemm(const void *x, int x_bf16, int64_t m_len, int64_t k, const int8_t *packed,
                      const float *scales, void *y, int64_t n);

int conduit_decode_attention(const void *q, int64_t q_row_stride, int64_t q_head_stride, const void *k_cache,
                             const void *v_cache, const int64_t *block_ids, int64_t table_width,
                             const int64_t *lens, int64_t batch, int64_t q_heads, int64_t kv_heads,
                             int64_t head_dim, int64_t block_size, int64_t window, float scale, int bf16,
                             void *out);

void conduit_add_rms_norm(void *h, const void *delta, const void *weight, int64_t rows, int64_t dim, float eps,
                          int bf16, void *out);

#ifdef __cplusplus
}
#endif

#endif
