// The benchmark client's pieces without a server: percentiles as numpy computes them, the
// metrics' arithmetic (throughput = tokens / duration, TPOT, concurrency), the random
// datasets (lengths in range, deterministic by seed, errors naming the flag), SSE parsing
// across arbitrary splits, and URL parsing.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "bench/dataset.h"
#include "bench/http_client.h"
#include "bench/metrics.h"
#include "bench/protocol.h"
#include "bench/report.h"
#include "core/error.h"

namespace moeserve::bench {
namespace {

TEST(Percentile, MatchesNumpyLinearInterpolation) {
  const std::vector<double> v = {4, 1, 3, 2, 10};
  EXPECT_DOUBLE_EQ(percentile(v, 50), 3.0);   // numpy.percentile([4,1,3,2,10], 50)
  EXPECT_DOUBLE_EQ(percentile(v, 90), 7.6);   // 4 + 0.6 * (10 - 4)
  EXPECT_DOUBLE_EQ(percentile(v, 99), 9.76);  // 4 + 0.96 * 6
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 10.0);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0.0);
  EXPECT_DOUBLE_EQ(percentile({5}, 99), 5.0);
}

TEST(Metrics, ThroughputsLatenciesAndConcurrencyAddUp) {
  std::vector<RequestOutcome> outcomes(3);
  outcomes[0] = {true, "", 10, 5, 0.1, 0.5, {0.1, 0.1, 0.1, 0.1}, {}, ""};
  outcomes[1] = {true, "", 20, 1, 0.2, 0.2, {}, {}, ""};
  outcomes[2] = {false, "HTTP 500", 0, 0, 0, 0.3, {}, {}, ""};
  const BenchMetrics m = compute_metrics(outcomes, 2.0);
  EXPECT_EQ(m.completed, 2);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input_tokens, 30);
  EXPECT_EQ(m.total_output_tokens, 6);
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(m.input_throughput, 15.0);
  EXPECT_DOUBLE_EQ(m.output_throughput, 3.0);
  EXPECT_DOUBLE_EQ(m.total_throughput, 18.0);
  EXPECT_DOUBLE_EQ(m.concurrency, 0.35);    // (0.5 + 0.2) / 2
  EXPECT_DOUBLE_EQ(m.tpot_ms.mean, 100.0);  // (0.5 - 0.1) / 4: one-token requests have none
  EXPECT_DOUBLE_EQ(m.ttft_ms.mean, 150.0);
  EXPECT_DOUBLE_EQ(m.itl_ms.median, 100.0);
  EXPECT_DOUBLE_EQ(m.e2e_latency_ms.p99, 200.0 + 0.99 * 300.0);

  nlohmann::ordered_json j;
  add_metrics_json(m, j);
  for (const char* field : {"request_throughput", "input_throughput", "output_throughput", "total_throughput",
                            "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                            "mean_itl_ms", "p99_itl_ms", "mean_e2e_latency_ms", "median_e2e_latency_ms", "concurrency",
                            "completed", "total_input_tokens", "total_output_tokens", "duration"})
    EXPECT_TRUE(j.contains(field)) << field;
  const BenchMetrics back = metrics_from_json(j);
  EXPECT_EQ(back.total_output_tokens, m.total_output_tokens);
  EXPECT_DOUBLE_EQ(back.e2e_latency_ms.p99, m.e2e_latency_ms.p99);
}

