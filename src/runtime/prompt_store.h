// Prefix-cache entries kept on disk, so that a server started again resumes the prompts it has
// seen (a long system prompt, a conversation's earlier turns) instead of prefilling them cold.
//
// One file per entry under DIR/<hash of the fingerprint>/, named by the SHA-256 of its tokens:
//
//   "KILNPC01"            8-byte magic
//   u64 little-endian     the header's length in bytes
//   header                JSON: format, fingerprint, tokens, length, rope_offset, and per layer
//                         each piece's name, dtype, rows, cols and bytes
//   blobs                 each piece's rows as raw bytes in the backend's own type, in order
//   SHA-256               32 bytes, of everything before it
//
// A piece is one plain tensor of a layer's state, viewed as [slots, elements a slot]: an attention
// ring's k and v (a quantized ring's codes, scales and biases) and slot_pos, a Gated DeltaNet
// layer's conv and recurrent states. A ring that never wrapped (capacity at least the length)
// holds position p in slot p, and only its first `length` rows are kept; a ring that wrapped
// (a sliding window shorter than the prompt) is kept whole and loads only into a ring of the same
// capacity.
//
// Files are written on a thread of the store's own, to a temporary name renamed when complete, so
// a crash never leaves half a file under an entry's name. The least recently used files (by their
// modification time, touched on every load) are removed to keep the directory within its budget.
// A file that cannot be used (another format or fingerprint, corrupt, truncated, or shaped for
// another state) is skipped with a warning naming it and why; the caller then prefills cold.
//
// find, load and save are called from one thread (the scheduler's); the writer thread shares only
// the index and the queue, under the store's lock.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "layers/sequence_state.h"

namespace kiln {

// SHA-256 (hex) of what tells a checkpoint's weights apart, cheaply enough to compute at every
// load: config.json (and kv_config.json when present) and, for each *.safetensors file by name,
// its name, size and header, and 4 samples of 64 KiB spread evenly over its data. Two checkpoints
// that differ only between the samples share a fingerprint.
Result<std::string> model_fingerprint(const std::string& model_dir);

struct PromptStoreOptions {
  std::string dir;  // entries go under dir/<hash of the fingerprint>/ (created as needed)
  // What the states depend on: the model, the backend, the caches' format. A file written under
  // another fingerprint is never loaded.
  std::string fingerprint;
  size_t budget_bytes = size_t(32) << 30;  // the files together; the least recently used go first
  // Host copies of states waiting to be written; a save beyond is dropped (the writer is behind).
  size_t max_pending_bytes = size_t(1) << 30;
};

class PromptStore {
 public:
  // Creates the directory if need be and indexes its files (reading only their headers).
  static Result<std::unique_ptr<PromptStore>> open(const PromptStoreOptions& options);
  // Writes what is queued, then stops the writer.
  ~PromptStore();

  struct Entry {
    std::string name;    // the file's name in the store's directory
    int64_t tokens = 0;  // how many leading tokens its state holds
  };
  // The longest entry whose tokens are a proper prefix of `tokens` (at least one token is left to
  // run), longer than `longer_than` tokens and, when given, whose length `usable` accepts.
  std::optional<Entry> find(std::span<const int32_t> tokens, const std::function<bool(int64_t)>& usable = {},
                            int64_t longer_than = 0);

  // Fills `state` (a sequence of the model the store was opened for) with the entry's snapshot.
  // Everything is read and checked before the state is touched: on an error (logged as a warning
  // naming the file, and the entry dropped from the index) the state is as it was.
  Status load(const Entry& entry, SequenceState& state, Backend& backend);

  // Queues a snapshot of `state`, which holds exactly `tokens`: its rows are copied to the host now,
  // the file is written by the store's thread. Does nothing when an entry for these tokens exists or
  // is queued, when one file alone would exceed the budget, or when the queue is full.
  void save(std::span<const int32_t> tokens, const SequenceState& state, Backend& backend);

  // Blocks until every queued snapshot is written (or failed to be).
  void flush();

  const std::filesystem::path& directory() const { return directory_; }
  size_t bytes() const;
  size_t entries() const;

 private:
  struct Indexed {
    std::vector<int32_t> tokens;
    size_t bytes = 0;
    std::filesystem::file_time_type used;  // the file's modification time
  };
  struct Pending {
    std::string name;
    std::vector<int32_t> tokens;
    std::string header;
    std::vector<Tensor> blobs;  // host tensors, written in order
    size_t bytes = 0;           // of the file
  };

  explicit PromptStore(const PromptStoreOptions& options, std::filesystem::path directory);
  void index_directory();
  void writer();
  Status write_file(const Pending& pending) const;
  // Removes the least recently used files until the rest fit the budget. Holds mutex_.
  void evict_locked();

  PromptStoreOptions options_;
  std::filesystem::path directory_;

  mutable std::mutex mutex_;
  std::condition_variable wake_, drained_;
  std::map<std::string, Indexed> index_;  // by file name
  size_t index_bytes_ = 0;
  std::deque<Pending> queue_;
  std::set<std::string> writing_;  // queued or being written
  size_t pending_bytes_ = 0;       // host bytes of the queued snapshots
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kiln
