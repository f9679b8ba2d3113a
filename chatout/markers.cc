#include "chatout/markers.h"

#include <algorithm>

namespace moeserve::chatout {

MarkerMatch find_first(std::string_view text, const std::vector<std::string>& markers) {
  MarkerMatch best;
  for (const std::string& marker : markers) {
    const size_t pos = text.find(marker);
    if (pos == std::string_view::npos) continue;
    if (!best.found() || pos < best.pos || (pos == best.pos && marker.size() > best.length))
      best = {pos, marker.size()};
  }
  return best;
}

size_t partial_marker_length(std::string_view text, const std::vector<std::string>& markers) {
  size_t keep = 0;
  for (const std::string& marker : markers)
    for (size_t len = std::min(marker.size() - 1, text.size()); len > keep; --len)
      if (text.substr(text.size() - len) == std::string_view(marker).substr(0, len)) {
        keep = len;
        break;
      }
  return keep;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view trim(std::string_view text) {
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

bool is_blank(std::string_view text) { return std::all_of(text.begin(), text.end(), is_space); }

}  // namespace moeserve::chatout
