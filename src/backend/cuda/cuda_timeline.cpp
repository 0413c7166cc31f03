#include "backend/cuda/cuda_timeline.h"

#include <algorithm>
#include <cstdlib>

namespace kiln::cuda {
namespace {

constexpr unsigned long long kSlots = 1 << 16;
constexpr int kMarkedReplays = 32;

std::vector<void (*)(const TimelineControl&)>& units() {
  static std::vector<void (*)(const TimelineControl&)> setters;  // filled by static initialisers
  return setters;
}

struct Recording {
  bool on = false;
  std::vector<std::string> kernels;
};

Recording& recording() {
  static Recording r;
  return r;
}

}  // namespace

void register_timeline_unit(void (*set)(const TimelineControl&)) {
  units().push_back(set);
}

void timeline_note_launch(const void* kernel, unsigned blocks, unsigned threads) {
  if (!recording().on) return;
  const char* name = nullptr;
  if (cudaFuncGetName(&name, kernel) != cudaSuccess || !name) name = "?";
  recording().kernels.push_back(std::string(name) + "," + std::to_string(blocks) + "," + std::to_string(threads));
}

DecodeTimeline::~DecodeTimeline() {
  if (marks_) cudaFree(marks_);
  if (file_) std::fclose(file_);
}

Status DecodeTimeline::open() {
  TimelineControl control;
  if (const char* early = std::getenv("KILN_PDL_EARLY")) control.early_trigger = std::atoi(early);
  if (const char* path = std::getenv("KILN_TIMELINE")) {
    file_ = std::fopen(path, "w");
    if (!file_) return make_error("cannot write the timeline to {}", path);
    std::fprintf(file_, "replay,slot,kernel,blocks,threads,marked_blocks,marked_threads,started_ns,ready_ns\n");
    if (cudaMalloc(&marks_, sizeof(unsigned long long) * (1 + 3 * kSlots)) != cudaSuccess)
      return make_error("cannot allocate the timeline");
    cudaMemset(marks_, 0, sizeof(unsigned long long));
    control.marks = marks_;
    control.capacity = kSlots;
  }
  for (auto set : units()) set(control);
  return ok_status();
}

void DecodeTimeline::begin_recording() {
  recording() = Recording{.on = true};
}

std::vector<std::string> DecodeTimeline::end_recording() {
  recording().on = false;
  return std::move(recording().kernels);
}

bool DecodeTimeline::before_replay(int replay, cudaStream_t stream) {
  if (!file_ || replay >= kMarkedReplays) return false;
  cudaMemsetAsync(marks_, 0, sizeof(unsigned long long), stream);
  return true;
}

// The replay's marks in the order the kernels took their slots, which is launch order.
void DecodeTimeline::after_replay(int replay, const std::vector<std::string>& kernels, cudaStream_t stream) {
  unsigned long long count = 0;
  cudaMemcpyAsync(&count, marks_, sizeof count, cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  count = std::min(count, kSlots);
  std::vector<unsigned long long> marks(3 * count);
  cudaMemcpy(marks.data(), marks_ + 1, sizeof(unsigned long long) * marks.size(), cudaMemcpyDeviceToHost);
  for (unsigned long long i = 0; i < count; ++i)
    std::fprintf(file_, "%d,%llu,%s,%llu,%llu,%llu,%llu\n", replay, i,
                 i < kernels.size() ? kernels[i].c_str() : "?,0,0", marks[3 * i + 2] >> 32,
                 marks[3 * i + 2] & 0xffffffffull, marks[3 * i], marks[3 * i + 1]);
  std::fflush(file_);
}

}  // namespace kiln::cuda
