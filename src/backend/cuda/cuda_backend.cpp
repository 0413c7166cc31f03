// CUDA backend: device memory (stream-ordered pool), cuBLAS matrix products, and the dispatch of
// every op to its kernels.
#include <cublas_v2.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_ops.cuh"
#include "backend/cuda/cuda_timeline.h"
#include "ops/op_profile.h"
#include "quant/affine.h"
#include "quant/tiles.h"

namespace kiln {

namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

bool is_float(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16;
}

struct ArenaFull {};

// The workspace a recorded graph's temporaries live in.
struct Arena {
  std::shared_ptr<void> base;
  size_t size = 0;
  size_t used = 0;
};

class CudaBackend;

class CudaGraph final : public Backend::Graph {
 public:
  CudaGraph(CudaBackend* backend, cudaGraphExec_t exec, std::shared_ptr<Arena> workspace,
            std::vector<std::string> kernels)
      : backend_(backend), exec_(exec), workspace_(std::move(workspace)), kernels_(std::move(kernels)) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  Status replay() override;

 private:
  CudaBackend* backend_;
  cudaGraphExec_t exec_;
  std::shared_ptr<Arena> workspace_;
  std::vector<std::string> kernels_;  // in launch order, in timeline builds
  int replays_ = 0;
};

class CudaBackend final : public Backend {
 public:
  // Times one op with device events while profiling is on.
  struct OpTimer {
    CudaBackend* backend;
    const char* name;
    cudaEvent_t begin = nullptr;
    OpTimer(CudaBackend* b, const char* n) : backend(b), name(n) {
      if (!backend->profiling_) return;
      cudaEventCreate(&begin);
      cudaEventRecord(begin, backend->stream_);
    }
    ~OpTimer() {
      if (!begin) return;
      cudaEvent_t end = nullptr;
      cudaEventCreate(&end);
      cudaEventRecord(end, backend->stream_);
      backend->timings_.push_back({name, begin, end});
    }
  };

  CudaBackend(int device, const CudaBackendOptions& options) : device_(device), options_(options) {}
  ~CudaBackend() override {
    if (cublas_) cublasDestroy(cublas_);
    if (cublas_workspace_) cudaFree(cublas_workspace_);
    if (residual_done_) cudaFree(residual_done_);
    if (tile_scratch_.partials) cudaFree(tile_scratch_.partials);
    if (tile_scratch_.counts) cudaFree(tile_scratch_.counts);
    if (delta_done_) cudaFree(delta_done_);
    if (stream_) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }

  Status init() {
    if (cudaSetDevice(device_) != cudaSuccess) return make_error("cannot select CUDA device {}", device_);
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, device_);
    name_ = fmt::format("cuda:{} ({}, sm_{}{}{})", device_, prop.name, prop.major, prop.minor,
                        options_.tiled_quantized_weights ? ", tiled 4- and 8-bit weights" : "");
    if (prop.major < 8) return make_error("{}: kiln's CUDA kernels need compute capability 8.0 or newer", name_);
    if (cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess)
      return make_error("cannot create a CUDA stream");
    if (cublasCreate(&cublas_) != CUBLAS_STATUS_SUCCESS) return make_error("cannot initialise cuBLAS");
    cublasSetStream(cublas_, stream_);
    // a workspace of its own, so that cuBLAS allocates nothing while a graph is recorded
    if (cudaMalloc(&cublas_workspace_, kCublasWorkspace) != cudaSuccess)
      return make_error("cannot allocate cuBLAS workspace");
    cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspace);
    const size_t delta_counters = sizeof(unsigned) * cuda::kMaxDeltaSeqs * cuda::kMaxDeltaNormHeads;
    if (cudaMalloc(&residual_done_, sizeof(unsigned)) != cudaSuccess ||
        cudaMemset(residual_done_, 0, sizeof(unsigned)) != cudaSuccess ||
        cudaMalloc(&delta_done_, delta_counters) != cudaSuccess ||
        cudaMemset(delta_done_, 0, delta_counters) != cudaSuccess)
      return make_error("cannot allocate CUDA counters");
    cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH);
    KILN_TRY(timeline_.open());
#if KILN_CUDA_DECODE_FLOOR
    cuda::init_decode_floor();
