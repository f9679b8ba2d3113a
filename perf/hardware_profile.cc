#include "perf/hardware_profile.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace moeserve::perf {

double Curve::at(double x) const {
  MS_CHECK(!points.empty(), "curve: no points");
  if (x <= points.front().first) return points.front().second;
  if (x >= points.back().first) return points.back().second;
  size_t i = 1;
  while (points[i].first < x) ++i;
  const auto [x0, y0] = points[i - 1];
  const auto [x1, y1] = points[i];
  const double t = (std::log2(x) - std::log2(x0)) / (std::log2(x1) - std::log2(x0));
  return y0 + t * (y1 - y0);
}

namespace {

using Json = nlohmann::ordered_json;

const char* const kTopologies[] = {"nvlink_switch", "pcie_switch", "pcie_host", "infiniband", "in_process"};

struct NumberField {
  const char* name;
  double HardwareProfile::*member;
  bool positive;
};

constexpr NumberField kNumbers[] = {
    {"memory_bytes", &HardwareProfile::memory_bytes, true},
    {"memory_gbs", &HardwareProfile::memory_gbs, true},
    {"matmul_tflops", &HardwareProfile::matmul_tflops, true},
    {"element_bytes", &HardwareProfile::element_bytes, true},
    {"layer_overhead_us", &HardwareProfile::layer_overhead_us, false},
    {"step_overhead_us", &HardwareProfile::step_overhead_us, false},
    {"token_overhead_us", &HardwareProfile::token_overhead_us, false},
};

struct CurveField {
  const char* name;
  Curve HardwareProfile::*member;
};

constexpr CurveField kCurves[] = {
    {"weight_efficiency", &HardwareProfile::weight_efficiency},
    {"kv_efficiency", &HardwareProfile::kv_efficiency},
    {"matmul_efficiency", &HardwareProfile::matmul_efficiency},
    {"prefill_efficiency", &HardwareProfile::prefill_efficiency},
};

// The field's "value", after checking it is there with a non-empty "source".
const Json& sourced(const Json& fields, const std::string& name, const std::string& file, HardwareProfile& profile) {
  MS_CHECK(fields.contains(name), "hardware profile {}: field '{}' is missing", file, name);
  const Json& f = fields[name];
  MS_CHECK(f.is_object() && f.contains("value"),
           "hardware profile {}: field '{}' must be {{\"value\": ..., \"source\": ...}}", file, name);
  MS_CHECK(f.contains("source") && f["source"].is_string() && !f["source"].get<std::string>().empty(),
           "hardware profile {}: field '{}' has no source (a specification or 'measured here with <command>')", file,
           name);
  profile.sources[name] = f["source"].get<std::string>();
  return f["value"];
}

double number(const Json& v, const std::string& name, const std::string& file, bool positive) {
  MS_CHECK(v.is_number(), "hardware profile {}: field '{}' must be a number", file, name);
  const double x = v.get<double>();
  MS_CHECK(std::isfinite(x) && (positive ? x > 0 : x >= 0), "hardware profile {}: field '{}' must be {} (got {})", file,
           name, positive ? "positive" : ">= 0", x);
  return x;
}

Curve curve(const Json& v, const std::string& name, const std::string& file) {
  MS_CHECK(v.is_array() && !v.empty(), "hardware profile {}: field '{}' must be a list of [x, y] points", file, name);
  Curve c;
  for (const Json& p : v) {
    MS_CHECK(p.is_array() && p.size() == 2 && p[0].is_number() && p[1].is_number(),
             "hardware profile {}: field '{}': each point must be [x, y]", file, name);
    const double x = p[0].get<double>(), y = p[1].get<double>();
    MS_CHECK(x > 0 && y >= 0 && (c.points.empty() || x > c.points.back().first),
             "hardware profile {}: field '{}': x must be positive and ascending, y >= 0", file, name);
    c.points.emplace_back(x, y);
  }
  return c;
}

void read_link(const Json& fields, const std::string& file, HardwareProfile& p) {
  const Json& topology = sourced(fields, "link_topology", file, p);
  MS_CHECK(topology.is_string(), "hardware profile {}: field 'link_topology' must be a string", file);
  p.link.topology = topology.get<std::string>();
  MS_CHECK(std::find(std::begin(kTopologies), std::end(kTopologies), p.link.topology) != std::end(kTopologies),
           "hardware profile {}: link_topology '{}' is not one of nvlink_switch, pcie_switch, pcie_host, infiniband, "
           "in_process",
           file, p.link.topology);
  p.link.alpha_us = curve(sourced(fields, "link_alpha_us", file, p), "link_alpha_us", file);
  p.link.link_gbs = number(sourced(fields, "link_gbs", file, p), "link_gbs", file, true);
  p.link.fabric_gbs = number(sourced(fields, "link_fabric_gbs", file, p), "link_fabric_gbs", file, false);
}

}  // namespace

