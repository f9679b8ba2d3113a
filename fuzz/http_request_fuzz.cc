// Fuzz target: HTTP/1.1 request framing (serve/http_parse): the head up to the blank line, then
// the body as its framing says (Content-Length, or chunked: size lines, data, CRLF). It drives
// today's http_parse functions the way serve/http_server.cc does; when the server moves to
// serve::parse_http_request(bytes), this file alone is retargeted.
// Invariants: an accepted head has a method, a path starting with '/', lower-case header names
// without separators and values without CR, LF or NUL; framing is never both chunked and sized;
// a chunk size is what its hex digits say.
#include <charconv>

#include "fuzz/fuzz_input.h"
#include "serve/http_parse.h"

namespace {

namespace hp = moeserve::serve::http_parse;

void check_head(const moeserve::serve::HttpRequest& request) {
  MS_FUZZ_ASSERT(!request.method.empty() && !request.path.empty() && request.path[0] == '/', "bad request line");
  for (const auto& [name, value] : request.headers) {
    MS_FUZZ_ASSERT(!name.empty() && name.find_first_of(std::string_view(":\r\n\0 \t", 6)) == std::string::npos,
                   "header name with a separator: " + name);
    MS_FUZZ_ASSERT(hp::lower(name) == name, "header name not lower-cased");
    MS_FUZZ_ASSERT(value.find_first_of(std::string_view("\r\n\0", 3)) == std::string::npos,
                   "header value with CR/LF/NUL");
    MS_FUZZ_ASSERT(hp::trim(value) == value, "header value not trimmed");
  }
}

// parse_number against std::from_chars on the same digits.
void check_number(std::string_view digits, int base, std::optional<uint64_t> parsed) {
  if (!parsed) return;
  uint64_t expected = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), expected, base);
  MS_FUZZ_ASSERT(ec == std::errc() && end == digits.data() + digits.size() && expected == *parsed,
                 "parse_number disagrees with from_chars on '" + std::string(digits) + "'");
}

// A chunked body: size line, data, CRLF, until the 0-size chunk.
void read_chunks(std::string_view body) {
  for (;;) {
    std::string_view rest = body;
    if (body.find("\r\n") == std::string_view::npos) return;
    const std::string_view line = hp::next_line(rest);
    const std::optional<uint64_t> size = hp::parse_chunk_size(line);
    check_number(line.substr(0, line.find(';')), 16, size);
    if (!size || *size == 0 || *size > rest.size()) return;
    body = rest.substr(static_cast<size_t>(*size));
    if (body.substr(0, 2) != "\r\n") return;
    body.remove_prefix(2);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = moeserve::fuzz::as_text(data, size);
  const size_t head_end = input.find("\r\n\r\n");
  if (head_end == std::string_view::npos) return 0;
  std::string_view rest = input.substr(0, head_end);
  moeserve::serve::HttpRequest request;
  std::string_view version;
  if (hp::parse_request_line(hp::next_line(rest), request, version)) return 0;
  if (hp::parse_headers(rest, request)) return 0;
  check_head(request);
  hp::keeps_alive(request, version);
  hp::expects_continue(request);
  hp::BodyFraming framing;
  if (hp::body_framing(request, framing)) return 0;
  MS_FUZZ_ASSERT(!(framing.chunked && framing.length), "both chunked and sized framing accepted");
  if (framing.length) check_number(*request.header("content-length"), 10, framing.length);
  if (framing.chunked) read_chunks(input.substr(head_end + 4));
  return 0;
}
