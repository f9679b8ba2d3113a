// HTTP/1.1 request framing on Boost.Beast's request parser, plus the checks where Beast is
// lenient and a proxy in front could read the same bytes as different requests (request
// smuggling): a Transfer-Encoding other than exactly "chunked" once, a Content-Length list
// ("5, 5"), folded header lines (obs-fold), a target that is not an origin path. The server
// feeds it the bytes it reads (serve/http_connection.cc); parse_http_request is the same
// parser over bytes in memory, for tests and fuzz targets.
#pragma once

#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "serve/http_server.h"

namespace moeserve::serve {

struct HttpLimits {
  size_t max_header_bytes = 64u << 10;  // request line and headers (431 beyond)
  size_t max_body_bytes = 8u << 20;     // the decoded body (413 beyond)
};

// Why a request cannot be served: the status to answer (400, 413, 431, 505) and why.
struct HttpFailure {
  int status = 400;
  std::string message;
};

// One request's parser: feed it the unconsumed bytes as they arrive. Not reusable: one per request.
class RequestParser {
 public:
  explicit RequestParser(const HttpLimits& limits);

  enum class State { kNeedMore, kDone, kFailed };
  struct Progress {
    State state = State::kNeedMore;
    size_t consumed = 0;  // bytes of `bytes` that belong to this request (drop them before the next feed)
  };
  // `bytes`: everything received and not yet consumed by an earlier feed (Beast's put() contract).
  Progress feed(std::string_view bytes);

  bool header_done() const { return parser_.is_header_done(); }
  // The client sent "Expect: 100-continue" and waits for it before the body.
  bool expects_continue() const;
  // HTTP/1.1 keeps the connection unless told to close; HTTP/1.0 closes it unless told to keep it.
  bool keep_alive() const { return parser_.get().keep_alive(); }
  bool http11() const { return parser_.get().version() == 11; }
  // After kFailed.
  const HttpFailure& failure() const { return failure_; }
  // After kDone: the request (moves it out).
  HttpRequest take_request();

 private:
  Progress fail(int status, std::string message, size_t consumed = 0);
  // Our checks on a complete head (the parser has it, the body is not read yet).
  std::optional<HttpFailure> check_head() const;
  // Scans the head's bytes for folded lines before Beast (which joins them) reads it.
  std::optional<HttpFailure> check_head_bytes(std::string_view bytes);

  HttpLimits limits_;
  boost::beast::http::request_parser<boost::beast::http::string_body> parser_;
  size_t head_scanned_ = 0;     // bytes of the head already searched for its end
  bool head_received_ = false;  // its end is among the bytes fed
  HttpFailure failure_;
};

// A whole request from bytes in memory, or why not: the server's parser and checks without a
// socket. Bytes after the request (a pipelined one) are ignored; a request cut short is a failure
// (400, "incomplete").
std::variant<HttpRequest, HttpFailure> parse_http_request(std::string_view bytes, const HttpLimits& limits = {});

}  // namespace moeserve::serve
