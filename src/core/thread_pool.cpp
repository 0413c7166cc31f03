#include "core/thread_pool.h"

#include <algorithm>

namespace kiln {

namespace {
thread_local bool in_pool_worker = false;
}

ThreadPool::ThreadPool(int n_threads) {
  for (int i = 1; i < std::max(1, n_threads); ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks() {
  for (;;) {
    int64_t begin = next_.fetch_add(job_chunk_);
    if (begin >= job_size_) break;
    (*job_)(begin, std::min(job_size_, begin + job_chunk_));
  }
}

void ThreadPool::worker_loop() {
  in_pool_worker = true;
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
    }
    run_chunks();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--active_ == 0) done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (workers_.empty() || in_pool_worker || n <= grain) {
    fn(0, n);
    return;
  }
  // a few chunks per thread balance uneven work without much contention
  int64_t chunk = std::max(grain, (n + size() * 4 - 1) / (size() * 4));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    job_size_ = n;
    job_chunk_ = chunk;
    next_.store(0);
    active_ = int(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  in_pool_worker = true;
  run_chunks();
  in_pool_worker = false;
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return active_ == 0; });
  job_ = nullptr;
}

}  // namespace kiln
