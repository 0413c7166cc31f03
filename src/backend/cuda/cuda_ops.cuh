// Kernel entry points of the CUDA backend, one per op; each .cu file implements one concern.
#pragma once

#include <cuda_runtime.h>

#include <functional>

#include "ops/op_args.h"

namespace kiln::cuda {

using Allocate = std::function<Tensor(DType, Shape)>;

// cuda_gemv.cu: out[m, n] = x[m, k] · w[n, k]ᵀ for a few rows (decode), bf16 weights; false when
// the shapes are not ones it handles (the caller then uses cuBLAS)
bool small_matmul(const Tensor& x, const Tensor& w, Tensor& out, cudaStream_t stream);
// Up to four products of the same input in one launch; false when not all of them fit the kernel.
bool small_matmul_many(const Tensor& x, const Tensor* weights, Tensor* outs, int count, cudaStream_t stream);
// args.block_out = x · wᵀ, then residual_norm(args), in one launch for up to kMaxFusedResidualRows
// rows; `done` is a zeroed device counter the launch leaves zeroed. False when the shapes do not fit.
constexpr int64_t kMaxFusedResidualRows = 2;
bool small_matmul_residual_norm(const Tensor& x, const Tensor& w, const ResidualNormArgs& args, unsigned* done,
                                cudaStream_t stream);
// out = act(x · gateᵀ) ⊙ (x · upᵀ) in one pass over both matrices; false when the shapes do not fit.
bool small_glu_matmul(const Tensor& x, const Tensor& gate, const Tensor& up, Activation act, Tensor& out,
                      cudaStream_t stream);

#if KILN_CUDA_DECODE_FLOOR
void init_decode_floor();  // developer builds: KILN_DECODE_FLOOR from the environment (cuda_quant_gemv.cu)
#endif

// cuda_elementwise.cu
void fill(Tensor& t, float value, cudaStream_t stream);
void convert(const Tensor& src, Tensor& dst, cudaStream_t stream);  // any float dtype to any float dtype
void embed(const Tensor& ids, const Tensor& table, float scale, Tensor& out, cudaStream_t stream);
void rms_norm(const Tensor& x, const Tensor& weight, float eps, float weight_offset, Tensor& out, cudaStream_t stream);
void rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, float eps, Tensor& out,
                    cudaStream_t stream);
void add(const Tensor& a, const Tensor& b, float scale, Tensor& out, cudaStream_t stream);
void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out, cudaStream_t stream);
void bias_act(const Tensor& x, const Tensor& bias, BiasActivation act, Tensor& out, cudaStream_t stream);
// rows of at most kMaxResidualNormCols columns
constexpr int64_t kMaxResidualNormCols = 16384;
void residual_norm(const ResidualNormArgs& args, cudaStream_t stream);
void scale(const Tensor& x, float s, Tensor& out, cudaStream_t stream);
void glu(const Tensor& gate, const Tensor& up, Activation act, Tensor& out, cudaStream_t stream);
void sigmoid_mul(const Tensor& x, const Tensor& gate, Tensor& out, cudaStream_t stream);
void add_sigmoid_gated(Tensor& acc, const Tensor& x, const Tensor& gate, cudaStream_t stream);
void softcap(Tensor& x, float cap, cudaStream_t stream);
void clamp(const Tensor& x, float lo, float hi, Tensor& out, cudaStream_t stream);
void column_affine(const Tensor& x, float scale, const Tensor& shift, const Tensor& mul, Tensor& out,
                   cudaStream_t stream);
void gather_sum(const Tensor& ids, const Tensor& table, float scale, Tensor& out, cudaStream_t stream);
void argmax(const Tensor& x, Tensor& out, const Allocate& alloc, cudaStream_t stream);  // scratch from alloc
// cuda_top_k.cu: Backend::top_k (float logits, f32 temperatures on the device); scratch from alloc.
void top_k(const Tensor& logits, const Tensor& temperatures, int k, Tensor& values, Tensor& ids, const Allocate& alloc,
           cudaStream_t stream);

// cuda_attention.cu
void rope(const RopeArgs& args, cudaStream_t stream);
void kv_write(const KvWriteArgs& args, cudaStream_t stream);
// rope(q), the value norm, rope(k) and kv_write in one launch; false (nothing launched) for
// arguments beyond it (heads wider than 512, more than 64 sequences, other dtypes than bf16).
bool attention_inputs(const AttentionInputsArgs& args, cudaStream_t stream);
void attention(const AttentionArgs& args, const Allocate& allocate, cudaStream_t stream);
// Whether attention() takes this head dim and number of query heads per KV head on this device.
bool attention_supported(int head_dim, int group);

