/* The native kernels (kernels.h) as torch ops, torch.ops.<CONDUIT_OPS>.<name>, where native.py
 * builds this file once per instruction set with CONDUIT_OPS naming the build (conduit_avx2, ...),
 * so that every build this CPU runs can be loaded, and tested, in one process.
 *
 * The C kernels trust their arguments; each op here checks everything they read (shapes, dtypes,
 * contiguity, block ids and lengths against the cache) and refuses the rest with a ValueError.
 * No autograd: the engine runs under inference mode. native.py registers each op's fake (shape)
 * function, for torch.compile.
 */
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "kernels.h"

namespace {

constexpr int64_t LANES = 16;          // K and head_dim granularity of every build
constexpr int64_t MAX_HEAD_DIM = 256;  // decode_attention.c's MAX_CHUNKS * VL

bool float_type(const at::Tensor &t) {
    return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kFloat;
}

void check_plain(const at::Tensor &t, const char *op, const char *name) {
    TORCH_CHECK_VALUE(t.device().is_cpu() && t.is_contiguous(), op, ": ", name, " must be a contiguous CPU tensor");
}

void check_ok(int failed, const char *op) { TORCH_CHECK(!failed, op, ": no memory for its scratch buffers"); }

// int8 weights [n, k] with float32 scales [n].
void check_weights(const at::Tensor &weight, const at::Tensor &scales, int64_t n, const char *op) {
    check_plain(weight, op, "weight");
    check_plain(scales, op, "scales");
    TORCH_CHECK_VALUE(weight.scalar_type() == at::kChar, op, ": int8 weights expected, not ", weight.scalar_type());
    TORCH_CHECK_VALUE(scales.scalar_type() == at::kFloat && scales.dim() == 1 && scales.size(0) == n, op,
                      ": float32 scales [", n, "] expected, not ", scales.sizes(), " ", scales.scalar_type());
}

at::Tensor check_rows(const at::Tensor &rows, int64_t k, int64_t n, const char *op) {
    TORCH_CHECK_VALUE(rows.device().is_cpu() && float_type(rows) && rows.dim() == 2 && rows.size(1) == k, op,
                      ": rows ", rows.sizes(), " ", rows.scalar_type(), " against weight [", n, ", ", k,
                      "]: bf16 or float32 CPU rows expected");
    return rows.contiguous();
}

at::Tensor int8_matmul(const at::Tensor &rows, const at::Tensor &weight, const at::Tensor &scales) {
    TORCH_CHECK_VALUE(weight.dim() == 2 && weight.size(1) % LANES == 0, "int8_matmul: weight ", weight.sizes(),
                      ": [n, k] with k a multiple of ", LANES, " expected");
    const int64_t n = weight.size(0), k = weight.size(1);
    check_weights(weight, scales, n, "int8_matmul");
    const at::Tensor x = check_rows(rows, k, n, "int8_matmul");
    at::Tensor out = at::empty({x.size(0), n}, x.options());
    if (x.size(0))
        check_ok(conduit_int8_matmul(x.data_ptr(), x.scalar_type() == at::kBFloat16, x.size(0), k,
                                     weight.data_ptr<int8_t>(), scales.data_ptr<float>(), out.data_ptr(), n),
                 "int8_matmul");
    return out;
}

at::Tensor int8_pack(const at::Tensor &weight) {
    check_plain(weight, "int8_pack", "weight");
    TORCH_CHECK_VALUE(weight.scalar_type() == at::kChar && weight.dim() == 2 && weight.size(1) % LANES == 0,
                      "int8_pack: int8 weights [n, k] with k a multiple of ", LANES, " expected");
    const int64_t n = weight.size(0), k = weight.size(1), panel = conduit_int8_panel();
    at::Tensor packed = at::empty({(n + panel - 1) / panel, k, panel}, weight.options());
    conduit_int8_pack(weight.data_ptr<int8_t>(), n, k, packed.data_ptr<int8_t>());
    return packed;
}

at::Tensor int8_gemm(const at::Tensor &rows, const at::Tensor &packed, const at::Tensor &scales, int64_t n) {
    const int64_t panel = conduit_int8_panel();
    check_plain(packed, "int8_gemm", "packed");
    TORCH_CHECK_VALUE(packed.scalar_type() == at::kChar && packed.dim() == 3 && packed.size(2) == panel && n > 0 &&
                          packed.size(0) == (n + panel - 1) / panel,
                      "int8_gemm: packed ", packed.sizes(), " is not int8_pack's layout of ", n, " channels");
    const int64_t k = packed.size(1);
    check_weights(packed, scales, n, "int8_gemm");
    const at::Tensor x = check_rows(rows, k, n, "int8_gemm");
    at::Tensor out = at::empty({x.size(0), n}, x.options());
    if (x.size(0))
        check_ok(conduit_int8_gemm(x.data_ptr(), x.scalar_type() == at::kBFloat16, x.size(0), k,
                                   packed.data_ptr<int8_t>(), scales.data_ptr<float>(), out.data_ptr(), n),
                 "int8_gemm");
    return out;
}

at::Tensor decode_attention(const at::Tensor &query, const at::Tensor &k_cache, const at::Tensor &v_cache,
                            const at::Tensor &block_ids, const at::Tensor &lens, int64_t block_size, int64_t window,
                            double scale) {
    const char *op = "decode_attention";
    check_plain(k_cache, op, "k_cache");
    check_plain(v_cache, op, "v_cache");
    check_plain(block_ids, op, "block_ids");
    check_plain(lens, op, "lens");
    TORCH_CHECK_VALUE(k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes() && float_type(k_cache) &&
                          v_cache.scalar_type() == k_cache.scalar_type(),
                      op, ": k and v caches [slots, kv_heads, head_dim] of one dtype expected");
    const int64_t slots = k_cache.size(0), kv_heads = k_cache.size(1), head_dim = k_cache.size(2);
    TORCH_CHECK_VALUE(query.device().is_cpu() && query.dim() == 3 && query.scalar_type() == k_cache.scalar_type() &&
                          query.size(2) == head_dim,
                      op, ": query ", query.sizes(), " ", query.scalar_type(), " against cache ", k_cache.sizes(),
                      " ", k_cache.scalar_type());
    const int64_t rows = query.size(0), q_heads = query.size(1);
    TORCH_CHECK_VALUE(head_dim % LANES == 0 && head_dim <= MAX_HEAD_DIM && kv_heads > 0 && q_heads % kv_heads == 0,
                      op, ": head_dim ", head_dim, " (a multiple of ", LANES, ", at most ", MAX_HEAD_DIM,
                      ") and ", q_heads, " query heads over ", kv_heads, " kv heads cannot be computed");
    TORCH_CHECK_VALUE(block_ids.scalar_type() == at::kLong && lens.scalar_type() == at::kLong && lens.dim() == 1 &&
                          lens.size(0) == rows && (rows == 0 || block_ids.numel() % rows == 0),
                      op, ": block ids and lengths must be int64, one length per row");
    TORCH_CHECK_VALUE(block_size > 0 && slots % block_size == 0 && window >= 0, op, ": block size ", block_size,
                      " and window ", window, " against ", slots, " cache slots");
    const int64_t width = rows ? block_ids.numel() / rows : 0, blocks = slots / block_size;
    const int64_t *ids = block_ids.data_ptr<int64_t>(), *len = lens.data_ptr<int64_t>();
    for (int64_t r = 0; r < rows; r++) {  // what the kernel reads: each row's blocks, up to its length
        TORCH_CHECK_VALUE(len[r] > 0 && len[r] <= width * block_size, op, ": row ", r, " has length ", len[r],
                          " past its ", width, " blocks");
        for (int64_t b = 0; b < (len[r] + block_size - 1) / block_size; b++)
            TORCH_CHECK_VALUE(ids[r * width + b] >= 0 && ids[r * width + b] < blocks, op, ": row ", r,
                              " names block ", ids[r * width + b], " of ", blocks);
    }
    // Rows and heads may be strided (views of the fused projection); each head's values must be contiguous.
    const at::Tensor q = query.stride(2) == 1 ? query : query.contiguous();
    at::Tensor out = at::empty({rows, q_heads, head_dim}, q.options());
    if (rows)
        check_ok(conduit_decode_attention(q.data_ptr(), q.stride(0), q.stride(1), k_cache.data_ptr(),
                                          v_cache.data_ptr(), ids, width, len, rows, q_heads, kv_heads, head_dim,
                                          block_size, window, static_cast<float>(scale),
                                          q.scalar_type() == at::kBFloat16, out.data_ptr()),
                 op);
    return out;
}

// h += delta (when given, in place), then LlamaRMSNorm of h times weight, returned.
at::Tensor add_rms_norm(const at::Tensor &h, const std::optional<at::Tensor> &delta, const at::Tensor &weight,
                        double eps) {
    const char *op = "add_rms_norm";
    check_plain(h, op, "h");
    check_plain(weight, op, "weight");
    TORCH_CHECK_VALUE(float_type(h) && h.dim() == 2 && weight.scalar_type() == h.scalar_type() &&
                          weight.dim() == 1 && weight.size(0) == h.size(1),
                      op, ": h ", h.sizes(), " ", h.scalar_type(), " and weight ", weight.sizes(), " ",
                      weight.scalar_type(), ": bf16 or float32 [rows, dim] and [dim] of one dtype expected");
    if (delta.has_value()) {
        check_plain(*delta, op, "delta");
        TORCH_CHECK_VALUE(delta->sizes() == h.sizes() && delta->scalar_type() == h.scalar_type(), op, ": delta ",
                          delta->sizes(), " ", delta->scalar_type(), " against h ", h.sizes(), " ", h.scalar_type());
    }
    at::Tensor out = at::empty_like(h);
    conduit_add_rms_norm(h.data_ptr(), delta.has_value() ? delta->data_ptr() : nullptr, weight.data_ptr(), h.size(0),
                         h.size(1), static_cast<float>(eps), h.scalar_type() == at::kBFloat16, out.data_ptr());
    return out;
}

}  // namespace

