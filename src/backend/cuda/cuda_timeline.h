// A decode step's kernels as the GPU ran them, for developer builds (-DKILN_CUDA_TIMELINE=ON).
//
// A profiler times each kernel of a replayed graph alone, which hides what a decode step at batch 1
// is made of: the gaps between dependent launches. In a timeline build the first thread of every
// kernel's first block notes, in wait_for_inputs(), when it started and when its inputs became
// ready (%globaltimer); the time from one kernel's ready mark to the next one's is what the kernel
// adds to the step (tools/gpu/timeline-summary.py reads them). Set KILN_TIMELINE=FILE to write the
// first replays' marks there as CSV; KILN_PDL_EARLY=1 lets each kernel's dependents launch before
// its own wait instead of after it; KILN_DOT_PARTS_{PLAIN,GLU,RES}=N force the warps that share a
// tile of the integer products (cuda_quant_gemv.cu), KILN_QMMA_MIN_ROWS=N the input rows from which
// 4-bit products take the tensor cores (cuda_quant_mma.cu), KILN_DECODE_HEADS_PER_BLOCK=N the query
// heads a decode attention block takes (cuda_decode_attention.cu). In other builds DecodeTimeline does
// nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/cuda_timeline_marks.h"
#include "core/status.h"

namespace kiln::cuda {

// The host side, one per backend.
class DecodeTimeline {
 public:
#if KILN_CUDA_TIMELINE
  ~DecodeTimeline();
  Status open();  // from the environment; sets every unit's control
  void begin_recording();
  std::vector<std::string> end_recording();             // the kernels launched since begin_recording()
  bool before_replay(int replay, cudaStream_t stream);  // whether this replay is marked
  void after_replay(int replay, const std::vector<std::string>& kernels, cudaStream_t stream);

 private:
  unsigned long long* marks_ = nullptr;
  std::FILE* file_ = nullptr;
#else
  Status open() {
    return ok_status();
  }
  void begin_recording() {}
  std::vector<std::string> end_recording() {
    return {};
  }
  bool before_replay(int, cudaStream_t) {
    return false;
  }
  void after_replay(int, const std::vector<std::string>&, cudaStream_t) {}
#endif
};

}  // namespace kiln::cuda