// sglang.bench_serving's peaks, by its own rule: per whole second from the first send, the
// tokens that arrived (first at start + TTFT, then after each gap) and the requests in flight.
TEST(Metrics, PeakTokensPerSecondAndConcurrentRequestsAsSglang) {
  std::vector<RequestOutcome> outcomes(3);
  outcomes[0] = {true, "", 1, 4, 0.5, 1.6, {0.2, 0.3, 0.6}, {}, ""};  // tokens at 0.5, 0.7, 1.0, 1.6
  outcomes[0].start_s = 0;
  outcomes[1] = {true, "", 1, 3, 0.1, 0.4, {0.1, 0.1}, {}, ""};  // tokens at 1.3, 1.4, 1.5
  outcomes[1].start_s = 1.2;
  outcomes[2] = {false, "HTTP 500", 0, 0, 0.1, 0.2, {}, {}, ""};  // failed: not counted
  outcomes[2].start_s = 0.1;
  const BenchMetrics m = compute_metrics(outcomes, 2.0);
  EXPECT_DOUBLE_EQ(m.max_output_tokens_per_s, 5.0);  // second 1: 1.0, 1.3, 1.4, 1.5, 1.6
  EXPECT_EQ(m.max_concurrent_requests, 2);           // second 1: both
  nlohmann::ordered_json j;
  add_metrics_json(m, j);
  EXPECT_DOUBLE_EQ(j["max_output_tokens_per_s"].get<double>(), 5.0);
  EXPECT_TRUE(j["accept_length"].is_null());  // no speculative decoding: null, as sglang writes it
  EXPECT_EQ(metrics_from_json(j).max_concurrent_requests, 2);
}

TEST(Dataset, LengthsInRangeAndDeterministic) {
  DatasetOptions o;
  o.num_prompts = 200;
  o.input_len = 40;
  o.output_len = 8;
  o.range_ratio = 0.5;
  o.vocab_size = 100;
  const auto a = make_prompts(o);
  ASSERT_EQ(a.size(), 200u);
  for (const auto& p : a) {
    EXPECT_GE(p.input_len, 20);
    EXPECT_LE(p.input_len, 40);
    EXPECT_GE(p.output_len, 4);
    EXPECT_LE(p.output_len, 8);
    EXPECT_EQ(static_cast<int64_t>(p.ids.size()), p.input_len);
    for (int32_t id : p.ids) EXPECT_TRUE(id >= 0 && id < 100);
  }
  const auto b = make_prompts(o);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].ids, b[i].ids);
  o.seed = 2;
  EXPECT_NE(make_prompts(o)[0].ids, a[0].ids);

  o.name = "random";
  o.range_ratio = 1.0;
  for (const auto& p : make_prompts(o)) {
    EXPECT_EQ(p.input_len, 40);
    EXPECT_TRUE(p.ids.empty());
    EXPECT_EQ(std::count(p.text.begin(), p.text.end(), ' '), 39);  // 40 words
  }
}

