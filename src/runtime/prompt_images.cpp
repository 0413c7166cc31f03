#include "runtime/prompt_images.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstring>
#include <memory>

namespace kiln {

namespace {

// SHA-256 of an image's pixels and grid, cut to 64 bits, from which the key values of each of its
// soft tokens are drawn: a client cannot feasibly make another image with the same run of keys
// (the scheduler resumes a prompt only at the end of an image, never inside one).
Result<uint64_t> content_hash(const ProcessedImage& image) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1 ||
      EVP_DigestUpdate(ctx.get(), image.grid.data(), image.grid.size() * sizeof(int64_t)) != 1 ||
      EVP_DigestUpdate(ctx.get(), image.pixels.data(), image.pixels.nbytes()) != 1 ||
      EVP_DigestFinal_ex(ctx.get(), digest, &length) != 1 || length < 8)
    return make_error("could not hash an image (OpenSSL's SHA-256 failed)");
  uint64_t h = 0;
  std::memcpy(&h, digest, 8);
  return h;
}

// splitmix64's finaliser: the key values of an image's run, one per position.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

Result<ImageLayout> lay_out_images(const BatchNeeds& needs, const ModelFamily& family, const ModelConfigFile& config,
                                   const ImagePlaceholder& placeholder, std::span<const int32_t> ids,
                                   std::vector<ProcessedImage> images) {
  ImageLayout out;
  out.prompt_tokens = int64_t(ids.size());
  out.whole = needs.image_spans;
  KILN_ASSIGN(out.offsets, find_image_runs(ids, placeholder, images));
  for (const auto& image : images) {
    KILN_ASSIGN(const uint64_t hash, content_hash(image));
    out.hashes.push_back(hash);
  }
  if (needs.rope_axes > 0 && family.rope_positions) {
    std::vector<std::vector<int64_t>> grids;
    for (const auto& image : images) grids.push_back(image.grid);
    KILN_ASSIGN(out.positions, family.rope_positions(config, ids, grids));
    if (out.positions.size() != size_t(needs.rope_axes) * ids.size())
      return make_error("the laid-out positions hold {} values for {} tokens of {} axes", out.positions.size(),
                        ids.size(), needs.rope_axes);
    out.rope_axes = needs.rope_axes;
  }
  out.images = std::move(images);
  return out;
}

std::vector<int32_t> image_cache_key(std::span<const int32_t> ids, const ImageLayout& layout) {
  std::vector<int32_t> key(ids.begin(), ids.end());
  for (size_t i = 0; i < layout.images.size(); ++i) {
    const int64_t begin = layout.offsets[i];
    const int64_t end = std::min<int64_t>(begin + layout.images[i].soft_tokens, int64_t(key.size()));
    for (int64_t t = begin; t < end; ++t)
      key[size_t(t)] = int32_t(0x80000000u | uint32_t(mix(layout.hashes[i] + uint64_t(t - begin))));
  }
  return key;
}

PromptImages images_to_encode(const ImageLayout& layout) {
  PromptImages out;
  out.prompt_tokens = layout.prompt_tokens;
  out.whole = layout.whole;
  out.rope_axes = layout.rope_axes;
  out.positions = layout.positions;
  for (size_t i = 0; i < layout.images.size(); ++i)
    out.images.push_back(PromptImages::Placed{.offset = layout.offsets[i], .tokens = layout.images[i].soft_tokens});
  return out;
}

Status encode_range(Model& model, const ImageLayout& layout, PromptImages& images, int64_t begin, int64_t end) {
  for (size_t i = 0; i < images.images.size(); ++i) {
    PromptImages::Placed& placed = images.images[i];
    if (placed.rows.defined() || placed.offset >= end || placed.offset + placed.tokens <= begin) continue;
    KILN_ASSIGN(placed.rows, model.encode_image(layout.images[i]));
    if (placed.rows.rows() != placed.tokens)
      return make_error("image {}: the encoder gave {} rows for {} soft tokens", i + 1, placed.rows.rows(),
                        placed.tokens);
  }
  return ok_status();
}

Result<PromptImages> encode_images(Model& model, const ImageLayout& layout, int64_t from) {
  PromptImages out = images_to_encode(layout);
  KILN_TRY(encode_range(model, layout, out, from, layout.prompt_tokens));
  return out;
}

Result<std::unique_ptr<ImageInput>> ImageInput::load(const std::string& model_dir, const ModelConfigFile& config,
                                                     const ModelFamily& family, const BatchNeeds& needs,
                                                     ImageLimits limits) {
  if (!family.image_processor || needs.hidden <= 0) return std::unique_ptr<ImageInput>();
  std::unique_ptr<ImageInput> input(new ImageInput());
  KILN_ASSIGN(input->processor_, family.image_processor(model_dir, config));
  input->family_ = &family;
  input->config_ = config;
  input->needs_ = needs;
  input->limits_ = limits;
  return input;
}

