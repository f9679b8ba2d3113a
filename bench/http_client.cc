#include "bench/http_client.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

int connect_to(const HttpUrl& url) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(url.host.c_str(), std::to_string(url.port).c_str(), &hints, &found);
  MS_CHECK(rc == 0, "cannot resolve {}: {}", url.host, gai_strerror(rc));
  int fd = -1;
  int last_errno = 0;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    last_errno = errno;
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(found);
  MS_CHECK(fd >= 0, "cannot connect to {}:{}: {}", url.host, url.port, std::strerror(last_errno));
  return fd;
}

void wait_ready(int fd, short events, std::chrono::milliseconds timeout, const char* what) {
  pollfd p{fd, events, 0};
  const int rc = ::poll(&p, 1, static_cast<int>(timeout.count()));
  MS_CHECK(rc > 0, "HTTP {}: {}", what, rc == 0 ? "timed out" : std::strerror(errno));
}

// Reads from the socket into a buffer; the decoder takes bytes from its front.
class Reader {
 public:
  Reader(int fd, std::chrono::milliseconds timeout) : fd_(fd), timeout_(timeout) {}
  // Appends more bytes; false at end of stream.
  bool more() {
    wait_ready(fd_, POLLIN, timeout_, "read");
    char chunk[16384];
    ssize_t n;
    do n = ::recv(fd_, chunk, sizeof(chunk), 0);
    while (n < 0 && errno == EINTR);
    MS_CHECK(n >= 0, "HTTP read: {}", std::strerror(errno));
    if (n == 0) return false;
    buf.append(chunk, static_cast<size_t>(n));
    return true;
  }
  std::string line() {  // without CRLF
    size_t end;
    while ((end = buf.find("\r\n")) == std::string::npos) MS_CHECK(more(), "HTTP: connection closed mid-line");
    std::string out = buf.substr(0, end);
    buf.erase(0, end + 2);
    return out;
  }
  std::string buf;

 private:
  int fd_;
  std::chrono::milliseconds timeout_;
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

HttpResponse http_call(const HttpUrl& url, const HttpCall& call) {
  Socket socket(connect_to(url));
  std::string head = call.method + " " + url.path_prefix + call.path + " HTTP/1.1\r\nHost: " +
                     (url.host.find(':') != std::string::npos ? "[" + url.host + "]" : url.host) + ":" +
                     std::to_string(url.port) + "\r\nConnection: close\r\n";
  for (const auto& [name, value] : call.headers) head += name + ": " + value + "\r\n";
  if (!call.body.empty() || call.method == "POST")
    head += "Content-Length: " + std::to_string(call.body.size()) + "\r\n";
  head += "\r\n";
  head += call.body;
  for (size_t sent = 0; sent < head.size();) {
    wait_ready(socket.fd(), POLLOUT, call.timeout, "write");
    const ssize_t n = ::send(socket.fd(), head.data() + sent, head.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    MS_CHECK(n > 0, "HTTP write: {}", std::strerror(errno));
    sent += static_cast<size_t>(n);
  }

  Reader reader(socket.fd(), call.timeout);
  HttpResponse response;
  const std::string status_line = reader.line();
  MS_CHECK(status_line.rfind("HTTP/1.", 0) == 0 && status_line.size() >= 12, "HTTP: bad status line '{}'", status_line);
  response.status = std::atoi(status_line.c_str() + 9);
  bool chunked = false;
  long long content_length = -1;
  for (std::string line = reader.line(); !line.empty(); line = reader.line()) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string name = lower(line.substr(0, colon));
    std::string value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.erase(0, 1);
    if (name == "transfer-encoding" && lower(value).find("chunked") != std::string::npos) chunked = true;
    if (name == "content-length") content_length = std::atoll(value.c_str());
  }
  auto deliver = [&](std::string_view piece) {
    if (piece.empty()) return;
    if (call.on_body)
      call.on_body(response.status, piece);
    else
      response.body.append(piece);
  };
  if (chunked) {
    for (;;) {
      const std::string size_line = reader.line();
      const unsigned long long size = std::strtoull(size_line.c_str(), nullptr, 16);
      if (size == 0) break;  // trailers are not read: the connection closes
      while (reader.buf.size() < size + 2) MS_CHECK(reader.more(), "HTTP: connection closed mid-chunk");
      deliver(std::string_view(reader.buf).substr(0, size));
      reader.buf.erase(0, size + 2);
    }
  } else if (content_length >= 0) {
    while (reader.buf.size() < static_cast<size_t>(content_length))
      MS_CHECK(reader.more(), "HTTP: connection closed after {} of {} body bytes", reader.buf.size(), content_length);
    deliver(std::string_view(reader.buf).substr(0, static_cast<size_t>(content_length)));
  } else {
    while (reader.more()) {
    }
    deliver(reader.buf);
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
