#include "serve/http_server.h"

#include <sys/resource.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cstdio>
#include <thread>

#include "core/error.h"
#include "serve/http_connection.h"

namespace moeserve::serve {

namespace {

constexpr int kReservedFiles = 64;  // descriptors kept for everything but connections (files, logs)
constexpr std::chrono::milliseconds kAcceptRetry(50);

// Raises the soft open-file limit to the hard one, and returns the connections it leaves room for.
int connections_the_file_limit_allows(int wanted) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return wanted;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  if (limit.rlim_cur == RLIM_INFINITY) return wanted;
  // Each connection is one descriptor; a refused one (503) briefly another.
  const auto room = static_cast<int64_t>(limit.rlim_cur) - kReservedFiles;
  return static_cast<int>(std::clamp<int64_t>(room * 9 / 10, 1, wanted));
}

}  // namespace

HttpServer::Context::Context(const HttpServerOptions& options, HttpHandler handler)
    : options(options), handler(std::move(handler)), handlers(options.max_handler_threads) {}

void HttpServer::Context::accept() {
  acceptor.async_accept(asio::make_strand(io), [this](const boost::system::error_code& ec, tcp::socket socket) {
    on_accept(ec, std::move(socket));
  });
}

void HttpServer::Context::on_accept(const boost::system::error_code& ec, tcp::socket socket) {
  if (stopping.load() || !acceptor.is_open()) return;
  if (ec) {  // out of descriptors (EMFILE) or a connection reset before accept: wait a little, go on
    accept_retry.expires_after(kAcceptRetry);
    accept_retry.async_wait([this](const boost::system::error_code& wait_ec) {
      if (!wait_ec) accept();
    });
    return;
  }
  boost::system::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
  auto connection = std::make_shared<HttpConnection>(*this, std::move(socket));
  if (open_connections() >= options.max_connections) {
    connection->refuse();
  } else {
    add(connection);
    connection->start();
  }
  accept();
}

void HttpServer::Context::add(const std::shared_ptr<HttpConnection>& connection) {
  std::lock_guard<std::mutex> lock(mutex_);
  connections_.emplace(connection.get(), connection);
}

void HttpServer::Context::remove(HttpConnection* connection) {
  std::lock_guard<std::mutex> lock(mutex_);
  connections_.erase(connection);
}

int HttpServer::Context::open_connections() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(connections_.size());
}

void HttpServer::Context::for_each_connection(void (HttpConnection::*what)()) {
  std::vector<std::shared_ptr<HttpConnection>> open;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [raw, weak] : connections_)
      if (auto c = weak.lock()) open.push_back(std::move(c));
  }
  for (auto& c : open) c->run_on_strand(what);
}

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler)
    : options_(std::move(options)), handler_(std::move(handler)) {
  if (!options_.error_body) options_.error_body = [](int, const std::string& message) { return message + "\n"; };
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::open_connections() const { return context_ ? context_->open_connections() : 0; }

void HttpServer::start() {
  MS_CHECK(!context_, "HttpServer::start: already started");
  const int allowed = connections_the_file_limit_allows(options_.max_connections);
  if (allowed < options_.max_connections)
    std::fprintf(stderr, "moeserve: the open-file limit allows %d connections (not %d)\n", allowed,
                 options_.max_connections);
  options_.max_connections = allowed;
  auto context = std::make_shared<Context>(options_, handler_);
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(options_.host, ec);
  MS_CHECK(!ec, "--host {}: not an IP address ({})", options_.host, ec.message());
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(options_.port));
  tcp::acceptor& acceptor = context->acceptor;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  MS_CHECK(!ec, "cannot listen on {}:{}: {}", options_.host, options_.port, ec.message());
  port_ = acceptor.local_endpoint().port();
  context->accept();
  for (int i = 0; i < std::max(1, options_.io_threads); ++i)
    context->io_threads.emplace_back([io = &context->io] { io->run(); });
  context_ = std::move(context);
}

void HttpServer::stop_accepting() {
  if (!context_ || context_->stopping.exchange(true)) return;
  asio::post(context_->accept_strand, [context = context_.get()] {
    boost::system::error_code ignored;
    context->acceptor.close(ignored);
    context->accept_retry.cancel();
  });
  context_->for_each_connection(&HttpConnection::drain);
}

void HttpServer::stop(std::chrono::milliseconds grace) {
  if (!context_) return;
  stop_accepting();
  Context& c = *context_;
  const auto quiet = [&c] { return c.open_connections() == 0 && c.handlers_running.load() == 0; };
  const auto give_up = std::chrono::steady_clock::now() + grace;
  while (!quiet() && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  c.for_each_connection(&HttpConnection::abort);
  c.handlers.stop();  // handlers see their clients gone; each returns
  c.keep_running.reset();
  c.io.stop();
  for (std::thread& t : c.io_threads) t.join();
  context_.reset();
}

}  // namespace moeserve::serve
