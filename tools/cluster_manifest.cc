// The manifest reader: libyaml's document API, then a walk over the node tree that checks
// every key against a table of known keys and types.
#include "tools/cluster_manifest.h"

#include <yaml.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace llm {
namespace {

enum class Type { kInt, kDouble, kBool, kString };

struct KeySpec {
  const char* key;
  Type type;
  std::vector<std::string> choices;  // for strings: the allowed values, when fixed
};

// llm-scheduler's flags a manifest may set under `engine:`.
const std::vector<KeySpec>& EngineKeys() {
  static const auto* keys = new std::vector<KeySpec>{
      {"served_model_name", Type::kString, {}},
      {"dtype", Type::kString, {"auto", "float32", "bfloat16", "float16"}},
      {"kv_cache_dtype", Type::kString, {"auto", "float32", "bfloat16", "float16"}},
      {"enforce_eager", Type::kBool, {}},
      {"block_size", Type::kInt, {}},
      {"max_num_seqs", Type::kInt, {}},
      {"max_num_batched_tokens", Type::kInt, {}},
      {"max_model_len", Type::kInt, {}},
      {"gpu_memory_utilization", Type::kDouble, {}},
      {"swap_space", Type::kDouble, {}},
      {"cpu_kv_cache_space", Type::kDouble, {}},
      {"num_gpu_blocks_override", Type::kInt, {}},
      {"watermark", Type::kDouble, {}},
      {"enable_prefix_caching", Type::kBool, {}},
      {"enable_chunked_prefill", Type::kBool, {}},
      {"long_prefill_token_threshold", Type::kInt, {}},
      {"preemption_mode", Type::kString, {"recompute", "swap"}},
      {"scheduling_policy", Type::kString, {"fcfs", "priority"}},
      {"max_concurrent_requests", Type::kInt, {}},
      {"max_logprobs", Type::kInt, {}},
      {"max_n", Type::kInt, {}},
      {"rendezvous_host", Type::kString, {}},
      {"rendezvous_port", Type::kInt, {}},
      {"async_scheduling", Type::kBool, {}},
      {"worker_timeout", Type::kDouble, {}},
      {"collective_timeout", Type::kDouble, {}},
      {"keepalive_time", Type::kDouble, {}},
      {"keepalive_timeout", Type::kDouble, {}},
      {"recovery_timeout", Type::kDouble, {}},
      {"ssl_certfile", Type::kString, {}},
      {"ssl_keyfile", Type::kString, {}},
      {"ssl_ca_certs", Type::kString, {}},
      {"max_request_bytes", Type::kInt, {}},
      {"max_prompt_bytes", Type::kInt, {}},
      {"max_stop_bytes", Type::kInt, {}},
      {"drain_timeout", Type::kDouble, {}},
      {"cluster_secret_file", Type::kString, {}},
      {"http_port", Type::kInt, {}},
      {"http_host", Type::kString, {}},
      {"reasoning_parser", Type::kString, {"none", "deepseek_r1", "qwen3"}},
      {"http_port_file", Type::kString, {}},
  };
  return *keys;
}

// llm-worker's flags a manifest may set under `worker:`.
const std::vector<KeySpec>& WorkerKeys() {
  static const auto* keys = new std::vector<KeySpec>{
      {"threads", Type::kInt, {}},
      {"coded_weights", Type::kBool, {}},      // kernels/cpu/coded_gemv.h
      {"quantized_weights", Type::kBool, {}},  // kernels/cpu/quantized_linear.h
      {"peer_host", Type::kString, {}},
      {"shm_collectives", Type::kBool, {}},
      {"shm_dir", Type::kString, {}},
      {"cluster_secret_file", Type::kString, {}},
  };
  return *keys;
}

// Flags llm-cluster derives from the top-level keys; setting them directly is an error.
const std::set<std::string>& ReservedKeys() {
  static const auto* keys = new std::set<std::string>{
      "model", "tensor_parallel_size", "device", "host", "port", "port_file", "worker_addresses"};
  return *keys;
}

const char* TypeName(Type t) {
  switch (t) {
    case Type::kInt:
      return "an integer";
    case Type::kDouble:
      return "a number";
    case Type::kBool:
      return "true or false";
    case Type::kString:
      return "a string";
  }
  return "?";
}

std::string Dashes(const std::string& key) { return absl::StrReplaceAll(key, {{"_", "-"}}); }

// Walks one parsed document. Every error names file:line and the key's path.
class Reader {
 public:
  Reader(yaml_document_t* doc, std::string file) : doc_(doc), file_(std::move(file)) {}

