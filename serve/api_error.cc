#include "serve/api_error.h"

#include <nlohmann/json.hpp>

namespace moeserve::serve {

ApiError::ApiError(int status, std::string message, std::string param, std::string code)
    : std::runtime_error(std::move(message)), status_(status), param_(std::move(param)), code_(std::move(code)) {}

std::string ApiError::type() const {
  switch (status_) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable";
    default:
      return status_ >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string ApiError::json() const {
  nlohmann::json error = {{"message", what()}, {"type", type()}, {"param", nullptr}, {"code", nullptr}};
  if (!param_.empty()) error["param"] = param_;
  if (!code_.empty()) error["code"] = code_;
  // The message may quote the client's bytes (a JSON syntax error shows what it last read), which
  // need not be UTF-8: those become U+FFFD rather than a dump() that throws (and a 500).
  return nlohmann::json{{"error", error}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string api_error_json(int status, const std::string& message) { return ApiError(status, message).json(); }

}  // namespace moeserve::serve
