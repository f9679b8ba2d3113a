// Fuzz target: HTTP/1.1 request framing (serve/http_parse: Beast's request parser plus our
// checks), through serve::parse_http_request, the server's parser over bytes in memory.
// Invariants: an accepted request has a method, a path starting with '/', lower-case header names
// without separators and values without CR, LF or NUL, and a body within the limit; a failure is
// a 4xx/505 with a message; and the answer does not depend on how the bytes arrive (fed in two
// pieces, split where the first input byte says, the parser reaches the same result).
#include <cctype>
#include <variant>

#include "fuzz/fuzz_input.h"
#include "serve/http_parse.h"

namespace {

namespace serve = moeserve::serve;

void check_request(const serve::HttpRequest& request, const serve::HttpLimits& limits) {
  MS_FUZZ_ASSERT(!request.method.empty() && !request.path.empty() && request.path[0] == '/', "bad request line");
  MS_FUZZ_ASSERT(request.body.size() <= limits.max_body_bytes, "body beyond the limit accepted");
  for (const auto& [name, value] : request.headers) {
    MS_FUZZ_ASSERT(!name.empty() && name.find_first_of(std::string_view(":\r\n\0 \t", 6)) == std::string::npos,
                   "header name with a separator: " + name);
    for (char c : name) MS_FUZZ_ASSERT(!std::isupper(static_cast<unsigned char>(c)), "header name not lower-cased");
    MS_FUZZ_ASSERT(value.find_first_of(std::string_view("\r\n\0", 3)) == std::string::npos,
                   "header value with CR/LF/NUL");
  }
}

// The same bytes fed as two pieces: bytes [0, split), then everything not yet consumed.
std::variant<serve::HttpRequest, serve::HttpFailure> parse_in_two_pieces(std::string_view bytes, size_t split,
                                                                         const serve::HttpLimits& limits) {
  serve::RequestParser parser(limits);
  std::string pending(bytes.substr(0, split));
  size_t next = split;
  for (;;) {
    const serve::RequestParser::Progress progress = parser.feed(pending);
    pending.erase(0, progress.consumed);
    if (progress.state == serve::RequestParser::State::kDone) return parser.take_request();
    if (progress.state == serve::RequestParser::State::kFailed) return parser.failure();
    if (next >= bytes.size()) return serve::HttpFailure{400, "incomplete"};
    pending.append(bytes.substr(next));
    next = bytes.size();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view input = moeserve::fuzz::as_text(data + 1, size - 1);
  serve::HttpLimits limits;
  limits.max_header_bytes = 4096;
  limits.max_body_bytes = 4096;
  const auto whole = serve::parse_http_request(input, limits);
  if (const auto* request = std::get_if<serve::HttpRequest>(&whole)) {
    check_request(*request, limits);
  } else {
    const serve::HttpFailure& failure = std::get<serve::HttpFailure>(whole);
    MS_FUZZ_ASSERT((failure.status >= 400 && failure.status < 500) || failure.status == 505,
                   "failure status " + std::to_string(failure.status));
    MS_FUZZ_ASSERT(!failure.message.empty(), "failure without a message");
  }
  const auto pieces = parse_in_two_pieces(input, data[0] % (input.size() + 1), limits);
  MS_FUZZ_ASSERT(whole.index() == pieces.index(), "the answer depends on how the bytes arrive");
  if (const auto* request = std::get_if<serve::HttpRequest>(&whole)) {
    const auto& other = std::get<serve::HttpRequest>(pieces);
    MS_FUZZ_ASSERT(request->method == other.method && request->path == other.path && request->body == other.body &&
                       request->headers == other.headers,
                   "the request depends on how the bytes arrive");
  }
  return 0;
}