Result<ProcessedImage> ImageInput::read(std::span<const uint8_t> bytes, const std::string& name) const {
  KILN_ASSIGN(RgbImage image, decode_image(bytes, name, limits_));
  auto processed = processor_->process(image);
  if (!processed.ok()) return make_error("{}: {}", name, processed.error().message);
  return processed;
}

Result<ProcessedImage> ImageInput::read_file(const std::string& path) const {
  KILN_ASSIGN(RgbImage image, read_image(path, limits_));
  auto processed = processor_->process(image);
  if (!processed.ok()) return make_error("{}: {}", path, processed.error().message);
  return processed;
}

Result<std::string> ImageInput::expand(std::string_view text, std::span<const ProcessedImage> images) const {
  return expand_image_placeholders(text, placeholder(), images);
}

Result<ImageLayout> ImageInput::lay_out(std::span<const int32_t> ids, std::vector<ProcessedImage> images) const {
  return lay_out_images(needs_, *family_, config_, placeholder(), ids, std::move(images));
}

Result<PromptImages> place_images(Model& model, const ModelFamily& family, const ModelConfigFile& config,
                                  const ImagePlaceholder& placeholder, std::span<const int32_t> ids,
                                  std::vector<ProcessedImage> images) {
  KILN_ASSIGN(const ImageLayout layout,
              lay_out_images(model.batch_needs(), family, config, placeholder, ids, std::move(images)));
  return encode_images(model, layout);
}

ChunkInputs chunk_inputs(const PromptImages& images, int64_t begin, int64_t end) {
  ChunkInputs in;
  for (const auto& image : images.images) {
    const int64_t first = std::max(begin, image.offset);
    const int64_t last = std::min(end, image.offset + image.tokens);
    if (first >= last) continue;
    in.soft.push_back(SoftTokens{.offset = first - begin,
                                 .rows = image.rows.rows_view(first - image.offset, last - first),
                                 .first = first - image.offset,
                                 .image_rows = image.tokens});
  }
  if (!images.positions.empty()) {
    const int64_t n = end - begin;
    in.positions.resize(size_t(images.rope_axes * n));
    for (int64_t a = 0; a < images.rope_axes; ++a)
      std::memcpy(in.positions.data() + a * n, images.positions.data() + a * images.prompt_tokens + begin,
                  size_t(n) * sizeof(int32_t));
  }
  return in;
}

Result<int64_t> chunk_end(const PromptImages& images, int64_t begin, int64_t end, int64_t max_tokens) {
  int64_t stop = std::min(end, begin + max_tokens);
  if (!images.whole) return stop;
  for (const auto& image : images.images) {
    const int64_t image_end = image.offset + image.tokens;
    if (image.offset >= stop || image_end <= stop || image_end <= begin) continue;
    // the chunk would split this image
    if (image.offset > begin) return image.offset;
    return make_error(
        "an image of {} soft tokens does not fit a forward call of {} tokens (raise --prefill-chunk or send a smaller "
        "image)",
        image.tokens, max_tokens);
  }
  return stop;
}
Result<Tensor> run_prompt(Model& model, SequenceState& state, std::span<const int32_t> ids, const PromptImages& images,
                          int64_t chunk, LogitRows rows) {
  if (ids.empty()) return make_error("no tokens to run");
  const int64_t n = int64_t(ids.size());
  const int64_t vocab = model.info().vocab_size;
  chunk = chunk <= 0 ? model.max_chunk_tokens() : std::min(chunk, model.max_chunk_tokens());
  Tensor out = host_tensor(DType::f32, Shape{rows == LogitRows::all ? n : 1, vocab});
  for (int64_t begin = 0; begin < n;) {
    KILN_ASSIGN(const int64_t end, chunk_end(images, begin, n, chunk));
    const ChunkInputs in = chunk_inputs(images, begin, end);
    SeqChunk c{.state = &state,
               .tokens = ids.subspan(size_t(begin), size_t(end - begin)),
               .soft = in.soft,
               .positions = in.positions};
    const LogitRows want = rows == LogitRows::all ? LogitRows::all : LogitRows::last;
    KILN_ASSIGN(Tensor logits, model.forward(std::span<const SeqChunk>(&c, 1), want));
    if (rows == LogitRows::all) {
      Tensor host = model.backend().to_host(logits);
      std::memcpy(out.data_as<float>() + begin * vocab, host.data(), size_t((end - begin) * vocab) * 4);
    } else if (end == n) {
      Tensor host = model.backend().to_host(logits);
      std::memcpy(out.data_as<float>(), host.data(), size_t(vocab) * 4);
    }
    begin = end;
  }
  return out;
}

}  // namespace kiln