// cuda_causal_conv.cu, cuda_delta_rule.cu
constexpr int kMaxConvKernel = 8;  // taps of the causal conv's window
void causal_conv1d(const CausalConvArgs& args, cudaStream_t stream);
// With args.norm_weight, the decode kernel takes the output norm, counting each (sequence, head) on
// done[sequence · n_v_heads + head] (kMaxDeltaSeqs · kMaxDeltaNormHeads zeroed counters, left zeroed).
constexpr int kMaxDeltaSeqs = 64;
constexpr int kMaxDeltaNormHeads = 256;
void gated_delta(const GatedDeltaArgs& args, unsigned* done, cudaStream_t stream);

// cuda_moe.cu: routing over at most kMaxRoutedExperts experts, top-k at most kMaxRoutedTopK
constexpr int kMaxRoutedExperts = 512;
constexpr int kMaxRoutedTopK = 32;
void moe_route(const MoeRouteArgs& args, cudaStream_t stream);
void moe_experts(const MoeExpertsArgs& args, const Allocate& allocate, cudaStream_t stream);
// out[t] = Σ_slot weights[t, slot] · y[t · top_k + slot], slots in order; y f32 [T · top_k, hidden]
void combine_experts(const Tensor& y, const Tensor& weights, const Tensor& out, cudaStream_t stream);
// The per-pair tensor-core expert kernels take every call of up to this many tokens (a
// batch-invariant serving step's decode rows); grouped_moe_experts only larger ones.
constexpr int64_t kMaxDecodeExpertTokens = 32;
// More tokens than decode takes, grouped by expert (bf16 or quantized stacks, sizes multiples of
// 64); false when the call does not fit (moe_experts and quantized_moe_experts then run per pair).
bool grouped_moe_experts(const MoeExpertsArgs& args, const Allocate& allocate, cudaStream_t stream);

// Quantized weights (MLX affine, src/quant/affine.h), scales and biases in bf16.
// cuda_quant_gemv.cu, the decode products: out[m, n] = x[m, k] · dequant(w)[n, k]ᵀ for a few rows,
// up to 8 rows of x a pass over the weights (bf16, 16-byte aligned rows), bf16 or f32 out; false
// when the tensors are not ones it handles (the caller then dequantizes for cuBLAS).
bool quantized_gemv(const Tensor& x, const Tensor& w, Tensor& out, cudaStream_t stream);
// Up to four products of one input in one launch, their weights quantized alike (width, group
// size); false when not all of them fit.
bool quantized_gemv_many(const Tensor& x, const Tensor* weights, Tensor* outs, int count, cudaStream_t stream);
// out = act(x · gateᵀ) ⊙ (x · upᵀ) in one pass over both quantized matrices; false when they do not fit.
bool quantized_glu_gemv(const Tensor& x, const Tensor& gate, const Tensor& up, Activation act, Tensor& out,
                        cudaStream_t stream);
// args.block_out = x · wᵀ (w quantized in 2, 4 or 8 bits), then residual_norm(args), in one launch for
// up to kMaxFusedResidualRows rows; false when the call does not fit. A row gets the bits of
// quantized_gemv followed by residual_norm.
bool quantized_gemv_residual_norm(const Tensor& x, const Tensor& w, const ResidualNormArgs& args, unsigned* done,
                                  cudaStream_t stream);
// cuda_quant_tiles.cu: the same products for weights in the tiled layout (src/quant/tiles.h; 4 and 8
// bits). Products whose columns split over SMs keep partial sums and a count per row block in
// `scratch` (counts zeroed, left zeroed); false when the call does not fit (the caller then
// dequantizes blocks of rows for cuBLAS, which reads either layout).
struct TileScratch {
  float* partials = nullptr;
  int64_t partial_floats = 0;
  unsigned* counts = nullptr;
  int64_t count_slots = 0;
};
bool tiled_gemv_many(const Tensor& x, const Tensor* weights, Tensor* outs, int count, const TileScratch& scratch,
                     cudaStream_t stream);
bool tiled_glu_gemv(const Tensor& x, const Tensor& gate, const Tensor& up, Activation act, Tensor& out,
                    const TileScratch& scratch, cudaStream_t stream);
bool tiled_gemv_residual_norm(const Tensor& x, const Tensor& w, const ResidualNormArgs& args, unsigned* done,
                              const TileScratch& scratch, cudaStream_t stream);
// cuda_quant.cu:
// rows [row_begin, row_begin + n_rows) of w, dequantized into out (bf16, [n_rows, k] contiguous)
void dequantize_rows(const Tensor& w, int64_t row_begin, int64_t n_rows, Tensor& out, cudaStream_t stream);
void quantized_embed(const Tensor& ids, const Tensor& table, float scale, Tensor& out, cudaStream_t stream);
// experts whose stacks are quantized (any of them; the others bf16)
void quantized_moe_experts(const MoeExpertsArgs& args, const Allocate& allocate, cudaStream_t stream);

}  // namespace kiln::cuda
