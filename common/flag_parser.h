// Command-line flags of the binaries (llm-scheduler, llm-worker, the tools and llm-loadgen),
// spelled as vLLM's (--max-num-seqs=256): each flag is bound to a variable with its help text;
// Parse() fills them from argv, prints the usage for --help, and fails with a message naming the
// flag for anything unknown or malformed. Used from main(), on one thread.
#ifndef LLM_COMMON_FLAG_PARSER_H_
#define LLM_COMMON_FLAG_PARSER_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/strings/numbers.h"

namespace llm {

class FlagParser {
 public:
  explicit FlagParser(std::string usage) : usage_(std::move(usage)) {}

  template <typename T>
  void Add(std::string name, T* value, std::string help) {
    flags_.push_back({std::move(name), value, std::move(help)});
  }

  // Exits with status 0 after --help, 2 after an error.
  void Parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        std::fputs(Usage().c_str(), stdout);
        std::exit(0);
      }
      if (arg.substr(0, 2) != "--") Fail("expected --flag=value, got " + std::string(arg));
      const size_t eq = arg.find('=');
      const std::string name(arg.substr(2, eq == std::string_view::npos ? eq : eq - 2));
      Flag* flag = Find(name);
      if (flag == nullptr) Fail("unknown flag --" + name);
      // A bool flag may stand alone (--enable-prefix-caching); others need a value.
      const bool is_bool = std::holds_alternative<bool*>(flag->value);
      if (eq == std::string_view::npos && !is_bool) Fail("--" + name + " needs =value");
      const std::string value(eq == std::string_view::npos ? "true" : arg.substr(eq + 1));
      if (!Set(*flag, value)) Fail("--" + name + ": cannot parse \"" + value + "\"");
    }
  }

  std::string Usage() const {
    std::string out = usage_ + "\n";
    for (const Flag& f : flags_) out += "  --" + f.name + "\n      " + f.help + "\n";
    return out;
  }

 private:
  using Value = std::variant<int*, int64_t*, double*, bool*, std::string*>;
  struct Flag {
    std::string name;
    Value value;
    std::string help;
  };

  Flag* Find(const std::string& name) {
    for (Flag& f : flags_) {
      if (f.name == name) return &f;
    }
    return nullptr;
  }

  static bool Set(Flag& f, const std::string& v) {
    if (auto* p = std::get_if<int*>(&f.value)) return absl::SimpleAtoi(v, *p);
    if (auto* p = std::get_if<int64_t*>(&f.value)) return absl::SimpleAtoi(v, *p);
    if (auto* p = std::get_if<double*>(&f.value)) return absl::SimpleAtod(v, *p);
    if (auto* p = std::get_if<bool*>(&f.value)) return absl::SimpleAtob(v, *p);
    *std::get<std::string*>(f.value) = v;
    return true;
  }

  [[noreturn]] void Fail(const std::string& msg) const {
    std::fprintf(stderr, "error: %s\n\n%s", msg.c_str(), Usage().c_str());
    std::exit(2);
  }

  std::string usage_;
  std::vector<Flag> flags_;
};

}  // namespace llm

#endif  // LLM_COMMON_FLAG_PARSER_H_