TEST(Dataset, ErrorsNameTheFlag) {
  auto message = [](DatasetOptions o) {
    try {
      make_prompts(o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  DatasetOptions o;
  o.name = "sharegpt";
  EXPECT_NE(message(o).find("--dataset"), std::string::npos);
  o = {};
  o.num_prompts = 0;
  EXPECT_NE(message(o).find("--num-prompts"), std::string::npos);
  o = {};
  o.range_ratio = 1.5;
  EXPECT_NE(message(o).find("--random-range-ratio"), std::string::npos);
  o = {};
  o.output_len = 0;
  EXPECT_NE(message(o).find("--random-output-len"), std::string::npos);
}

int64_t words(const std::string& text) {
  std::istringstream in(text);
  int64_t n = 0;
  for (std::string w; in >> w;) ++n;
  return n;
}

// A directory of this test's own (mkdtemp under the system temp dir), removed at exit: the
// files it writes cannot collide with another run's, and a name it expects to be missing is.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "moeserve-bench-test-XXXXXX").string();
    MS_CHECK(::mkdtemp(pattern.data()) != nullptr, "mkdtemp {} failed", pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(file(name)) << text;
    return file(name);
  }

 private:
  std::filesystem::path path_;
};

TEST(ShareGpt, PairsFilteredShuffledAndCounted) {
  const TempDir temp;
  const std::string path = temp.write("sharegpt.json", R"([
    {"conversations": [{"from": "human", "value": "one two three"}, {"from": "gpt", "value": "a b c d"}]},
    {"conversations": [{"from": "human", "value": "short"}, {"from": "gpt", "value": "x y"}]},
    {"conversations": [{"from": "human", "value": "alpha beta"}]},
    {"conversations": [{"from": "human", "value": "p q r s t"}, {"from": "gpt", "value": "u v"}, {"from": "human", "value": "w"}]},
    {"id": "no conversations"}
  ])");
  const auto prompts = sharegpt_prompts(path, 10, 0, 1, words);
  ASSERT_EQ(prompts.size(), 2u);  // "short" has 1 token; one conversation has a single turn
  int64_t total_in = 0, total_out = 0;
  for (const auto& p : prompts) {
    EXPECT_EQ(p.input_len, words(p.text));
    EXPECT_TRUE(p.ids.empty());
    total_in += p.input_len;
    total_out += p.output_len;
  }
  EXPECT_EQ(total_in, 3 + 5);
  EXPECT_EQ(total_out, 4 + 2);
  const auto fixed = sharegpt_prompts(path, 1, 7, 1, words);
  ASSERT_EQ(fixed.size(), 1u);
  EXPECT_EQ(fixed[0].output_len, 7);
  EXPECT_EQ(fixed[0].text, prompts[0].text);  // the same seed, the same order

  auto message = [&](const std::string& file) {
    try {
      sharegpt_prompts(file, 10, 0, 1, words);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(temp.file("missing.json")).find("cannot open"), std::string::npos);
  EXPECT_NE(message(temp.write("bad.json", "[{")).find("not JSON"), std::string::npos);
  EXPECT_NE(message(temp.write("obj.json", "{}")).find("expected a JSON list"), std::string::npos);
  EXPECT_NE(message(temp.write("empty.json", "[]")).find("no usable conversation"), std::string::npos);
}

TEST(Sse, EventsSplitAnywhere) {
  const std::string stream = "data: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\n: comment\n\ndata: [DONE]\n\n";
  for (size_t split = 0; split <= stream.size(); ++split) {
    SseParser parser;
    std::vector<std::string> got;
    auto on = [&](const std::string& d) { got.push_back(d); };
    parser.feed(std::string_view(stream).substr(0, split), on);
    parser.feed(std::string_view(stream).substr(split), on);
    ASSERT_EQ(got.size(), 3u) << "split " << split;
    EXPECT_EQ(got[0], "{\"a\":1}");
    EXPECT_EQ(got[1], "{\"b\":2}");
    EXPECT_EQ(got[2], "[DONE]");
  }
}

TEST(Url, ParsesHostPortPrefixAndNamesTheFlag) {
  HttpUrl u = parse_http_url("http://127.0.0.1:30000", "--base-url");
  EXPECT_EQ(u.host, "127.0.0.1");
  EXPECT_EQ(u.port, 30000);
  EXPECT_EQ(u.path_prefix, "");
  u = parse_http_url("http://[::1]:8080/api/", "--base-url");
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.port, 8080);
  EXPECT_EQ(u.path_prefix, "/api");
  u = parse_http_url("http://example.com", "--url");
  EXPECT_EQ(u.port, 80);
  try {
    parse_http_url("https://x:1", "--base-url");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--base-url"), std::string::npos);
  }
  EXPECT_THROW(parse_http_url("http://x:99999", "--url"), Error);
}

}  // namespace
}  // namespace moeserve::bench

