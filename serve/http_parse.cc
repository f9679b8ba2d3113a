#include "serve/http_parse.h"

#include <algorithm>
#include <boost/beast/core/string.hpp>
#include <cctype>

namespace moeserve::serve {

namespace {

namespace http = boost::beast::http;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

constexpr std::string_view kHeadEnd = "\r\n\r\n";

}  // namespace

RequestParser::RequestParser(const HttpLimits& limits) : limits_(limits) {
  parser_.header_limit(static_cast<std::uint32_t>(std::min<size_t>(limits.max_header_bytes, UINT32_MAX)));
  parser_.body_limit(limits.max_body_bytes);
  parser_.eager(false);  // stop after the head, so that check_head runs before any body byte is read
}

RequestParser::Progress RequestParser::fail(int status, std::string message, size_t consumed) {
  failure_ = {status, std::move(message)};
  return {State::kFailed, consumed};
}

bool RequestParser::expects_continue() const {
  const auto& head = parser_.get();
  const auto it = head.find(http::field::expect);
  return it != head.end() && boost::beast::iequals(it->value(), "100-continue");
}

// Beast replaces a folded line's CRLF by spaces; a proxy may not, so the head is checked as sent.
std::optional<HttpFailure> RequestParser::check_head_bytes(std::string_view bytes) {
  const size_t from = head_scanned_ >= 3 ? head_scanned_ - 3 : 0;  // the end may straddle two reads
  const size_t end = bytes.find(kHeadEnd, from);
  if (end == std::string_view::npos) {
    head_scanned_ = bytes.size();
    if (bytes.size() > limits_.max_header_bytes)
      return HttpFailure{431, "request headers exceed " + std::to_string(limits_.max_header_bytes) + " bytes"};
    return std::nullopt;
  }
  head_scanned_ = end + kHeadEnd.size();
  head_received_ = true;
  const std::string_view head = bytes.substr(0, end + 2);
  if (head.find("\r\n ") != std::string_view::npos || head.find("\r\n\t") != std::string_view::npos)
    return HttpFailure{400, "malformed HTTP header line (folded lines are not accepted)"};
  return std::nullopt;
}

// What Beast accepts but a strict reading refuses (see the header comment).
std::optional<HttpFailure> RequestParser::check_head() const {
  const auto& head = parser_.get();
  const std::string_view target = head.target();
  if (target.empty() || target.front() != '/') return HttpFailure{400, "malformed HTTP request target"};
  for (const auto& field : head) {
    if (field.name() == http::field::transfer_encoding && !boost::beast::iequals(field.value(), "chunked"))
      return HttpFailure{400, "unsupported Transfer-Encoding (only chunked is)"};
    if (field.name() == http::field::content_length && !all_digits(field.value()))
      return HttpFailure{400, "malformed or conflicting Content-Length"};
  }
  return std::nullopt;
}

namespace {

HttpFailure failure_of(const boost::beast::error_code& ec, const HttpLimits& limits) {
  if (ec == http::error::header_limit)
    return {431, "request headers exceed " + std::to_string(limits.max_header_bytes) + " bytes"};
  if (ec == http::error::body_limit)
    return {413, "request body exceeds " + std::to_string(limits.max_body_bytes) + " bytes"};
  if (ec == http::error::bad_content_length) return {400, "malformed or conflicting Content-Length"};
  if (ec == http::error::bad_transfer_encoding)
    return {400, "unsupported Transfer-Encoding (only chunked, once, without Content-Length)"};
  if (ec == http::error::bad_chunk || ec == http::error::bad_chunk_extension)
    return {400, "malformed chunked request body"};
  return {400, "malformed HTTP request (" + ec.message() + ")"};
}

}  // namespace

RequestParser::Progress RequestParser::feed(std::string_view bytes) {
  if (parser_.is_done()) return {State::kDone, 0};
  if (!parser_.is_header_done()) {
    if (std::optional<HttpFailure> f = check_head_bytes(bytes)) return fail(f->status, std::move(f->message));
    if (!head_received_) return {State::kNeedMore, 0};
  }
  size_t consumed = 0;
  while (!parser_.is_done() && consumed < bytes.size()) {
    const bool had_head = parser_.is_header_done();
    boost::beast::error_code ec;
    consumed += parser_.put(boost::asio::buffer(bytes.data() + consumed, bytes.size() - consumed), ec);
    if (ec == http::error::need_more) break;
    if (ec) {
      const HttpFailure f = failure_of(ec, limits_);
      return fail(f.status, f.message, consumed);
    }
    if (!had_head && parser_.is_header_done()) {
      if (std::optional<HttpFailure> f = check_head()) return fail(f->status, std::move(f->message), consumed);
      parser_.eager(true);  // the body: as much per put() as there is
    }
  }
  // A head without a body (no Content-Length, not chunked) is done once it is read.
  return {parser_.is_done() ? State::kDone : State::kNeedMore, consumed};
}

HttpRequest RequestParser::take_request() {
  auto message = parser_.release();
  HttpRequest request;
  request.method = std::string(message.method_string());
  const std::string_view target = message.target();
  const size_t q = target.find('?');
  request.path = std::string(target.substr(0, q));
  if (q != std::string_view::npos) request.query = std::string(target.substr(q + 1));
  for (const auto& field : message) request.headers.emplace_back(lower(field.name_string()), field.value());
  request.body = std::move(message.body());
  return request;
}

std::variant<HttpRequest, HttpFailure> parse_http_request(std::string_view bytes, const HttpLimits& limits) {
  RequestParser parser(limits);
  const RequestParser::Progress progress = parser.feed(bytes);
  if (progress.state == RequestParser::State::kFailed) return parser.failure();
  if (progress.state == RequestParser::State::kNeedMore) return HttpFailure{400, "incomplete HTTP request"};
  return parser.take_request();
}

const std::string* HttpRequest::header(std::string_view name) const {
  for (const auto& [n, v] : headers)
    if (n == name) return &v;
  return nullptr;
}

}  // namespace moeserve::serve