  absl::StatusOr<ClusterManifest> Read() {
    yaml_node_t* root = yaml_document_get_root_node(doc_);
    if (root == nullptr) return Error(1, "", "the manifest is empty");
    if (root->type != YAML_MAPPING_NODE) return Error(Line(root), "", "expected a mapping");
    ClusterManifest m;
    bool have_model = false;
    std::set<std::string> seen;
    for (yaml_node_pair_t* p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
         ++p) {
      yaml_node_t* k = Node(p->key);
      yaml_node_t* v = Node(p->value);
      absl::StatusOr<std::string> key = Key(k, "");
      if (!key.ok()) return key.status();
      if (!seen.insert(*key).second) return Error(Line(k), *key, "duplicate key");
      absl::Status s;
      if (*key == "model") {
        s = String(v, *key, &m.model);
        have_model = true;
      } else if (*key == "tensor_parallel_size") {
        s = Int(v, *key, 1, 1024, &m.tensor_parallel_size);
      } else if (*key == "device") {
        s = String(v, *key, &m.device);
        if (s.ok() && m.device != "cpu" && m.device != "cuda") {
          s = Error(Line(v), *key, "expected cpu or cuda, got \"" + m.device + "\"");
        }
      } else if (*key == "restart_workers") {
        s = Bool(v, *key, &m.restart_workers);
      } else if (*key == "restart_scheduler") {
        s = Bool(v, *key, &m.restart_scheduler);
      } else if (*key == "restart_delay_s") {
        s = Double(v, *key, &m.restart_delay_s);
      } else if (*key == "startup_timeout_s") {
        s = Double(v, *key, &m.startup_timeout_s);
      } else if (*key == "scheduler") {
        s = Endpoint(
            v, *key, "port", &m.scheduler_host, &m.scheduler_port,
            {{"tls_ca", &m.scheduler_tls_ca}, {"tls_server_name", &m.scheduler_tls_server_name}});
      } else if (*key == "workers") {
        s = Endpoint(v, *key, "base_port", &m.workers_host, &m.workers_base_port);
      } else if (*key == "engine") {
        s = Options(v, *key, EngineKeys(), &m.engine);
      } else if (*key == "worker") {
        s = Options(v, *key, WorkerKeys(), &m.worker);
      } else {
        s = Error(Line(k), *key,
                  "unknown key (expected model, tensor_parallel_size, device, scheduler, "
                  "workers, restart_workers, restart_scheduler, restart_delay_s, "
                  "startup_timeout_s, engine, "
                  "worker)");
      }
      if (!s.ok()) return s;
    }
    if (!have_model || m.model.empty()) return Error(Line(root), "model", "is required");
    if (m.workers_base_port != 0 && m.workers_base_port + m.tensor_parallel_size - 1 > 65535) {
      return Error(Line(root), "workers.base_port", "base_port + tensor_parallel_size > 65536");
    }
    return m;
  }

 private:
  yaml_node_t* Node(int id) { return yaml_document_get_node(doc_, id); }
  static int Line(const yaml_node_t* n) { return static_cast<int>(n->start_mark.line) + 1; }

