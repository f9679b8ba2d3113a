// A blocking HTTP/1.1 client on Boost.Beast for the load generator: one connection per request
// ("Connection: close"), whatever framing the response has (Beast's parser), and a body callback
// so that a streamed (SSE) response is seen as it arrives. Plain http:// only.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moeserve::bench {

struct HttpUrl {
  std::string host;  // without brackets for IPv6
  int port = 80;
  std::string path_prefix;  // "" or "/prefix" (no trailing slash)
};

// Parses "http://HOST[:PORT][/prefix]"; throws an Error naming `what` (the flag) when malformed.
HttpUrl parse_http_url(const std::string& url, const std::string& what);

struct HttpResponse {
  int status = 0;
  std::string body;  // empty when a body callback took it
};

struct HttpCall {
  std::string method = "GET";
  std::string path;  // appended to the URL's prefix
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  std::chrono::milliseconds timeout{600000};  // per socket read or write
  // Called with the status and each piece of the decoded body as it arrives; the body is
  // then not kept.
  std::function<void(int status, std::string_view piece)> on_body;
};

// Sends one request and reads the whole response. Throws an Error on connection failures,
// timeouts and malformed responses (an HTTP error status is not an exception).
HttpResponse http_call(const HttpUrl& url, const HttpCall& call);

// Incremental parser of a text/event-stream body: feed it bytes, get each event's data.
class SseParser {
 public:
  // Calls on_data for every complete "data: ..." event in what has arrived so far.
  void feed(std::string_view bytes, const std::function<void(const std::string&)>& on_data);

 private:
  std::string buffer_;
};

}  // namespace moeserve::bench
