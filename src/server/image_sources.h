// Where a request's images come from: the URL of an OpenAI image_url part (a data: URL, or an
// http(s) URL when the server allows fetching them) or an Anthropic image block's source (base64
// data or a URL), as the image file's bytes.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "server/request_fields.h"

namespace kiln::server {

struct ImageFetchOptions {
  bool allow_urls = false;  // kiln serve --allow-image-urls
  // Loopback, private, link-local and other non-public addresses (kiln serve
  // --allow-private-image-urls): refused by default, so that a client cannot make the server reach
  // into its own network.
  bool allow_private = false;
  int64_t max_bytes = int64_t(20) << 20;  // of one fetched image
  int timeout_seconds = 10;               // to fetch all of a request's image URLs, redirects included
};

// Sets up the HTTP client (libcurl's global state); call once before threads fetch.
void init_image_fetching();

// The bytes of an image at `url`; errors name `param` (HTTP 400).
// `deadline`: when the request's fetches must be done (none: timeout_seconds from now).
std::variant<std::string, ApiError> image_url_bytes(
    const std::string& url, const ImageFetchOptions& options, const std::string& param,
    std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt);

// Standard base64 (whitespace ignored) to bytes; nothing when the text is not base64.
std::optional<std::string> decode_base64(std::string_view text);

}  // namespace kiln::server
