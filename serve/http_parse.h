// The parsing half of the HTTP/1.1 layer (serve/http_server.cc): request line, headers and
// body framing, strict where a lax reading would let a proxy in front and this server see
// different requests in one byte stream (request smuggling). Internal to the HTTP layer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "serve/http_server.h"

namespace moeserve::serve::http_parse {

// Why a request was not read whole: an error to answer (status > 0), or nothing to send
// (status 0: the client closed or stalled, or the server stops).
struct RequestFailure {
  int status = 0;
  std::string message;
};
using MaybeFailure = std::optional<RequestFailure>;

std::string lower(std::string_view s);
std::string_view trim(std::string_view s);

// Splits the next CRLF-terminated line off `rest`.
std::string_view next_line(std::string_view& rest);
// The request line into request.method, .path and .query; `version` views into `line`.
MaybeFailure parse_request_line(std::string_view line, HttpRequest& request, std::string_view& version);
// The header lines after the request line into request.headers, names lower-cased, values trimmed.
MaybeFailure parse_headers(std::string_view rest, HttpRequest& request);
// Whether the connection stays open after the answer.
bool keeps_alive(const HttpRequest& request, std::string_view version);
bool expects_continue(const HttpRequest& request);

// A number in `digits` of the given base (10 or 16), nothing else.
std::optional<uint64_t> parse_number(std::string_view digits, int base);

// How the body is framed: chunked, a length, or neither (no body).
struct BodyFraming {
  bool chunked = false;
  std::optional<uint64_t> length;
};
MaybeFailure body_framing(const HttpRequest& request, BodyFraming& framing);
// A chunk-size line's size; nullopt when it is malformed.
std::optional<uint64_t> parse_chunk_size(std::string_view line);

}  // namespace moeserve::serve::http_parse
