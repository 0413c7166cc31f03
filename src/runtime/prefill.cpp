#include "runtime/prefill.h"

#include <algorithm>
#include <cstring>

namespace kiln {

Result<Tensor> run_tokens(Model& model, SequenceState& state, std::span<const int32_t> tokens, int64_t chunk,
                          LogitRows rows) {
  if (tokens.empty()) return make_error("no tokens to run");
  const int64_t n = int64_t(tokens.size());
  const int64_t vocab = model.info().vocab_size;
  chunk = chunk <= 0 ? model.max_chunk_tokens() : std::min(chunk, model.max_chunk_tokens());
  Tensor out = host_tensor(DType::f32, Shape{rows == LogitRows::all ? n : 1, vocab});
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t count = std::min(chunk, n - begin);
    const bool last_chunk = begin + count == n;
    SeqChunk c{.state = &state, .tokens = tokens.subspan(size_t(begin), size_t(count))};
    // intermediate chunks only need logits when every row is wanted
    const LogitRows want = rows == LogitRows::all ? LogitRows::all : LogitRows::last;
    KILN_ASSIGN(Tensor logits, model.forward(std::span<const SeqChunk>(&c, 1), want));
    if (rows == LogitRows::all) {
      Tensor host = model.backend().to_host(logits);
      std::memcpy(out.data_as<float>() + begin * vocab, host.data(), size_t(count * vocab) * 4);
    } else if (last_chunk) {
      Tensor host = model.backend().to_host(logits);
      std::memcpy(out.data_as<float>(), host.data(), size_t(vocab) * 4);
    }
  }
  return out;
}

}  // namespace kiln
