#include "bench/http_client.h"

#include <sys/socket.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cstdlib>
#include <limits>

#include "core/error.h"

namespace moeserve::bench {

HttpUrl parse_http_url(const std::string& url, const std::string& what) {
  const std::string scheme = "http://";
  MS_CHECK(url.rfind(scheme, 0) == 0, "{} '{}': expected http://HOST[:PORT][/PREFIX] (no TLS)", what, url);
  std::string rest = url.substr(scheme.size());
  HttpUrl out;
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    out.path_prefix = rest.substr(slash);
    rest = rest.substr(0, slash);
    while (!out.path_prefix.empty() && out.path_prefix.back() == '/') out.path_prefix.pop_back();
  }
  std::string port;
  if (!rest.empty() && rest[0] == '[') {
    const size_t close = rest.find(']');
    MS_CHECK(close != std::string::npos, "{} '{}': unterminated [IPv6] host", what, url);
    out.host = rest.substr(1, close - 1);
    if (close + 1 < rest.size()) {
      MS_CHECK(rest[close + 1] == ':', "{} '{}': expected ':' after ']'", what, url);
      port = rest.substr(close + 2);
    }
  } else {
    const size_t colon = rest.rfind(':');
    out.host = rest.substr(0, colon);
    if (colon != std::string::npos) port = rest.substr(colon + 1);
  }
  MS_CHECK(!out.host.empty(), "{} '{}': no host", what, url);
  if (!port.empty()) {
    char* end = nullptr;
    const long value = std::strtol(port.c_str(), &end, 10);
    MS_CHECK(end && *end == '\0' && value > 0 && value <= 65535, "{} '{}': port '{}' is not in 1..65535", what, url,
             port);
    out.port = static_cast<int>(value);
  }
  return out;
}

namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

// Blocking reads and writes each give up after `timeout` (the socket's own timeouts: Asio's
// synchronous calls have none).
void set_io_timeout(tcp::socket& socket, std::chrono::milliseconds timeout) {
  const timeval tv{static_cast<time_t>(timeout.count() / 1000),
                   static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
  ::setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(socket.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

void connect_to(tcp::socket& socket, asio::io_context& io, const HttpUrl& url) {
  boost::system::error_code ec;
  tcp::resolver resolver(io);
  const auto endpoints = resolver.resolve(url.host, std::to_string(url.port), ec);
  MS_CHECK(!ec, "cannot resolve {}: {}", url.host, ec.message());
  asio::connect(socket, endpoints, ec);
  MS_CHECK(!ec, "cannot connect to {}:{}: {}", url.host, url.port, ec.message());
  socket.set_option(tcp::no_delay(true), ec);
}

std::string describe(const boost::system::error_code& ec) {
  return ec == asio::error::would_block || ec == asio::error::try_again ? "timed out" : ec.message();
}

}  // namespace

HttpResponse http_call(const HttpUrl& url, const HttpCall& call) {
  asio::io_context io;
  tcp::socket socket(io);
  connect_to(socket, io, url);
  set_io_timeout(socket, call.timeout);

  http::request<http::string_body> request(http::string_to_verb(call.method), url.path_prefix + call.path, 11);
  request.set(http::field::host, (url.host.find(':') != std::string::npos ? "[" + url.host + "]" : url.host) + ":" +
                                     std::to_string(url.port));
  request.set(http::field::connection, "close");
  for (const auto& [name, value] : call.headers) request.set(name, value);
  request.body() = call.body;
  if (!call.body.empty() || call.method == "POST") request.content_length(call.body.size());
  boost::system::error_code ec;
  http::write(socket, request, ec);
  MS_CHECK(!ec, "HTTP write: {}", describe(ec));

  // The body as it arrives (a streamed response's chunks one by one), into a fixed buffer.
  boost::beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());  // a stream is as long as it is
  http::read_header(socket, buffer, parser, ec);
  MS_CHECK(!ec, "HTTP: reading the response head: {}", describe(ec));
  HttpResponse response;
  response.status = static_cast<int>(parser.get().result_int());
  char piece[16384];
  while (!parser.is_done()) {
    parser.get().body().data = piece;
    parser.get().body().size = sizeof(piece);
    http::read_some(socket, buffer, parser, ec);
    if (ec == http::error::need_buffer) ec = {};
    MS_CHECK(!ec, "HTTP: reading the response body: {}", describe(ec));
    const size_t n = sizeof(piece) - parser.get().body().size;
    if (n == 0) continue;
    if (call.on_body)
      call.on_body(response.status, std::string_view(piece, n));
    else
      response.body.append(piece, n);
  }
  return response;
}

void SseParser::feed(std::string_view bytes, const std::function<void(const std::string&)>& on_data) {
  // Line ends may be CRLF; JSON data never holds a raw CR, so dropping every CR is safe.
  for (char c : bytes)
    if (c != '\r') buffer_ += c;
  size_t end;
  while ((end = buffer_.find("\n\n")) != std::string::npos) {
    const std::string event = buffer_.substr(0, end);
    buffer_.erase(0, end + 2);
    std::string data;
    size_t start = 0;
    while (start <= event.size()) {
      size_t nl = event.find('\n', start);
      if (nl == std::string::npos) nl = event.size();
      std::string line = event.substr(start, nl - start);
      if (line.rfind("data:", 0) == 0) {
        std::string value = line.substr(5);
        if (!value.empty() && value.front() == ' ') value.erase(0, 1);
        if (!data.empty()) data += '\n';
        data += value;
      }
      start = nl + 1;
    }
    if (!data.empty()) on_data(data);
  }
}

}  // namespace moeserve::bench
