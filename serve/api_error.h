// Errors of the OpenAI-compatible API: an HTTP status and OpenAI's error JSON
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// Every rejected request gets one; the message names the parameter at fault.
#pragma once

#include <stdexcept>
#include <string>

namespace moeserve::serve {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string code = "");
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  // "invalid_request_error", "authentication_error", "permission_error", "not_found_error", "rate_limit_error",
  // "server_error", "service_unavailable" by status.
  std::string type() const;
  std::string json() const;

 private:
  int status_;
  std::string param_;
  std::string code_;
};

// The error JSON for a status and message (no param or code).
std::string api_error_json(int status, const std::string& message);

}  // namespace moeserve::serve
