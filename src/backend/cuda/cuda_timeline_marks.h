// What the kernels of a timeline build (cuda_timeline.h) write their marks with; kept apart from
// the host side so that CUDA sources include nothing more.
#pragma once

namespace kiln::cuda {

struct TimelineControl {
  unsigned long long* marks = nullptr;  // [0]: the next slot; then (started, ready, shape) per kernel
  unsigned long long capacity = 0;      // slots
  int early_trigger = 0;
};

// Every CUDA translation unit has its own copy of the device-side control; each registers a setter.
void register_timeline_unit(void (*set)(const TimelineControl&));
// Notes a kernel launched while a graph is recorded: name, blocks and threads a block.
void timeline_note_launch(const void* kernel, unsigned blocks, unsigned threads);

}  // namespace kiln::cuda
