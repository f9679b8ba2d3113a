#include "serve/http_exchange.h"

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/write.hpp>  // operator<< of a header
#include <cstdio>
#include <optional>
#include <sstream>

#include "serve/http_connection.h"

namespace moeserve::serve {

namespace {

namespace http = boost::beast::http;

// Status line and headers, up to the blank line; `framing` adds Content-Length or chunked.
std::string response_head(int status, std::string_view content_type, bool keep_alive, const HttpHeaders& extra,
                          const HttpHeaders& framing) {
  http::response_header<> head;
  head.version(11);
  head.result(static_cast<unsigned>(status));
  head.set(http::field::content_type, content_type);
  head.set(http::field::connection, keep_alive ? "keep-alive" : "close");
  for (const auto& [name, value] : extra) head.insert(name, value);
  for (const auto& [name, value] : framing) head.insert(name, value);
  std::ostringstream out;
  out << head;
  return out.str();
}

}  // namespace

std::string whole_response(int status, std::string_view content_type, std::string_view body, bool keep_alive,
                           const HttpHeaders& extra_headers) {
  std::string out =
      response_head(status, content_type, keep_alive, extra_headers, {{"Content-Length", std::to_string(body.size())}});
  out.append(body);
  return out;
}

std::string error_body(const HttpServerOptions& options, int status, const std::string& message) {
  try {
    return options.error_body(status, message);
  } catch (...) {
    return options.error_body(status, std::string(http::obsolete_reason(static_cast<http::status>(status))));
  }
}

bool HttpExchangeImpl::send(std::string data) { return ok_ = ok_ && connection_.enqueue(std::move(data)); }

bool HttpExchangeImpl::respond(int status, std::string_view content_type, std::string_view body,
                               const HttpHeaders& extra_headers) {
  if (state_ != State::kFresh) return false;
  state_ = State::kDone;
  return send(whole_response(status, content_type, body, keep_alive_, extra_headers));
}

bool HttpExchangeImpl::begin_stream(int status, std::string_view content_type, const HttpHeaders& extra_headers) {
  if (state_ != State::kFresh) return false;
  state_ = State::kStreaming;
  return send(response_head(status, content_type, keep_alive_, extra_headers,
                            {{"Cache-Control", "no-cache"}, {"Transfer-Encoding", "chunked"}}));
}

bool HttpExchangeImpl::send_chunk(std::string_view data) {
  if (state_ != State::kStreaming || !ok_) return false;
  if (data.empty()) return true;  // an empty chunk would end the stream
  char size[32];
  const int n = std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  std::string chunk(size, static_cast<size_t>(n));
  chunk.append(data);
  chunk += "\r\n";
  return send(std::move(chunk));
}

bool HttpExchangeImpl::end_stream() {
  if (state_ != State::kStreaming) return false;
  state_ = State::kDone;
  return send("0\r\n\r\n");
}

bool HttpExchangeImpl::client_gone() {
  if (!ok_) return true;
  const bool may_probe = !probed_ && http11_ && state_ == State::kFresh;
  bool probed = false;
  const bool gone = connection_.client_gone(may_probe, probed);
  probed_ = probed_ || probed;
  if (gone) ok_ = false;
  return gone;
}

bool run_handler(const HttpHandler& handler, const HttpServerOptions& options, const HttpRequest& request,
                 HttpExchangeImpl& exchange) {
  std::optional<std::string> failure;  // what it threw
  try {
    handler(request, exchange);
  } catch (const std::exception& e) {
    failure = e.what();
  } catch (...) {
    failure = "the handler failed";
  }
  if (failure) exchange.close_after();
  if (!exchange.responded())
    exchange.respond(500, "application/json",
                     error_body(options, 500, failure.value_or("the handler sent no response")), {});
  return !failure && exchange.healthy() && exchange.keep_alive();
}

}  // namespace moeserve::serve