  absl::Status Error(int line, const std::string& key, const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ":", line, ": ", key.empty() ? "" : key + ": ", what));
  }

  absl::StatusOr<std::string> Key(yaml_node_t* k, const std::string& parent) {
    if (k->type != YAML_SCALAR_NODE) return Error(Line(k), parent, "keys must be plain words");
    return std::string(reinterpret_cast<const char*>(k->data.scalar.value), k->data.scalar.length);
  }

  // A scalar's text; numbers and booleans must be unquoted.
  absl::StatusOr<std::string> Scalar(yaml_node_t* v, const std::string& key, Type type) {
    if (v->type != YAML_SCALAR_NODE) {
      return Error(Line(v), key,
                   absl::StrCat("expected ", TypeName(type), ", got a ",
                                v->type == YAML_MAPPING_NODE ? "mapping" : "list"));
    }
    std::string text(reinterpret_cast<const char*>(v->data.scalar.value), v->data.scalar.length);
    if (type != Type::kString && v->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) {
      return Error(Line(v), key,
                   absl::StrCat("expected ", TypeName(type), ", got the string \"", text, "\""));
    }
    return text;
  }

  absl::Status String(yaml_node_t* v, const std::string& key, std::string* out) {
    absl::StatusOr<std::string> s = Scalar(v, key, Type::kString);
    if (!s.ok()) return s.status();
    *out = *s;
    return absl::OkStatus();
  }

  absl::Status Int(yaml_node_t* v, const std::string& key, int lo, int hi, int* out) {
    absl::StatusOr<std::string> s = Scalar(v, key, Type::kInt);
    if (!s.ok()) return s.status();
    if (!absl::SimpleAtoi(*s, out)) {
      return Error(Line(v), key, "expected an integer, got \"" + *s + "\"");
    }
    if (*out < lo || *out > hi) {
      return Error(Line(v), key, absl::StrCat("expected ", lo, "..", hi, ", got ", *out));
    }
    return absl::OkStatus();
  }

  absl::Status Double(yaml_node_t* v, const std::string& key, double* out) {
    absl::StatusOr<std::string> s = Scalar(v, key, Type::kDouble);
    if (!s.ok()) return s.status();
    if (!absl::SimpleAtod(*s, out) || !std::isfinite(*out) || *out < 0) {
      return Error(Line(v), key, "expected a number >= 0, got \"" + *s + "\"");
    }
    return absl::OkStatus();
  }

  absl::Status Bool(yaml_node_t* v, const std::string& key, bool* out) {
    absl::StatusOr<std::string> s = Scalar(v, key, Type::kBool);
    if (!s.ok()) return s.status();
    if (*s != "true" && *s != "false") {
      return Error(Line(v), key, "expected true or false, got \"" + *s + "\"");
    }
    *out = *s == "true";
    return absl::OkStatus();
  }

  // {host: H, <port_key>: N}
  absl::Status Endpoint(yaml_node_t* v, const std::string& name, const std::string& port_key,
                        std::string* host, int* port,
                        const std::map<std::string, std::string*>& extra = {}) {
    if (v->type != YAML_MAPPING_NODE) {
      return Error(Line(v), name, "expected a mapping {host: ..., " + port_key + ": ...}");
    }
    std::set<std::string> seen;
    for (yaml_node_pair_t* p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; ++p) {
      yaml_node_t* k = Node(p->key);
      absl::StatusOr<std::string> key = Key(k, name);
      if (!key.ok()) return key.status();
      const std::string path = name + "." + *key;
      if (!seen.insert(*key).second) return Error(Line(k), path, "duplicate key");
      absl::Status s;
      if (*key == "host") {
        s = String(Node(p->value), path, host);
      } else if (*key == port_key) {
        s = Int(Node(p->value), path, 0, 65535, port);
      } else if (auto e = extra.find(*key); e != extra.end()) {
        s = String(Node(p->value), path, e->second);
      } else {
        std::string expected = "host or " + port_key;
        for (const auto& [name, unused] : extra) expected += ", " + name;
        s = Error(Line(k), path, "unknown key (expected " + expected + ")");
      }
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // A mapping of flags checked against `specs`; values kept as text.
  absl::Status Options(yaml_node_t* v, const std::string& name, const std::vector<KeySpec>& specs,
                       std::vector<std::pair<std::string, std::string>>* out) {
    if (v->type == YAML_SCALAR_NODE && v->data.scalar.length == 0) return absl::OkStatus();
    if (v->type != YAML_MAPPING_NODE) return Error(Line(v), name, "expected a mapping");
    std::set<std::string> seen;
    for (yaml_node_pair_t* p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; ++p) {
      yaml_node_t* k = Node(p->key);
      yaml_node_t* val = Node(p->value);
      absl::StatusOr<std::string> key = Key(k, name);
      if (!key.ok()) return key.status();
      const std::string path = name + "." + *key;
      if (!seen.insert(*key).second) return Error(Line(k), path, "duplicate key");
      if (ReservedKeys().count(*key) > 0) {
        return Error(Line(k), path, "is set by llm-cluster from the manifest's top-level keys");
      }
      const KeySpec* spec = nullptr;
      for (const KeySpec& s : specs) {
        if (*key == s.key) spec = &s;
      }
      if (spec == nullptr) {
        std::string known;
        for (const KeySpec& s : specs) absl::StrAppend(&known, known.empty() ? "" : ", ", s.key);
        return Error(Line(k), path, "unknown key (known: " + known + ")");
      }
      absl::StatusOr<std::string> text = Scalar(val, path, spec->type);
      if (!text.ok()) return text.status();
      bool ok = true;
      switch (spec->type) {
        case Type::kInt: {
          int64_t i;
          ok = absl::SimpleAtoi(*text, &i);
          break;
        }
        case Type::kDouble: {
          double d;
          ok = absl::SimpleAtod(*text, &d);
          break;
        }
        case Type::kBool:
          ok = *text == "true" || *text == "false";
          break;
        case Type::kString:
          if (!spec->choices.empty()) {
            ok = false;
            for (const std::string& c : spec->choices) ok = ok || c == *text;
          }
          break;
      }
      if (!ok) {
        std::string expected = TypeName(spec->type);
        if (!spec->choices.empty()) {
          expected.clear();
          for (const std::string& c : spec->choices) {
            absl::StrAppend(&expected, expected.empty() ? "" : " or ", c);
          }
        }
        return Error(Line(val), path, "expected " + expected + ", got \"" + *text + "\"");
      }
      out->emplace_back(*key, *text);
    }
    return absl::OkStatus();
  }

  yaml_document_t* doc_;
  std::string file_;
};

std::vector<std::string> ToFlags(const std::vector<std::pair<std::string, std::string>>& kv) {
  std::vector<std::string> flags;
  for (const auto& [k, v] : kv) flags.push_back("--" + Dashes(k) + "=" + v);
  return flags;
}

}  // namespace

