// serve::parse_http_request: the server's request parser (Beast's, with our stricter checks) on
// bytes in memory. Each framing defect a proxy could read differently is refused with its status;
// what HTTP/1.1 allows is accepted. The same requests over a socket: http_server_test.cc.
#include "serve/http_parse.h"

#include <gtest/gtest.h>

#include <variant>
#include <vector>

namespace moeserve::serve {
namespace {

HttpFailure failure_of(const std::string& bytes, const HttpLimits& limits = {}) {
  auto parsed = parse_http_request(bytes, limits);
  EXPECT_TRUE(std::holds_alternative<HttpFailure>(parsed)) << bytes;
  return std::holds_alternative<HttpFailure>(parsed) ? std::get<HttpFailure>(parsed) : HttpFailure{0, "parsed"};
}

HttpRequest request_of(const std::string& bytes, const HttpLimits& limits = {}) {
  auto parsed = parse_http_request(bytes, limits);
  EXPECT_TRUE(std::holds_alternative<HttpRequest>(parsed))
      << bytes << "\n-> " << (std::holds_alternative<HttpFailure>(parsed) ? std::get<HttpFailure>(parsed).message : "");
  return std::holds_alternative<HttpRequest>(parsed) ? std::get<HttpRequest>(parsed) : HttpRequest{};
}

const std::string kPost = "POST /echo HTTP/1.1\r\n";
const std::string kChunked = kPost + "Transfer-Encoding: chunked\r\n\r\n";

TEST(ParseHttpRequest, RequestLineHeadersAndBody) {
  const HttpRequest r =
      request_of("POST /v1/x?a=1&b HTTP/1.1\r\nHost: h\r\nX-Custom:  v w \r\nContent-Length: 5\r\n\r\nhello");
  EXPECT_EQ(r.method, "POST");
  EXPECT_EQ(r.path, "/v1/x");
  EXPECT_EQ(r.query, "a=1&b");
  ASSERT_NE(r.header("x-custom"), nullptr);
  EXPECT_EQ(*r.header("x-custom"), "v w");
  EXPECT_EQ(r.header("X-Custom"), nullptr);  // names are lower-cased
  EXPECT_EQ(r.body, "hello");
}

TEST(ParseHttpRequest, ChunkedBodiesExtensionsAndEqualRepeatedLengths) {
  EXPECT_EQ(
      request_of(kPost + "Transfer-Encoding: Chunked\r\n\r\n5;ext=1\r\nhello\r\nA;x\r\n0123456789\r\n0\r\n\r\n").body,
      "hello0123456789");
  EXPECT_EQ(request_of(kChunked + "2\r\nab\r\n0\r\nX-Trailer: t\r\n\r\n").body, "ab");
  EXPECT_EQ(request_of(kPost + "Content-Length: 2\r\nContent-Length: 2\r\n\r\nhi").body, "hi");
}

TEST(ParseHttpRequest, APipelinedRequestAfterTheFirstIsLeftAlone) {
  EXPECT_EQ(request_of(kPost + "Content-Length: 2\r\n\r\nhiGET / HTTP/1.1\r\n\r\n").body, "hi");
}

TEST(ParseHttpRequest, AmbiguousFramingIs400) {
  for (const std::string& bytes : {
           kPost + "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
           kPost + "Content-Length: 5, 6\r\n\r\nhello!",
           kPost + "Content-Length: 5, 5\r\n\r\nhello",  // Beast takes this list; we do not
           kPost + "Content-Length: +5\r\n\r\nhello",
           kPost + "Content-Length: 0x5\r\n\r\nhello",
           kPost + "Content-Length: 5a\r\n\r\nhello",
           kPost + "Content-Length: -3\r\n\r\n",
           kPost + "Content-Length : 5\r\n\r\nhello",
           kPost + "X-A: a\nContent-Length: 5\r\n\r\nhello",
           kPost + "X-A: a\rContent-Length: 5\r\n\r\nhello",
           kPost + "X-A: a\r\n b\r\nContent-Length: 5\r\n\r\nhello",   // folded (Beast joins it)
           kPost + "X-A: a\r\n\tb\r\nContent-Length: 5\r\n\r\nhello",  // folded
           kPost + std::string("X-A: a\0b\r\n\r\n", 12),
           kPost + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
           kPost + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
           kPost + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",     // Beast: chunked
           kPost + "Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",  // Beast: no body
           kPost + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
           kPost + "Transfer-Encoding: identity\r\n\r\n",  // Beast: no body
           kPost + "Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
           kChunked + "1x\r\na\r\n0\r\n\r\n",
           kChunked + "+5\r\nhello\r\n0\r\n\r\n",
           kChunked + " 5\r\nhello\r\n0\r\n\r\n",
           kChunked + "5 \r\nhello\r\n0\r\n\r\n",
           kChunked + "0x5\r\nhello\r\n0\r\n\r\n",
           kChunked + "-1\r\na\r\n0\r\n\r\n",
           kChunked + "\r\n",
           kChunked + "5\r\nhelloXX0\r\n\r\n",  // no CRLF after the chunk's data
           kChunked + "1ffffffffffffffff\r\n",  // more hex digits than 64 bits hold
       }) {
    const HttpFailure f = failure_of(bytes);
    EXPECT_EQ(f.status, 400) << bytes << "\n-> " << f.message;
  }
}

TEST(ParseHttpRequest, BadRequestLinesAre400) {
  for (const char* bytes : {"NONSENSE\r\n\r\n", "GET foo HTTP/1.1\r\n\r\n", "GET http://a/ HTTP/1.1\r\n\r\n",
                            "GET / HTTP/2.0\r\n\r\n", "GET /  HTTP/1.1\r\n\r\n", "GET / HTTP/1.1 \r\n\r\n"}) {
    EXPECT_EQ(failure_of(bytes).status, 400) << bytes;
  }
}

TEST(ParseHttpRequest, ChunkSizesBeyondTheBodyLimitAre413WithoutOverflow) {
  const HttpLimits limits{.max_header_bytes = 1024, .max_body_bytes = 1024};
  for (const std::string& chunks :
       std::vector<std::string>{"1\r\na\r\nffffffffffffffff\r\n\r\n", "ffffffffffffffff\r\n",
                                "10\r\n0123456789abcdef\r\nfffffffffffffff0\r\nxx\r\n0\r\n\r\n",
                                "400\r\n" + std::string(1024, 'a') + "\r\n1\r\na\r\n0\r\n\r\n"}) {
    const HttpFailure f = failure_of(kChunked + chunks, limits);
    EXPECT_EQ(f.status, 413) << chunks;
    EXPECT_NE(f.message.find("exceeds 1024 bytes"), std::string::npos) << f.message;
  }
  EXPECT_EQ(request_of(kChunked + "400\r\n" + std::string(1024, 'a') + "\r\n0\r\n\r\n", limits).body.size(), 1024u);
}

TEST(ParseHttpRequest, BodyAndHeaderLimits) {
  const HttpLimits limits{.max_header_bytes = 256, .max_body_bytes = 16};
  EXPECT_EQ(failure_of(kPost + "Content-Length: 17\r\n\r\n", limits).status, 413);  // before the body comes
  EXPECT_EQ(failure_of(kPost + "Content-Length: 99999999999999999999\r\n\r\n", limits).status, 400);
  EXPECT_EQ(failure_of(kPost + "X: " + std::string(300, 'a') + "\r\n\r\n", limits).status, 431);
  EXPECT_EQ(failure_of(kPost + "X: " + std::string(300, 'a'), limits).status, 431);  // no end of head yet
  EXPECT_EQ(request_of(kPost + "Content-Length: 16\r\n\r\n" + std::string(16, 'b'), limits).body.size(), 16u);
}

TEST(ParseHttpRequest, IncompleteIs400AndFedInPiecesIsTheSameRequest) {
  EXPECT_EQ(failure_of(kPost + "Content-Length: 5\r\n\r\nhel").status, 400);
  EXPECT_EQ(failure_of("GET / HTTP/1.1\r\nHost: a\r\n").status, 400);
  // The server feeds what it has read so far; byte by byte gives the same request.
  const std::string bytes = kPost + "Transfer-Encoding: chunked\r\nX: y\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
  RequestParser parser(HttpLimits{});
  std::string unconsumed;
  RequestParser::Progress p;
  for (char c : bytes) {
    unconsumed += c;
    p = parser.feed(unconsumed);
    unconsumed.erase(0, p.consumed);
    ASSERT_NE(p.state, RequestParser::State::kFailed) << parser.failure().message;
  }
  ASSERT_EQ(p.state, RequestParser::State::kDone);
  EXPECT_EQ(parser.take_request().body, "abcde");
}

TEST(ParseHttpRequest, KeepAliveAndExpectContinue) {
  RequestParser parser(HttpLimits{});
  parser.feed("POST / HTTP/1.0\r\nConnection: keep-alive\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n");
  EXPECT_TRUE(parser.header_done());
  EXPECT_TRUE(parser.keep_alive());
  EXPECT_FALSE(parser.http11());
  EXPECT_TRUE(parser.expects_continue());
  RequestParser closing(HttpLimits{});
  closing.feed("GET / HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_FALSE(closing.keep_alive());
  EXPECT_TRUE(closing.http11());
}

}  // namespace
}  // namespace moeserve::serve
