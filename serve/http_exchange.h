// The handler's side of a request (HttpExchange over an HttpConnection's output queue), the
// formatting of responses (heads by Boost.Beast, chunked framing) and the guard that runs a
// handler. Internal to serve::HttpServer.
#pragma once

#include <string>
#include <string_view>

#include "serve/http_server.h"

namespace moeserve::serve {

class HttpConnection;

// A whole response: head (with Content-Length) and body.
std::string whole_response(int status, std::string_view content_type, std::string_view body, bool keep_alive,
                           const HttpHeaders& extra_headers);
// options.error_body's answer, or a plain one should it fail (e.g. a message that is not UTF-8).
std::string error_body(const HttpServerOptions& options, int status, const std::string& message);

class HttpExchangeImpl final : public HttpExchange {
 public:
  // `http11`: the client speaks HTTP/1.1, so it must accept interim (1xx) responses.
  HttpExchangeImpl(HttpConnection& connection, bool keep_alive, bool http11)
      : connection_(connection), keep_alive_(keep_alive), http11_(http11) {}

  bool responded() const { return state_ != State::kFresh; }
  bool healthy() const { return ok_ && state_ != State::kStreaming; }
  bool keep_alive() const { return keep_alive_; }
  // The answer (if any is still to come) says Connection: close, and the connection closes after it.
  void close_after() { keep_alive_ = false; }

  bool respond(int status, std::string_view content_type, std::string_view body,
               const HttpHeaders& extra_headers) override;
  bool begin_stream(int status, std::string_view content_type, const HttpHeaders& extra_headers) override;
  bool send_chunk(std::string_view data) override;
  bool end_stream() override;
  bool client_gone() override;

 private:
  enum class State { kFresh, kStreaming, kDone };
  bool send(std::string data);

  HttpConnection& connection_;
  bool keep_alive_;
  bool http11_;
  bool probed_ = false;  // the 100 Continue probe of a half-closed client went out
  bool ok_ = true;
  State state_ = State::kFresh;
};

// Runs the handler; whatever it throws is answered 500 (if no answer began) and closes the
// connection. False: the connection must close after the answer.
bool run_handler(const HttpHandler& handler, const HttpServerOptions& options, const HttpRequest& request,
                 HttpExchangeImpl& exchange);

}  // namespace moeserve::serve