namespace moeserve::bench {
namespace {

// A plan keeps its colour from one sweep to the next, whatever else is swept, and no two
// plans of one sweep share one.
TEST(Report, PlanColoursStableAcrossSweepsAndDistinctWithinOne) {
  const std::vector<std::string> many = {"single", "tp2",     "ep2",     "pp2", "ep2-dp", "tp4",
                                         "ep4",    "tp2-ep2", "pp2-tp2", "dp2", "ep8",    "tp8"};
  const auto all = plan_colors(many);
  std::set<std::string> distinct;
  for (const auto& [plan, colour] : all) distinct.insert(colour);
  EXPECT_EQ(distinct.size(), many.size());
  const auto two = plan_colors({"ep2", "tp2"});
  const auto reversed = plan_colors({"tp2", "single", "ep2"});
  EXPECT_EQ(two.at("tp2"), reversed.at("tp2"));
  EXPECT_EQ(two.at("ep2"), reversed.at("ep2"));
  EXPECT_EQ(plan_colors({"tp2"}).at("tp2"), reversed.at("tp2"));
}

// `sweep --repeats`: a point's runs and their range reach the JSON, both tables and the
// aggregate chart (a bar from the lowest to the highest run).
TEST(Report, RepeatedRunsShowTheirSpread) {
  SweepResult r;
  r.model = "synthetic:tiny";
  r.backend = "cpu";
  r.plans = {"tp2", "ep2"};
  r.concurrency = {8};
  r.workload = nlohmann::ordered_json::object();
  SweepPoint tp2{"tp2", 8, {}};
  tp2.metrics.output_throughput = 400;
  tp2.runs = 3;
  tp2.output_throughput_min = 350;
  tp2.output_throughput_max = 470;
  SweepPoint ep2{"ep2", 8, {}};
  ep2.metrics.output_throughput = 300;
  r.points = {tp2, ep2};
  const std::string md = sweep_markdown(r);
  EXPECT_NE(md.find("Output tok/s over repeated runs: median [min, max] (3 runs per point)"), std::string::npos);
  EXPECT_NE(md.find("| tp2 | 400 [350, 470] |"), std::string::npos) << md;
  EXPECT_NE(md.find("| ep2 | 300 |"), std::string::npos) << md;
  const std::string html = sweep_html(r);
  EXPECT_NE(html.find("<td>400 [350, 470]</td>"), std::string::npos);
  EXPECT_NE(html.find("tp2 at 8: 350 to 470 over 3 runs"), std::string::npos);
  EXPECT_EQ(html.find("ep2 at 8: 300 to"), std::string::npos);  // a single run draws no bar
  const SweepResult back = sweep_from_json(sweep_json(r));
  ASSERT_EQ(back.points.size(), 2u);
  EXPECT_EQ(back.points[0].runs, 3);
  EXPECT_EQ(back.points[0].output_throughput_min, 350);
  EXPECT_EQ(back.points[0].output_throughput_max, 470);
  EXPECT_EQ(back.points[1].runs, 1);
  // Without repeats the table is not there.
  r.points = {ep2};
  EXPECT_EQ(sweep_markdown(r).find("repeated runs"), std::string::npos);
}

// sglang.bench_serving's reading of each route's events (bench/protocol.h).
TEST(Protocol, EventsWithTextAreTokensAsSglangCounts) {
  using Json = nlohmann::ordered_json;
  StreamReader completions(Protocol::kCompletions);
  EXPECT_FALSE(completions.read(Json::parse(R"({"choices":[{"text":"","token_ids":[300]}]})")).tokens_arrived);
  const StreamEvent a = completions.read(Json::parse(R"({"choices":[{"text":"ab","token_ids":[97,98]}]})"));
  EXPECT_TRUE(a.tokens_arrived);
  EXPECT_EQ(a.ids, (std::vector<int32_t>{97, 98}));
  const StreamEvent usage = completions.read(Json::parse(R"({"choices":[],"usage":{"completion_tokens":3}})"));
  EXPECT_FALSE(usage.tokens_arrived);
  EXPECT_EQ(usage.completion_tokens.value_or(-1), 3);
  StreamReader chat(Protocol::kChat);
  EXPECT_FALSE(chat.read(Json::parse(R"({"choices":[{"delta":{"role":"assistant","content":""}}]})")).tokens_arrived);
  EXPECT_EQ(chat.read(Json::parse(R"({"choices":[{"delta":{"reasoning_content":"hm","content":"x"}}]})")).text, "hmx");
  // The native route's text and count are cumulative: the difference is what arrived.
  StreamReader native(Protocol::kNative);
  EXPECT_FALSE(native.read(Json::parse(R"({"text":"","meta_info":{"completion_tokens":1}})")).tokens_arrived);
  const StreamEvent n = native.read(Json::parse(R"({"text":"ab","meta_info":{"completion_tokens":3}})"));
  EXPECT_TRUE(n.tokens_arrived);
  EXPECT_EQ(n.new_tokens, 2);
  EXPECT_EQ(n.text, "ab");
  EXPECT_FALSE(native.read(Json::parse(R"({"text":"ab","meta_info":{"completion_tokens":3}})")).tokens_arrived);
  EXPECT_EQ(native.read(Json::parse(R"({"error":{"message":"boom"}})")).error, "boom");
  EXPECT_THROW(protocol_of("trt"), Error);
  EXPECT_STREQ(route_of(protocol_of("sglang-oai-chat")), "/v1/chat/completions");
}

}  // namespace
}  // namespace moeserve::bench
