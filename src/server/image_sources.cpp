#include "server/image_sources.h"

#include <curl/curl.h>
#include <fmt/format.h>
#include <openssl/evp.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cctype>
#include <cstring>

namespace kiln::server {

namespace {

ApiError bad(std::string message, const std::string& param) {
  return ApiError{.message = std::move(message), .param = param};
}

struct Download {
  std::string bytes;
  int64_t max_bytes = 0;
  bool too_large = false;
};

// Whether an address is one a server must not be made to reach for a client: loopback, private
// (RFC 1918, unique local), link-local, carrier-grade NAT, unspecified, multicast, and IPv4 ones
// mapped into IPv6.
bool non_public(const sockaddr* address) {
  auto v4 = [](uint32_t a) {  // host order
    return (a >> 24) == 0 || (a >> 24) == 10 || (a >> 24) == 127 || (a >> 16) == 0xA9FE || (a >> 20) == 0xAC1 ||
           (a >> 16) == 0xC0A8 || (a >> 22) == (0x64400000u >> 22) || (a >> 28) >= 0xE;
  };
  if (address->sa_family == AF_INET) return v4(ntohl(reinterpret_cast<const sockaddr_in*>(address)->sin_addr.s_addr));
  if (address->sa_family != AF_INET6) return true;
  const uint8_t* b = reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr.s6_addr;
  static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
  if (std::memcmp(b, kMapped, 12) == 0)
    return v4(uint32_t(b[12]) << 24 | uint32_t(b[13]) << 16 | uint32_t(b[14]) << 8 | uint32_t(b[15]));
  bool zero_prefix = true;
  for (int i = 0; i < 15; ++i) zero_prefix = zero_prefix && b[i] == 0;
  if (zero_prefix) return true;  // :: and ::1
  // fc00::/7 (unique local), fe80::/10 (link-local), ff00::/8 (multicast)
  return (b[0] & 0xFE) == 0xFC || (b[0] == 0xFE && (b[1] & 0xC0) == 0x80) || b[0] == 0xFF;
}

// Refuses, before connecting, a socket to an address that non_public names (every connection,
// redirects included).
curl_socket_t open_public_socket(void* refused, curlsocktype, curl_sockaddr* address) {
  if (non_public(&address->addr)) {
    *static_cast<bool*>(refused) = true;
    return CURL_SOCKET_BAD;
  }
  return socket(address->family, address->socktype, address->protocol);
}

size_t write_body(char* data, size_t size, size_t count, void* user) {
  auto* d = static_cast<Download*>(user);
  const size_t n = size * count;
  if (int64_t(d->bytes.size() + n) > d->max_bytes) {
    d->too_large = true;
    return 0;  // aborts the transfer
  }
  d->bytes.append(data, n);
  return n;
}

std::variant<std::string, ApiError> fetch(const std::string& url, const ImageFetchOptions& options,
                                          const std::string& param, std::chrono::steady_clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
  if (left <= 0)
    return bad(fmt::format("fetching the request's images took longer than {} s", options.timeout_seconds), param);
  std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> curl(curl_easy_init(), curl_easy_cleanup);
  if (!curl) return ApiError{.status = 500, .type = "server_error", .message = "could not start an image download"};
  Download d{.max_bytes = options.max_bytes};
  CURL* c = curl.get();
  bool refused = false;
  // fail closed: a libcurl that cannot restrict the protocols fetches nothing
  if (curl_easy_setopt(c, CURLOPT_URL, url.c_str()) != CURLE_OK ||
      curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https") != CURLE_OK ||
      curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https") != CURLE_OK)
    return bad("this server's HTTP client cannot fetch image URLs safely", param);
  if (!options.allow_private) {
    curl_easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, open_public_socket);
    curl_easy_setopt(c, CURLOPT_OPENSOCKETDATA, &refused);
  }
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, long(left));
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, curl_off_t(options.max_bytes));
  curl_easy_setopt(c, CURLOPT_USERAGENT, "kiln");
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, write_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &d);
  const CURLcode rc = curl_easy_perform(c);
  if (refused)
    return bad(fmt::format("the image at {} is on a private or local address, which this server does not fetch", url),
               param);
  if (d.too_large || rc == CURLE_FILESIZE_EXCEEDED)
    return bad(fmt::format("the image at {} is larger than {} bytes", url, options.max_bytes), param);
  if (rc == CURLE_OPERATION_TIMEDOUT)
    return bad(fmt::format("fetching the image at {} took longer than {} s", url, options.timeout_seconds), param);
  if (rc != CURLE_OK)
    return bad(fmt::format("could not fetch the image at {}: {}", url, curl_easy_strerror(rc)), param);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  if (status < 200 || status >= 300)
    return bad(fmt::format("fetching the image at {} answered HTTP {}", url, status), param);
  return std::move(d.bytes);
}

}  // namespace

void init_image_fetching() {
  curl_global_init(CURL_GLOBAL_DEFAULT);
}

std::optional<std::string> decode_base64(std::string_view text) {
  std::string clean;
  clean.reserve(text.size());
  for (char ch : text)
    if (!std::isspace(static_cast<unsigned char>(ch))) clean.push_back(ch);
  if (clean.empty() || clean.size() % 4 != 0) return std::nullopt;
  size_t padding = 0;
  while (padding < 2 && clean[clean.size() - 1 - padding] == '=') ++padding;
  // OpenSSL reads '=' as a zero anywhere; only the last two characters may be padding
  if (clean.find('=') < clean.size() - padding) return std::nullopt;
  std::string out(clean.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(clean.data()), int(clean.size()));
  if (n < 0 || size_t(n) != out.size()) return std::nullopt;
  out.resize(out.size() - padding);
  return out;
}

std::variant<std::string, ApiError> image_url_bytes(const std::string& url, const ImageFetchOptions& options,
                                                    const std::string& param,
                                                    std::optional<std::chrono::steady_clock::time_point> deadline) {
  if (url.rfind("data:", 0) == 0) {
    // data:[<media type>][;base64],<data>
    const size_t comma = url.find(',');
    if (comma == std::string::npos) return bad("a data: URL needs a comma before its data", param);
    const std::string_view header = std::string_view(url).substr(5, comma - 5);
    if (header.size() < 7 || header.substr(header.size() - 7) != ";base64")
      return bad("an image data: URL must be base64 (data:image/png;base64,...)", param);
    auto bytes = decode_base64(std::string_view(url).substr(comma + 1));
    if (!bytes) return bad("the image data: URL does not hold valid base64", param);
    return std::move(*bytes);
  }
  if (url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0) {
    if (!options.allow_urls)
      return bad(
          "this server does not fetch image URLs (start it with --allow-image-urls); send the image as a data: URL",
          param);
    return fetch(url, options, param,
                 deadline.value_or(std::chrono::steady_clock::now() + std::chrono::seconds(options.timeout_seconds)));
  }
  return bad("an image URL must be a data: URL or, where the server allows it, http(s)", param);
}

}  // namespace kiln::server