HardwareProfile profile_from_json(const Json& json, const std::string& file) {
  MS_CHECK(json.is_object() && json.contains("fields") && json["fields"].is_object(),
           "hardware profile {}: expected an object with \"name\" and \"fields\"", file);
  HardwareProfile p;
  p.file = file;
  p.name = json.value("name", std::filesystem::path(file).stem().string());
  const Json& fields = json["fields"];
  const double devices = number(sourced(fields, "devices", file, p), "devices", file, true);
  MS_CHECK(devices == std::floor(devices), "hardware profile {}: field 'devices' must be an integer", file);
  p.devices = static_cast<int>(devices);
  for (const NumberField& f : kNumbers)
    p.*(f.member) = number(sourced(fields, f.name, file, p), f.name, file, f.positive);
  for (const CurveField& f : kCurves) p.*(f.member) = curve(sourced(fields, f.name, file, p), f.name, file);
  const Json& share = sourced(fields, "ranks_share_executor", file, p);
  MS_CHECK(share.is_boolean(), "hardware profile {}: field 'ranks_share_executor' must be true or false", file);
  p.ranks_share_executor = share.get<bool>();
  if (p.ranks_share_executor) {
    p.shared_rank_layer_us =
        number(sourced(fields, "shared_rank_layer_us", file, p), "shared_rank_layer_us", file, false);
    p.shared_executor_speedup =
        curve(sourced(fields, "shared_executor_speedup", file, p), "shared_executor_speedup", file);
  }
  read_link(fields, file, p);
  return p;
}

HardwareProfile load_profile(const std::string& path) {
  std::ifstream in(path);
  MS_CHECK(in.good(), "hardware profile {}: cannot read the file", path);
  const Json json = Json::parse(in, nullptr, false);
  MS_CHECK(!json.is_discarded(), "hardware profile {}: not valid JSON", path);
  return profile_from_json(json, path);
}

Json profile_to_json(const HardwareProfile& p) {
  Json fields = Json::object();
  auto put = [&](const std::string& name, Json value) {
    const auto s = p.sources.find(name);
    fields[name] = {{"value", std::move(value)}, {"source", s == p.sources.end() ? "" : s->second}};
  };
  auto points = [](const Curve& c) {
    Json a = Json::array();
    for (const auto& [x, y] : c.points) a.push_back({x, y});
    return a;
  };
  put("devices", p.devices);
  for (const NumberField& f : kNumbers) put(f.name, p.*(f.member));
  for (const CurveField& f : kCurves) put(f.name, points(p.*(f.member)));
  put("ranks_share_executor", p.ranks_share_executor);
  if (p.ranks_share_executor) {
    put("shared_rank_layer_us", p.shared_rank_layer_us);
    put("shared_executor_speedup", points(p.shared_executor_speedup));
  }
  put("link_topology", p.link.topology);
  put("link_alpha_us", points(p.link.alpha_us));
  put("link_gbs", p.link.link_gbs);
  put("link_fabric_gbs", p.link.fabric_gbs);
  return {{"name", p.name}, {"fields", fields}};
}

std::string resolve_profile_path(const std::string& name_or_path, const std::string& profiles_dir) {
  namespace fs = std::filesystem;
  if (fs::is_regular_file(name_or_path)) return name_or_path;
  const fs::path named = fs::path(profiles_dir) / (name_or_path + ".json");
  if (fs::is_regular_file(named)) return named.string();
  std::string known;
  if (fs::is_directory(profiles_dir))
    for (const auto& e : fs::directory_iterator(profiles_dir))
      if (e.path().extension() == ".json") known += (known.empty() ? "" : ", ") + e.path().stem().string();
  fail("--hardware '{}': no such file, and no profile of that name in {} (known: {})", name_or_path, profiles_dir,
       known.empty() ? "none" : known);
}

}  // namespace moeserve::perf