#endif
    cudaDeviceGetDefaultMemPool(&pool_, device_);
    uint64_t keep = UINT64_MAX;  // freed blocks stay in the pool for the next forward
    cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep);
    return ok_status();
  }

  Device device() const override {
    return Device::cuda;
  }
  std::string name() const override {
    return name_;
  }
  DType activation_dtype() const override {
    return DType::bf16;
  }
  DType matrix_dtype() const override {
    return DType::bf16;
  }
  bool quantized_kv_caches() const override {
    return true;
  }
  Status status() const override {
    std::lock_guard<std::mutex> lock(error_mutex_);
    return first_error_.empty() ? ok_status() : Status(Error{first_error_});
  }

  Tensor alloc(DType dtype, Shape shape) override {
    const size_t bytes = std::max<size_t>(size_t(shape.numel()) * dtype_size(dtype), 1);
    if (arena_) {  // recording a graph: bump-allocate from its workspace
      const size_t rounded = (bytes + 255) / 256 * 256;
      if (arena_->used + rounded > arena_->size) throw ArenaFull{};
      char* p = static_cast<char*>(arena_->base.get()) + arena_->used;
      arena_->used += rounded;
      return Tensor(dtype, shape, p, arena_->base, Device::cuda);
    }
    void* p = nullptr;
    cudaError_t err = cudaMallocAsync(&p, (bytes + 255) / 256 * 256, stream_);
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw std::runtime_error(fmt::format("CUDA out of memory allocating {} bytes on {}", bytes, name_));
    }
    cudaStream_t stream = stream_;
    std::shared_ptr<void> owner(p, [stream](void* q) { cudaFreeAsync(q, stream); });
    return Tensor(dtype, shape, p, owner, Device::cuda);
  }

  // The prefill attention kernels load whole tiles of slots and weigh empty ones by zero: recycled
  // pool memory could hold NaN patterns, and 0 · NaN is NaN. Zeroed once, on the stream (not while
  // a graph is recorded: every replay would zero it again; caches are made before).
  Tensor alloc_cache(DType dtype, Shape shape) override {
    Tensor t = alloc(dtype, shape);
    if (!arena_) check(cudaMemsetAsync(t.data(), 0, t.nbytes(), stream_), "alloc_cache");
    return t;
  }

  Tensor upload(const Tensor& host, DType dtype) override {
    if (host.device() == Device::cuda) return host;
    const DType target = is_float(host.dtype()) ? dtype : host.dtype();
    Tensor out = alloc(target, host.shape());
    if (target == host.dtype() && host.contiguous()) {
      check(cudaMemcpyAsync(out.data(), host.data(), host.nbytes(), cudaMemcpyHostToDevice, stream_), "upload");
    } else {
      std::vector<char> staged(size_t(host.numel()) * dtype_size(target));
      convert_host(host, target, staged.data());
      check(cudaMemcpyAsync(out.data(), staged.data(), staged.size(), cudaMemcpyHostToDevice, stream_), "upload");
      check(cudaStreamSynchronize(stream_), "upload");  // `staged` dies here
    }
    return out;
  }

  // With options_.tiled_quantized_weights, 4- and 8-bit matrices in the tiled layout the streamed
  // decode products read (src/quant/tiles.h); otherwise the packed codes as they are. Scales and
  // biases in bf16, which the kernels read.
  Tensor upload_quantized(const Tensor& host) override {
    if (host.device() == Device::cuda) return host;
    const QuantParams& q = host.quant();
    if (options_.tiled_quantized_weights && quant::tileable(host)) {
      allocate_tile_scratch();
      const size_t bytes = size_t(quant::tile_layout(host).total_bytes());
      std::vector<uint8_t> staged(bytes);
      quant::write_tiles(host, staged.data());
      Tensor buffer = alloc(DType::u32, Shape{int64_t(bytes / 4)});
      check(cudaMemcpyAsync(buffer.data(), staged.data(), bytes, cudaMemcpyHostToDevice, stream_), "upload");
      check(cudaStreamSynchronize(stream_), "upload");  // `staged` dies here
      auto params = std::make_shared<QuantParams>();
      params->bits = q.bits;
      params->group_size = q.group_size;
      params->tiled_bytes = bytes;
      return Tensor(DType::u32, host.shape(), buffer.data(), buffer.owner(), Device::cuda)
          .with_quant(std::move(params));
    }
    Shape packed_shape = host.shape();
    packed_shape[-1] = host.cols() * q.bits / 32;
    Tensor packed = alloc(DType::u32, packed_shape);
    check(cudaMemcpyAsync(packed.data(), host.data(), host.nbytes(), cudaMemcpyHostToDevice, stream_), "upload");
    check(cudaStreamSynchronize(stream_), "upload");
    return quant::make_quantized(packed, upload(q.scales, DType::bf16), upload(q.biases, DType::bf16), host.shape(),
                                 q.bits, q.group_size);
  }

  Tensor to_host(const Tensor& t) override {
    Tensor contiguous = t;
    if (!t.contiguous()) {
      contiguous = alloc(t.dtype(), Shape{t.rows(), t.cols()});
      copy(t, contiguous);
    }
    Tensor raw = host_tensor(t.dtype(), t.shape());
    check(cudaMemcpyAsync(raw.data(), contiguous.data(), raw.nbytes(), cudaMemcpyDeviceToHost, stream_), "to_host");
    check(cudaStreamSynchronize(stream_), "to_host");
    if (!is_float(t.dtype()) || t.dtype() == DType::f32) return raw;
    Tensor out = host_tensor(DType::f32, t.shape());
    convert_host(raw, DType::f32, out.data());
    return out;
  }

  void copy(const Tensor& src, Tensor& dst) override {
    const size_t esize = dtype_size(src.dtype());
    check(cudaMemcpy2DAsync(dst.data(), size_t(dst.row_stride()) * esize, src.data(), size_t(src.row_stride()) * esize,
                            size_t(src.cols()) * esize, size_t(src.rows()), cudaMemcpyDefault, stream_),
          "copy");
  }
  void fill(Tensor& t, float value) override {
    cuda::fill(t, value, stream_);
    after_launch("fill");
  }
  void synchronize() override {
    check(cudaStreamSynchronize(stream_), "synchronize");
  }

  void set_profiling(bool on) override {
    profiling_ = on && !arena_;
    if (on) timings_.clear();
  }

  std::string profile_report() override {
    cudaStreamSynchronize(stream_);
    OpProfile profile;
    for (const Timing& t : timings_) {
      float ms = 0;
      cudaEventElapsedTime(&ms, t.begin, t.end);
      profile.add(t.name, ms);
      cudaEventDestroy(t.begin);
      cudaEventDestroy(t.end);
    }
    timings_.clear();
    return profile.report();
  }

  std::unique_ptr<Timer> timer() override {
    struct EventTimer : Timer {
      cudaStream_t stream;
      cudaEvent_t begin = nullptr, end = nullptr;
      explicit EventTimer(cudaStream_t s) : stream(s) {
        cudaEventCreate(&begin);
        cudaEventCreate(&end);
      }
      ~EventTimer() override {
        cudaEventDestroy(begin);
        cudaEventDestroy(end);
      }
      void start() override { cudaEventRecord(begin, stream); }
      double stop_ms() override {
        cudaEventRecord(end, stream);
        cudaEventSynchronize(end);
        float ms = 0;
        cudaEventElapsedTime(&ms, begin, end);
        return ms;
      }
    };
    return std::make_unique<EventTimer>(stream_);
  }

  size_t peak_memory_bytes() const override {
    uint64_t value = 0;
    cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &value);
    return size_t(value) + arena_bytes_;
  }
  void reset_peak_memory() override {
    uint64_t zero = 0;
    cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &zero);
  }

  double copy_bandwidth() override {
    const size_t bytes = size_t(1) << 30;
    Tensor a = alloc(DType::u8, Shape{int64_t(bytes)}), b = alloc(DType::u8, Shape{int64_t(bytes)});
    cudaMemsetAsync(a.data(), 1, bytes, stream_);
    auto t = timer();
    std::vector<double> ms;
    for (int i = 0; i < 12; ++i) {
      t->start();
      cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, stream_);
      ms.push_back(t->stop_ms());
    }
    std::sort(ms.begin() + 2, ms.end());  // the first two are warm-up
    return 2.0 * double(bytes) / (ms[2 + (ms.size() - 2) / 2] * 1e-3);
  }

  Result<std::unique_ptr<Graph>> capture(const std::function<Status()>& record) override {
    // Temporaries come from a workspace that belongs to the graph, so that their addresses stay
    // fixed from one replay to the next; it grows until the recording fits.
    for (size_t size = size_t(64) << 20; size <= (size_t(16) << 30); size *= 4) {
      auto workspace = std::make_shared<Arena>();
      workspace->size = size;
      void* base = nullptr;
      check(cudaStreamSynchronize(stream_), "capture");
      if (cudaMalloc(&base, size) != cudaSuccess)
        return make_error("CUDA out of memory for a {}-byte graph workspace", size);
      workspace->base = std::shared_ptr<void>(base, [](void* p) { cudaFree(p); });
      arena_ = workspace;
      cudaGraph_t graph = nullptr;
      timeline_.begin_recording();
      if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        arena_.reset();
        return make_error("cannot start recording a CUDA graph");
      }
      Status recorded = ok_status();
      bool full = false;
      try {
        recorded = record();
      } catch (const ArenaFull&) {
        full = true;
      }
      cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
      arena_.reset();
      std::vector<std::string> kernels = timeline_.end_recording();
      if (full) {
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        continue;
      }
      KILN_TRY(recorded);
      if (ended != cudaSuccess || !graph) {
        cudaGetLastError();
        return make_error("recording a CUDA graph failed: {}", cudaGetErrorString(ended));
      }
      cudaGraphExec_t exec = nullptr;
      cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
      cudaGraphDestroy(graph);
      if (made != cudaSuccess) return make_error("instantiating a CUDA graph failed: {}", cudaGetErrorString(made));
      arena_bytes_ += size;
      return std::unique_ptr<Graph>(std::make_unique<CudaGraph>(this, exec, workspace, std::move(kernels)));
    }
    return make_error("a CUDA graph needs more than 16 GiB of workspace");
  }

  void matmul(const Tensor& x, const Tensor& w, Tensor& out) override {
    if (w.quantized()) return quantized_matmul(x, w, out);
    OpTimer timed(this, "matmul");
    const int64_t m = x.rows(), k = x.cols(), n = w.numel() / k;
    if (m == 0) return;
    Tensor input = x;
    if (x.dtype() != w.dtype()) {  // cuBLAS wants both operands in one type
      input = alloc(w.dtype(), Shape{m, k});
      cuda::convert(x, input, stream_);
    }
    if (cuda::small_matmul(input, w, out, stream_)) {
      after_launch("small_matmul");
      return;
    }
    const int64_t ldc = out.cols() == n ? out.row_stride() : n;
    const float alpha = 1.0f, beta = 0.0f;
    // row-major out[m,n] = x[m,k] · w[n,k]ᵀ is column-major outᵀ[n,m] = w(ᵀ of [k,n]) · xᵀ
    cublasStatus_t st =
        cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &alpha, w.data(), cuda_type(w.dtype()),
                     int(k), input.data(), cuda_type(input.dtype()), int(input.row_stride()), &beta, out.data(),
                     cuda_type(out.dtype()), int(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) record(fmt::format("cublasGemmEx failed ({}) for {}x{}x{}", int(st), m, n, k));
  }
  void matmul_many(const Tensor& x, std::span<const MatmulProduct> products) override {
    std::vector<Tensor> weights, outs;
    bool all_quantized = true;
    for (const MatmulProduct& p : products) {
      weights.push_back(p.weight);
      outs.push_back(p.out);
      all_quantized = all_quantized && p.weight.quantized();
    }
    if (all_quantized && x.rows() >= 1 && x.rows() <= kGemvRows) {
      OpTimer timed(this, "qmatmul");
      const Tensor input = quantized_input(x);
      if (cuda::tiled_gemv_many(input, weights.data(), outs.data(), int(outs.size()), tile_scratch_, stream_)) {
        after_launch("tiled_gemv_many");
        return;
      }
      if (cuda::quantized_gemv_many(input, weights.data(), outs.data(), int(outs.size()), stream_)) {
        after_launch("quantized_gemv_many");
        return;
      }
    } else if (!all_quantized) {
      OpTimer timed(this, "matmul");
      if (cuda::small_matmul_many(x, weights.data(), outs.data(), int(outs.size()), stream_)) {
        after_launch("small_matmul_many");
        return;
      }
    }
    Backend::matmul_many(x, products);
  }
  void glu_matmul(const Tensor& x, const Tensor& gate, const Tensor& up, Activation act, Tensor& out) override {
    if (gate.quantized() && up.quantized()) {
      if (x.rows() >= 1 && x.rows() <= kGemvRows) {
        OpTimer timed(this, "qmatmul");
        const Tensor input = quantized_input(x);
        if (cuda::tiled_glu_gemv(input, gate, up, act, out, tile_scratch_, stream_)) {
          after_launch("tiled_glu_gemv");
          return;
        }
        if (cuda::quantized_glu_gemv(input, gate, up, act, out, stream_)) {
          after_launch("quantized_glu_gemv");
          return;
        }
      }
    } else {
      OpTimer timed(this, "matmul");
      if (cuda::small_glu_matmul(x, gate, up, act, out, stream_)) {
        after_launch("small_glu_matmul");
        return;
      }
    }
    Backend::glu_matmul(x, gate, up, act, out);
  }
  void embed(const Tensor& ids, const Tensor& table, float scale, Tensor& out) override {
    OpTimer timed(this, "embed");
    if (table.quantized()) {
      cuda::quantized_embed(ids, table, scale, out, stream_);
      return after_launch("quantized_embed");
    }
    cuda::embed(ids, table, scale, out, stream_);
    after_launch("embed");
  }
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, float weight_offset, Tensor& out) override {
    OpTimer timed(this, "rms_norm");
    cuda::rms_norm(x, weight, eps, weight_offset, out, stream_);
    after_launch("rms_norm");
  }
  void rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, float eps, Tensor& out) override {
    OpTimer timed(this, "rms_norm_gated");
    cuda::rms_norm_gated(x, z, weight, eps, out, stream_);
    after_launch("rms_norm_gated");
  }
  void add(const Tensor& a, const Tensor& b, float scale, Tensor& out) override {
    OpTimer timed(this, "add");
    cuda::add(a, b, scale, out, stream_);
    after_launch("add");
  }
  void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out) override {
    OpTimer timed(this, "layer_norm");
    cuda::layer_norm(x, weight, bias, eps, out, stream_);
    after_launch("layer_norm");
  }
  void bias_act(const Tensor& x, const Tensor& bias, BiasActivation act, Tensor& out) override {
    OpTimer timed(this, "bias_act");
    cuda::bias_act(x, bias, act, out, stream_);
    after_launch("bias_act");
  }
  void residual_norm(const ResidualNormArgs& args) override {
    if (args.residual.cols() > cuda::kMaxResidualNormCols) {  // wider than any released model: the plain ops
      Tensor residual = args.residual, block = args.block_out;
      if (args.block_norm.defined()) {
        block = alloc(activation_dtype(), Shape{block.rows(), block.cols()});
        rms_norm(args.block_out, args.block_norm, args.eps, args.norm_offset, block);
      }
      add(residual, block, args.scale, residual);
      if (args.next.defined()) {
        Tensor next = args.next;
        rms_norm(residual, args.next_norm, args.eps, args.norm_offset, next);
      }
      for (size_t i = 0; i < args.more_next.size(); ++i) {
        if (!args.more_next[i].defined()) continue;
        Tensor next = args.more_next[i];
        rms_norm(residual, args.more_next_norm[i], args.eps, args.norm_offset, next);
      }
      return;
    }
    OpTimer timed(this, "residual_norm");
    cuda::residual_norm(args, stream_);
    after_launch("residual_norm");
  }
  void matmul_residual_norm(const Tensor& x, const Tensor& w, const ResidualNormArgs& args) override {
    if (x.rows() >= 1 && x.rows() <= cuda::kMaxFusedResidualRows &&
        args.residual.cols() <= cuda::kMaxResidualNormCols) {
      OpTimer timed(this, "matmul_residual_norm");
      if (!w.quantized() && cuda::small_matmul_residual_norm(x, w, args, residual_done_, stream_))
        return after_launch("small_matmul_residual_norm");
      if (w.quantized() && cuda::tiled_gemv_residual_norm(x, w, args, residual_done_, tile_scratch_, stream_))
        return after_launch("tiled_gemv_residual_norm");
      if (w.quantized() && cuda::quantized_gemv_residual_norm(x, w, args, residual_done_, stream_))
        return after_launch("quantized_gemv_residual_norm");
    }
    Backend::matmul_residual_norm(x, w, args);
  }
  void scale(const Tensor& x, float s, Tensor& out) override {
    OpTimer timed(this, "scale");
    cuda::scale(x, s, out, stream_);
    after_launch("scale");
  }
  void glu(const Tensor& gate, const Tensor& up, Activation act, Tensor& out) override {
    OpTimer timed(this, "glu");
    cuda::glu(gate, up, act, out, stream_);
    after_launch("glu");
  }
  void sigmoid_mul(const Tensor& x, const Tensor& gate, Tensor& out) override {
    OpTimer timed(this, "sigmoid_mul");
    cuda::sigmoid_mul(x, gate, out, stream_);
    after_launch("sigmoid_mul");
  }
  void add_sigmoid_gated(Tensor& acc, const Tensor& x, const Tensor& gate) override {
    OpTimer timed(this, "add_sigmoid_gated");
    cuda::add_sigmoid_gated(acc, x, gate, stream_);
    after_launch("add_sigmoid_gated");
  }
  void softcap(Tensor& x, float cap) override {
    OpTimer timed(this, "softcap");
    cuda::softcap(x, cap, stream_);
    after_launch("softcap");
  }
  void clamp(const Tensor& x, float lo, float hi, Tensor& out) override {
    OpTimer timed(this, "clamp");
    cuda::clamp(x, lo, hi, out, stream_);
    after_launch("clamp");
  }
  void column_affine(const Tensor& x, float scale, const Tensor& shift, const Tensor& mul, Tensor& out) override {
    OpTimer timed(this, "column_affine");
    cuda::column_affine(x, scale, shift, mul, out, stream_);
    after_launch("column_affine");
  }
  void gather_sum(const Tensor& ids, const Tensor& table, float scale, Tensor& out) override {
    OpTimer timed(this, "gather_sum");
    cuda::gather_sum(ids, table, scale, out, stream_);
    after_launch("gather_sum");
  }
  void argmax(const Tensor& x, Tensor& out) override {
    OpTimer timed(this, "argmax");
    cuda::argmax(
        x, out, [this](DType t, Shape s) { return alloc(t, s); }, stream_);
    after_launch("argmax");
  }
  void top_k(const Tensor& logits, const Tensor& temperatures, int k, Tensor& values, Tensor& ids) override {
    OpTimer timed(this, "top_k");
    if (k < 1 || k > kMaxTopK || k > logits.cols() || temperatures.numel() != logits.rows() ||
        temperatures.dtype() != DType::f32 || values.dtype() != DType::f32 || ids.dtype() != DType::i32 ||
        values.numel() != logits.rows() * k || ids.numel() != logits.rows() * k) {
      record(fmt::format("top_k: {} candidates of {} x {} logits do not fit the arguments", k, logits.rows(),
                         logits.cols()));
      return;
    }
    cuda::top_k(
        logits, temperatures, k, values, ids, [this](DType t, Shape s) { return alloc(t, s); }, stream_);
    after_launch("top_k");
  }

  void rope(const RopeArgs& args) override {
    OpTimer timed(this, "rope");
    cuda::rope(args, stream_);
    after_launch("rope");
  }
  void kv_write(const KvWriteArgs& args) override {
    OpTimer timed(this, "kv_write");
    if (!args.caches.empty() && args.caches[0].k.quantized()) {
      const int64_t head_dim = args.caches[0].k.dim(2);
      if (head_dim % 32 || head_dim > 512 || (head_dim & (head_dim - 1)))
        return record(
            fmt::format("CUDA quantized KV caches take head dims 32, 64, 128, 256 and 512, not {}", head_dim));
    }
    cuda::kv_write(args, stream_);
    after_launch("kv_write");
  }
  void attention_inputs(const AttentionInputsArgs& args) override {
    {
      OpTimer timed(this, "attention_inputs");
      if (cuda::attention_inputs(args, stream_)) return after_launch("attention_inputs");
    }
    Backend::attention_inputs(args);
  }
  void attention(const AttentionArgs& args) override {
    OpTimer timed(this, "attention");
    const int group = args.n_kv_heads > 0 ? args.n_heads / args.n_kv_heads : 0;
    if (!cuda::attention_supported(args.head_dim, group))
      return record(fmt::format("CUDA attention does not take head dim {} with {} query heads per KV head",
                                args.head_dim, group));
    cuda::attention(
        args, [this](DType t, Shape s) { return alloc(t, s); }, stream_);
    after_launch("attention");
  }
  void causal_conv1d(const CausalConvArgs& args) override {
    OpTimer timed(this, "causal_conv1d");
    const int64_t channels = args.x.cols(), kernel = channels ? args.weight.numel() / channels : 0;
    if (kernel < 1 || kernel > cuda::kMaxConvKernel)
      return record(
          fmt::format("CUDA causal conv takes kernels of 1 to {} taps, not {}", cuda::kMaxConvKernel, kernel));
    cuda::causal_conv1d(args, stream_);
    after_launch("causal_conv1d");
  }
  void gated_delta(const GatedDeltaArgs& args) override {
    OpTimer timed(this, "gated_delta");
    cuda::gated_delta(args, delta_done_, stream_);
    after_launch("gated_delta");
  }
  void moe_route(const MoeRouteArgs& args) override {
    OpTimer timed(this, "moe_route");
    if (args.logits.cols() > cuda::kMaxRoutedExperts || args.top_k < 1 || args.top_k > cuda::kMaxRoutedTopK)
      return record(fmt::format("CUDA routing takes up to {} experts and top-k 1 to {}, not {} and {}",
                                cuda::kMaxRoutedExperts, cuda::kMaxRoutedTopK, args.logits.cols(), args.top_k));
    cuda::moe_route(args, stream_);
    after_launch("moe_route");
  }
  void moe_experts(const MoeExpertsArgs& args) override {
    OpTimer timed(this, "moe_experts");
    if (args.gate.quantized() || args.up.quantized() || args.down.quantized()) {
      cuda::quantized_moe_experts(
          args, [this](DType t, Shape s) { return alloc(t, s); }, stream_);
      return after_launch("quantized_moe_experts");
    }
    cuda::moe_experts(
        args, [this](DType t, Shape s) { return alloc(t, s); }, stream_);
    after_launch("moe_experts");
  }

 private:
  // A product with a quantized weight: the fused GEMV (one pass over the packed weights per 8 rows)
  // up to kGemvRows rows; beyond that, blocks of weight rows dequantized to bf16 scratch and
  // multiplied by cuBLAS. A block holds at most kDequantBlock elements (64 Mi, 128 MiB), so scratch
  // never grows with the model. Per weight the GEMV reads ~0.56 bytes (4 bits) per pass, the
  // dequantized product ~0.56 + 2 written + 2 read: passes of the GEMV stay cheaper up to ~8 of
  // them, and at prefill sizes the product dominates either way.
  void quantized_matmul(const Tensor& x, const Tensor& w, Tensor& out) {
    OpTimer timed(this, "qmatmul");
    const int64_t m = x.rows(), k = x.cols(), n = w.rows();
    if (m == 0) return;
    const Tensor input = quantized_input(x);
    if (m <= kGemvRows && cuda::tiled_gemv_many(input, &w, &out, 1, tile_scratch_, stream_))
      return after_launch("tiled_gemv");
    if (m <= kGemvRows && cuda::quantized_gemv(input, w, out, stream_)) return after_launch("quantized_gemv");
    const int64_t ldc = out.cols() == n ? out.row_stride() : n;
    const int64_t block = std::min(n, std::max<int64_t>(64, kDequantBlock / k));
    Tensor scratch = alloc(DType::bf16, Shape{block, k});
    const float alpha = 1.0f, beta = 0.0f;
    for (int64_t n0 = 0; n0 < n; n0 += block) {
      const int64_t count = std::min(block, n - n0);
      cuda::dequantize_rows(w, n0, count, scratch, stream_);
      after_launch("dequantize_rows");
      char* dst = static_cast<char*>(out.data()) + size_t(n0) * dtype_size(out.dtype());
      cublasStatus_t st =
          cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(count), int(m), int(k), &alpha, scratch.data(),
                       CUDA_R_16BF, int(k), input.data(), CUDA_R_16BF, int(input.row_stride()), &beta, dst,
                       cuda_type(out.dtype()), int(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (st != CUBLAS_STATUS_SUCCESS)
        record(fmt::format("cublasGemmEx failed ({}) for {}x{}x{}", int(st), m, count, k));
    }
  }
  static constexpr int64_t kDequantBlock = int64_t(64) << 20;
  static constexpr int64_t kGemvRows = 32;

  // The input of a quantized product as its kernels read it: bf16 rows, 16-byte aligned.
  Tensor quantized_input(const Tensor& x) {
    const bool aligned = reinterpret_cast<uintptr_t>(x.data()) % 16 == 0 && x.row_stride() % 8 == 0;
    if (x.dtype() == DType::bf16 && aligned) return x;
    Tensor input = alloc(DType::bf16, Shape{x.rows(), x.cols()});
    cuda::convert(x, input, stream_);
    return input;
  }

  void record(const std::string& message) {
    std::lock_guard<std::mutex> lock(error_mutex_);
    if (first_error_.empty()) first_error_ = message;
  }
  void check(cudaError_t err, const char* what) {
    if (err != cudaSuccess) record(fmt::format("{}: {}", what, cudaGetErrorString(err)));
  }
  // Kernel launches report configuration errors through cudaGetLastError.
  void after_launch(const char* what) {
    check(cudaGetLastError(), what);
  }

  int device_;
  CudaBackendOptions options_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  mutable std::mutex error_mutex_;
  std::string first_error_;
  std::shared_ptr<Arena> arena_;  // set while recording a graph
  struct Timing {
    const char* name;
    cudaEvent_t begin, end;
  };
  bool profiling_ = false;
  std::vector<Timing> timings_;
  static constexpr size_t kCublasWorkspace = size_t(64) << 20;
  void* cublas_workspace_ = nullptr;
  // the count of finished blocks of a product fused with the residual update (zero between launches)
  unsigned* residual_done_ = nullptr;
  cuda::TileScratch tile_scratch_;  // allocated with the first tiled weight

  // The tiled products' partial sums (enough for their split choice to be made on shapes alone up
  // to a few thousand rows; larger products do not split) and row-block counts.
  void allocate_tile_scratch() {
    if (tile_scratch_.partials || tile_scratch_.counts) return;  // allocated (or tried) once
    constexpr int64_t kPartialFloats = int64_t(1) << 21, kCounts = 8192;
    check(cudaMalloc(&tile_scratch_.partials, kPartialFloats * sizeof(float)), "tiled products' scratch");
    check(cudaMalloc(&tile_scratch_.counts, kCounts * sizeof(unsigned)), "tiled products' scratch");
    check(cudaMemset(tile_scratch_.counts, 0, kCounts * sizeof(unsigned)), "tiled products' scratch");
    if (!tile_scratch_.partials || !tile_scratch_.counts) return;  // then no product splits its columns
    tile_scratch_.partial_floats = kPartialFloats;
    tile_scratch_.count_slots = kCounts;
  }
  unsigned* delta_done_ = nullptr;  // the delta rule's per-(sequence, head) counters
  size_t arena_bytes_ = 0;
  cuda::DecodeTimeline timeline_;

 public:
  cudaStream_t stream() const {
    return stream_;
  }
  cuda::DecodeTimeline& timeline() {
    return timeline_;
  }
  void note(cudaError_t err, const char* what) {
    check(err, what);
  }
};

Status CudaGraph::replay() {
  const bool marked = backend_->timeline().before_replay(replays_, backend_->stream());
  cudaError_t err = cudaGraphLaunch(exec_, backend_->stream());
  if (marked && err == cudaSuccess) backend_->timeline().after_replay(replays_++, kernels_, backend_->stream());
  if (err != cudaSuccess) return make_error("replaying a CUDA graph failed: {}", cudaGetErrorString(err));
  return backend_->status();
}

}  // namespace

bool cuda_device_present() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

Result<CudaDeviceInfo> cuda_device_info(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return make_error("no CUDA device {}", device);
  return CudaDeviceInfo{.name = prop.name,
                        .compute_capability = prop.major * 10 + prop.minor,
                        .total_memory = prop.totalGlobalMem,
                        .multiprocessors = prop.multiProcessorCount};
}

Result<std::unique_ptr<Backend>> make_cuda_backend(int device, const CudaBackendOptions& options) {
  if (!cuda_device_present()) return make_error("no CUDA device is present");
  auto backend = std::make_unique<CudaBackend>(device, options);
  KILN_TRY(backend->init());
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace kiln
