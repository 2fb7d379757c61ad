#include "common/port_file.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"

namespace llm {

absl::Status WritePortFile(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << port << "\n";
    if (!out.flush()) return absl::InternalError("cannot write " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError("cannot rename " + tmp + " to " + path + ": " + ec.message());
  return absl::OkStatus();
}

std::optional<int> ReadPortFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  int port = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &port) || port <= 0) {
    return std::nullopt;
  }
  return port;
}

}  // namespace llm