// TORCH_LIBRARY pastes its namespace argument as written: one more macro expands CONDUIT_OPS first.
#define CONDUIT_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define CONDUIT_LIBRARY_IMPL(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)

CONDUIT_LIBRARY(CONDUIT_OPS, m) {
    // No tensors: a catch-all kernel, for the fake int8_pack's shape.
    m.def("int8_panel() -> int", []() -> int64_t { return conduit_int8_panel(); });
    m.def("int8_matmul(Tensor rows, Tensor weight, Tensor scales) -> Tensor");
    m.def("int8_pack(Tensor weight) -> Tensor");
    m.def("int8_gemm(Tensor rows, Tensor packed, Tensor scales, int n) -> Tensor");
    m.def("decode_attention(Tensor query, Tensor k_cache, Tensor v_cache, Tensor block_ids, Tensor lens, "
          "int block_size, int window, float scale) -> Tensor");
    m.def("add_rms_norm(Tensor(a!) h, Tensor? delta, Tensor weight, float eps) -> Tensor");
}

// CPU kernels only: fake tensors (torch.compile's tracing) take the fake functions native.py registers.
CONDUIT_LIBRARY_IMPL(CONDUIT_OPS, CPU, m) {
    m.impl("int8_matmul", &int8_matmul);
    m.impl("int8_pack", &int8_pack);
    m.impl("int8_gemm", &int8_gemm);
    m.impl("decode_attention", &decode_attention);
    m.impl("add_rms_norm", &add_rms_norm);
}