std::vector<std::string> ClusterManifest::SchedulerFlags() const { return ToFlags(engine); }
std::vector<std::string> ClusterManifest::WorkerFlags() const { return ToFlags(worker); }

std::string ClusterManifest::EngineOption(const std::string& key) const {
  for (const auto& [k, v] : engine) {
    if (k == key) return v;
  }
  return "";
}

absl::StatusOr<ClusterManifest> ParseClusterManifest(std::string_view yaml,
                                                     const std::string& file_name) {
  yaml_parser_t parser;
  if (!yaml_parser_initialize(&parser)) return absl::InternalError("yaml_parser_initialize");
  yaml_parser_set_input_string(&parser, reinterpret_cast<const unsigned char*>(yaml.data()),
                               yaml.size());
  yaml_document_t doc;
  auto invalid_yaml = [&] {
    const std::string msg = absl::StrCat(
        file_name, ":", parser.problem_mark.line + 1,
        ": invalid YAML: ", parser.problem != nullptr ? parser.problem : "unknown error",
        parser.context != nullptr ? std::string(" ") + parser.context : "");
    yaml_parser_delete(&parser);
    return absl::InvalidArgumentError(msg);
  };
  if (!yaml_parser_load(&parser, &doc)) return invalid_yaml();
  absl::StatusOr<ClusterManifest> m = Reader(&doc, file_name).Read();
  yaml_document_delete(&doc);
  // One document only: a second one is most likely a mistake.
  if (m.ok()) {
    yaml_document_t next;
    if (!yaml_parser_load(&parser, &next)) return invalid_yaml();
    const bool more = yaml_document_get_root_node(&next) != nullptr;
    yaml_document_delete(&next);
    if (more) m = absl::InvalidArgumentError(file_name + ": expected one YAML document");
  }
  yaml_parser_delete(&parser);
  return m;
}

absl::StatusOr<ClusterManifest> LoadClusterManifest(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("cannot read the manifest " + path);
  std::stringstream text;
  text << in.rdbuf();
  return ParseClusterManifest(text.str(), path);
}

}  // namespace llm
