// Finding a format's markers in streamed text: a marker may arrive split over pieces, so the
// end of what has arrived that could still be the start of a marker is held back.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::chatout {

struct MarkerMatch {
  size_t pos = std::string_view::npos;  // npos: none of the markers is in the text
  size_t length = 0;                    // the length of the marker found
  bool found() const { return pos != std::string_view::npos; }
};

// The earliest occurrence of any of `markers` in `text` (the longest marker at that position).
MarkerMatch find_first(std::string_view text, const std::vector<std::string>& markers);

// The length of the longest suffix of `text` that is a proper prefix of one of `markers`: the
// part that must wait for more text before it can be released.
size_t partial_marker_length(std::string_view text, const std::vector<std::string>& markers);

bool is_space(char c);
std::string_view trim(std::string_view text);
// Text with only spaces, tabs and line breaks (or nothing).
bool is_blank(std::string_view text);

}  // namespace moeserve::chatout
