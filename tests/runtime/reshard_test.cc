// Re-plan from resident weights (Engine(model, options, reshard_from)): for every ordered pair
// of presets up to 8 ranks that the model admits, the new plan's shards assembled from the old
// engine's are bit-identical, rank by rank and tensor by tensor, to a fresh load under the new
// plan; and nothing is read from the model's source. Synthetic weights in the backend's fp32
// (cpu) and bf16 (cpu-bf16), INT4 routed experts and FP8 blocks (moved packed with their scales);
// and on one GPU, where the new shards view the old ones in device memory.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/model_source.h"
#include "model/quantization.h"
#include "parallel/plan_parse.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/rank_devices.h"

namespace moeserve::runtime {
namespace {

// Tiny synthetic weights: unquantized (""), K2.6's INT4 routed experts ("int4") or FP8
// blocks of 8 x 8 ("fp8").
ModelSource tiny(const std::string& quantization = "") {
  ModelSource m = open_model("synthetic:tiny:layers=3");
  if (quantization.empty()) return m;
  m.config.moe_intermediate_size = 256;  // INT4 groups of 32 under MoE TP 8
  if (quantization == "int4") {
    m.config.quantization = published_quantization("kimi-k2.6", m.config.tensor_prefix);
  } else {
    const nlohmann::json q = {
        {"quant_method", "fp8"}, {"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"weight_block_size", {8, 8}}};
    m.config.quantization = parse_quantization_config(q, m.spec, "quantization_config.", m.config.tensor_prefix);
  }
  m.config.validate();
  return m;
}

EngineOptions options_of(const std::string& plan, const std::string& backend) {
  EngineOptions o;
  o.plan = parallel::parse_plan(plan);
  o.backend = backend;
  o.page_size = 8;
  o.num_pages = 4;
  o.graphs = false;
  return o;
}

// Every rank's rectangles, with each one's bytes downloaded from its backend.
struct RankBytes {
  const WeightIndex* index = nullptr;
  std::map<const std::byte*, std::vector<std::byte>> bytes;  // by Placement::data
};

std::vector<RankBytes> bytes_of(Engine& engine) {
  std::vector<RankBytes> out(static_cast<size_t>(engine.options().plan.world()));
  engine.for_each_rank([&](Engine::RankView& v) {
    RankBytes& r = out[static_cast<size_t>(v.rank)];
    r.index = &v.model.weight_index();
    for (const auto& [matrix, placements] : r.index->matrices())
      for (const Placement& p : placements) {
        std::vector<std::byte>& host = r.bytes[p.data];
        host.resize(static_cast<size_t>(p.rows.size() * p.col_bytes.size()));
        const auto* begin = static_cast<const std::byte*>(p.buffer->data());
        v.backend.download(host.data(), *p.buffer, static_cast<size_t>(p.data - begin), host.size());
      }
  });
  return out;
}

// Every rectangle of every rank of `fresh` is in `resharded` at the same place of the same
// matrix with the same bytes; returns the bytes compared.
int64_t expect_identical(Engine& fresh, Engine& resharded, const std::string& what) {
  const std::vector<RankBytes> a = bytes_of(fresh), b = bytes_of(resharded);
  int64_t bytes = 0;
  for (size_t r = 0; r < a.size(); ++r) {
    EXPECT_EQ(a[r].index->count(), b[r].index->count()) << what << " rank " << r;
    for (const auto& [matrix, placements] : a[r].index->matrices()) {
      const std::vector<Placement>& other = b[r].index->of(matrix);
      EXPECT_EQ(other.size(), placements.size()) << what << " rank " << r << " tensor " << matrix;
      for (size_t i = 0; i < std::min(other.size(), placements.size()); ++i) {
        const Placement& x = placements[i];
        const Placement& y = other[i];
        EXPECT_TRUE(x.rows == y.rows && x.col_bytes == y.col_bytes) << what << " rank " << r << " " << matrix;
        if (x.rows == y.rows && x.col_bytes == y.col_bytes) {
          EXPECT_TRUE(a[r].bytes.at(x.data) == b[r].bytes.at(y.data)) << what << " rank " << r << " tensor " << matrix;
        }
        bytes += x.rows.size() * x.col_bytes.size();
      }
    }
  }
  return bytes;
}

struct Variant {
  std::string name, backend;
  ModelSource model;
};

// Engines of every preset the model admits (a fresh load each).
std::map<std::string, std::unique_ptr<Engine>> admitted(const Variant& v) {
  std::map<std::string, std::unique_ptr<Engine>> out;
  for (const std::string& plan : parallel::preset_names(8)) {
    try {
      out[plan] = std::make_unique<Engine>(v.model, options_of(plan, v.backend));
    } catch (const Error&) {  // a plan this model's shapes do not admit (e.g. a split that cuts a scale block)
    }
  }
  return out;
}

void check_every_pair(const Variant& v, size_t min_plans) {
  std::map<std::string, std::unique_ptr<Engine>> engines = admitted(v);
  ASSERT_GE(engines.size(), min_plans) << v.name;
  std::printf("%s: %zu presets admitted\n", v.name.c_str(), engines.size());
  int pairs = 0, views = 0;
  for (auto& [from, old_engine] : engines) {
    for (auto& [to, fresh] : engines) {
      const std::string what = v.name + " " + from + " -> " + to;
      Engine resharded(v.model, options_of(to, v.backend), *old_engine);
      const int64_t compared = expect_identical(*fresh, resharded, what);
      const EngineStats stats = resharded.stats();
      int64_t moved = 0, viewed = 0;
      for (const ReshardStats& s : stats.reshard) {
        moved += s.local_bytes + s.peer_bytes;
        viewed += s.viewed_bytes;
      }
      // Every byte of the new shards was copied from the old ones or is a view of them (CPU
      // ranks share one address space), none read from the source.
      EXPECT_EQ(moved + viewed, compared) << what;
      EXPECT_GT(compared, 0) << what;
      // Shards of the same plan are all views, packed ones too.
      if (from == to) {
        EXPECT_EQ(moved, 0) << what;
      }
      views += viewed > 0;
      ++pairs;
    }
  }
  EXPECT_EQ(pairs, static_cast<int>(engines.size() * engines.size()));
  EXPECT_GE(views, static_cast<int>(engines.size())) << v.name << ": pairs that viewed old shards";
}

TEST(Reshard, EveryPairOfPresetsFp32) { check_every_pair({"fp32", "cpu", tiny()}, 20); }

TEST(Reshard, EveryPairOfPresetsBf16) { check_every_pair({"bf16", "cpu-bf16", tiny()}, 20); }

TEST(Reshard, EveryPairOfPresetsInt4Experts) { check_every_pair({"int4", "cpu-bf16", tiny("int4")}, 20); }

TEST(Reshard, EveryPairOfPresetsFp8Blocks) { check_every_pair({"fp8", "cpu-bf16", tiny("fp8")}, 4); }

// One GPU, single -> single: the new engine's weights are views of the old one's device memory
// (packed ones too), its KV caches the old engine's, nothing read from the source or copied; the
// bytes equal a fresh load's and so do the greedy tokens. (FP8 is viewed as INT4 is; the tiny
// model's 32-wide projections are below the CUDA FP8 kernels' 64.)
TEST(Reshard, OnOneGpuTheNewShardViewsTheOldOne) {
  if (visible_gpus() < 1) GTEST_SKIP() << "no GPU visible";
  for (const std::string quantization : {"", "int4"}) {
    const std::string what = "cuda single -> single " + (quantization.empty() ? "bf16" : quantization);
    const ModelSource model = tiny(quantization);
    Engine old_engine(model, options_of("single", "cuda"));
    Engine fresh(model, options_of("single", "cuda"));
    Engine resharded(model, options_of("single", "cuda"), old_engine, /*take_caches=*/true);
    const int64_t compared = expect_identical(fresh, resharded, what);
    const ReshardStats s = resharded.stats().reshard.at(0);
    EXPECT_EQ(s.viewed_bytes, compared) << what;
    EXPECT_EQ(s.local_bytes + s.peer_bytes, 0) << what;
    EXPECT_GT(s.reused_cache_bytes, 0) << what;
    GenerateRequest request;
    request.prompt = {3, 1, 4, 1, 5};
    request.max_new_tokens = 8;
    const std::vector<GenerateRequest> requests = {request};
    EXPECT_EQ(generate(resharded, requests).at(0).tokens, generate(fresh, requests).at(0).tokens) << what;
  }
}

// A re-plan's KV caches are not zeroed (taken over stale, or allocated for overwrite; GPU
// caches never are), so no slot may be read before its sequence wrote it: with every cache
// filled with NaN first, the logits and greedy tokens are those of a clean engine, bit for bit.
TEST(Reshard, NoKvSlotIsReadBeforeItIsWritten) {
  std::vector<GenerateRequest> requests(3);
  for (size_t i = 0; i < requests.size(); ++i) {
    for (size_t t = 0; t < 3 + 4 * i; ++t) requests[i].prompt.push_back(static_cast<int32_t>(7 + 13 * t + i));
    requests[i].max_new_tokens = 6;
  }
  GenerateOptions with_logits;
  with_logits.prompt_logits = true;
  for (const std::string plan : {"single", "tp2", "pp2", "ep2-dp"}) {
    EngineOptions options = options_of(plan, "cpu");
    options.num_pages = kv_pages_for(requests, options.page_size);
    Engine clean(tiny(), options), poisoned(tiny(), options);
    std::atomic<size_t> poisoned_bytes{0};
    poisoned.for_each_rank([&](Engine::RankView& v) {
      for (ops::Buffer* cache : v.model.kv_caches()) {
        const std::vector<float> nan(cache->nbytes() / sizeof(float), std::numeric_limits<float>::quiet_NaN());
        v.backend.upload(*cache, 0, nan.data(), nan.size() * sizeof(float));
        poisoned_bytes += cache->nbytes();
      }
    });
    ASSERT_GT(poisoned_bytes.load(), 0u) << plan;
    const std::vector<GenerateResult> want = generate(clean, requests, with_logits);
    const std::vector<GenerateResult> got = generate(poisoned, requests, with_logits);
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << plan << " request " << i;
      ASSERT_EQ(got[i].prompt_logits.nbytes(), want[i].prompt_logits.nbytes()) << plan;
      EXPECT_EQ(std::memcmp(got[i].prompt_logits.raw(), want[i].prompt_logits.raw(), want[i].prompt_logits.nbytes()), 0)
          << plan << " request " << i;
    }
  }
}

TEST(Reshard, RefusesAnotherModel) {
  Engine old_engine(tiny(), options_of("tp2", "cpu"));
  ModelSource other = open_model("synthetic:tiny:layers=3:seed=7");
  try {
    Engine e(other, options_of("ep2", "cpu"), old_engine);
    FAIL() << "resharding another model's weights was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("synthetic:tiny:layers=3:seed=7"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moeserve::runtime
