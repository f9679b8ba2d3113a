#include "serve/http_parse.h"

#include <cctype>

namespace moeserve::serve {

namespace http_parse {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Splits the next CRLF-terminated line off `rest`.
std::string_view next_line(std::string_view& rest) {
  const size_t eol = rest.find("\r\n");
  const std::string_view line = rest.substr(0, eol);
  rest = eol == std::string_view::npos ? std::string_view() : rest.substr(eol + 2);
  return line;
}

// The request line into request.method, .path and .query; `version` views into `line`.
MaybeFailure parse_request_line(std::string_view line, HttpRequest& request, std::string_view& version) {
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
    return RequestFailure{400, "malformed HTTP request line"};
  request.method = std::string(line.substr(0, sp1));
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  version = line.substr(sp2 + 1);
  if (version != "HTTP/1.1" && version != "HTTP/1.0") return RequestFailure{505, "unsupported HTTP version"};
  if (request.method.empty() || target.empty() || target.front() != '/')
    return RequestFailure{400, "malformed HTTP request target"};
  const size_t q = target.find('?');
  request.path = std::string(target.substr(0, q));
  if (q != std::string_view::npos) request.query = std::string(target.substr(q + 1));
  return std::nullopt;
}

// The header lines after the request line, names lower-cased, values trimmed. Whitespace in a
// name ("Content-Length : 5"), folded lines and a bare CR, LF or NUL are refused: a proxy in
// front may read such a line differently (request smuggling).
MaybeFailure parse_headers(std::string_view rest, HttpRequest& request) {
  constexpr std::string_view kNameEnd(":\r\n\0 \t", 6);
  while (!rest.empty()) {
    const std::string_view line = next_line(rest);
    const size_t colon = line.find_first_of(kNameEnd);
    if (colon == 0 || colon == std::string_view::npos || line[colon] != ':' ||
        line.find_first_of(kNameEnd.substr(1, 3), colon) != std::string_view::npos)
      return RequestFailure{400, "malformed HTTP header line"};
    request.headers.emplace_back(lower(line.substr(0, colon)), std::string(trim(line.substr(colon + 1))));
  }
  return std::nullopt;
}

// HTTP/1.1 keeps the connection unless told to close; HTTP/1.0 closes it unless told to keep it.
bool keeps_alive(const HttpRequest& request, std::string_view version) {
  const std::string* connection = request.header("connection");
  const std::string value = connection ? lower(*connection) : "";
  return version == "HTTP/1.1" ? value.find("close") == std::string::npos
                               : value.find("keep-alive") != std::string::npos;
}

bool expects_continue(const HttpRequest& request) {
  const std::string* expect = request.header("expect");
  return expect && lower(*expect) == "100-continue";
}

// A number in `digits` of the given base (10 or 16), nothing else: no sign, space, "0x" or
// junk after it, and at most as many digits as always fit 64 bits.
std::optional<uint64_t> parse_number(std::string_view digits, int base) {
  if (digits.empty() || digits.size() > (base == 16 ? 16u : 19u)) return std::nullopt;
  uint64_t value = 0;
  for (const char c : digits) {
    const int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                  : base == 16 && std::isxdigit(static_cast<unsigned char>(c))
                      ? std::tolower(static_cast<unsigned char>(c)) - 'a' + 10
                      : -1;
    if (d < 0) return std::nullopt;
    value = value * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
  }
  return value;
}

// How the body is framed: chunked, a length, or neither (no body). Anything that a proxy in
// front could frame differently is refused, lest it smuggle a request: a Transfer-Encoding
// other than exactly "chunked" (once), one with a Content-Length, and a Content-Length that is
// a list, repeated with another value, or not plain decimal.
MaybeFailure body_framing(const HttpRequest& request, BodyFraming& framing) {
  for (const auto& [name, value] : request.headers) {
    if (name == "transfer-encoding") {
      if (framing.chunked || lower(value) != "chunked")
        return RequestFailure{400, "unsupported Transfer-Encoding (only chunked is)"};
      framing.chunked = true;
    } else if (name == "content-length") {
      const std::optional<uint64_t> length = parse_number(value, 10);
      if (!length || (framing.length && *framing.length != *length))
        return RequestFailure{400, "malformed or conflicting Content-Length"};
      framing.length = length;
    }
  }
  if (framing.chunked && framing.length) return RequestFailure{400, "both Transfer-Encoding and Content-Length"};
  return std::nullopt;
}

// A chunk-size line: hex digits, then nothing or a chunk extension (";name=value"), ignored.
std::optional<uint64_t> parse_chunk_size(std::string_view line) {
  return parse_number(line.substr(0, line.find(';')), 16);
}

}  // namespace http_parse

std::string_view http_status_text(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

const std::string* HttpRequest::header(std::string_view name) const {
  for (const auto& [n, v] : headers)
    if (n == name) return &v;
  return nullptr;
}

}  // namespace moeserve::serve
