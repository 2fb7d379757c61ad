// The OpenAI-compatible HTTP API end to end: a local cluster (fortune-llama) with
// --http-port=0 and --api-key, driven by the official `openai` Python client
// (openai_client_check.py, run with LLM_TEST_PYTHON from `make pyenv`): streaming completion
// with include_usage, logprobs, n=2, stop strings, greedy output equal to the gRPC API's,
// errors (400, 404 model_not_found, 401), logit_bias moving greedy's tokens, fields not
// implemented (response_format json_schema, tools, tool messages, image parts) refused with
// 400 naming them, a client that disconnects mid-stream, /metrics parsed by prometheus_client,
// and the chat endpoint.
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/port_file.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_harness.h"
#include "tests/testing/test_data.h"

namespace llm::testing {
namespace {

namespace fs = std::filesystem;

constexpr char kApiKey[] = "test-key-1234";
// "unimplemented" until GenerateRequest.chat is served (the chat-template work); then
// "served", which checks streaming chat with include_usage against the non-streamed answer.
constexpr char kChatMode[] = "served";

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs `command`; its exit status, printing its output.
int RunCommand(const std::string& command) {
  FILE* f = popen((command + " 2>&1").c_str(), "r");
  if (f == nullptr) return -1;
  char buf[4096];
  std::string out;
  while (fgets(buf, sizeof(buf), f) != nullptr) out += buf;
  const int status = pclose(f);
  std::printf("%s", out.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(OpenAIApiTest, OfficialClientAgainstLocalCluster) {
  if (!fs::exists(LLM_TEST_PYTHON)) {
    GTEST_SKIP() << LLM_TEST_PYTHON << " does not exist: run `make pyenv` (the openai and "
                 << "prometheus_client packages) to run this test";
  }
  char tmpl[] = "/tmp/openai-api-test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string http_port_file = dir + "/http.port";

  ClusterOptions options;
  options.model = std::string(LLM_SOURCE_DIR) + "/models/fortune-llama";
  options.engine = {{"max_model_len", "512"},
                    {"enable_prefix_caching", "true"},
                    {"http_port", "0"},
                    {"http_port_file", http_port_file},
                    {"reasoning_parser", "qwen3"}};
  options.api_key = kApiKey;
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // The scheduler binds the HTTP port before it reports SERVING.
  const std::optional<int> http_port = ReadPortFile(http_port_file);
  ASSERT_TRUE(http_port.has_value()) << http_port_file;

  // The greedy reference over gRPC: the HTTP API must answer the same text.
  const std::string prompt = "Once upon a time";
  const int max_tokens = 16;
  const GenerateResult ref = Generate((*cluster)->stub(), GreedyRequest(prompt, max_tokens));
  ASSERT_TRUE(ref.status.ok()) << ref.status.error_message();
  ASSERT_EQ(ref.token_ids.at(0).size(), max_tokens);
  const std::string ref_file = dir + "/reference.json";
  std::ofstream(ref_file) << nlohmann::json{
      {"prompt", prompt},
      {"max_tokens", max_tokens},
      {"text", ref.text.at(0)},
      {"token_ids",
       ref.token_ids.at(0)}}.dump();

  const std::string script = std::string(LLM_SOURCE_DIR) +
                             "/tests/integration/"
                             "openai_client_check.py";
  const int failed = RunCommand(absl::StrCat(
      ShellQuote(LLM_TEST_PYTHON), " ", ShellQuote(script),
      " --base-url=http://127.0.0.1:", *http_port, "/v1 --api-key=", kApiKey,
      " --model=fortune-llama --reference=", ShellQuote(ref_file), " --chat=", kChatMode));
  EXPECT_EQ(failed, 0) << "openai_client_check.py: failed checks (output above)";

  // Whatever the HTTP clients did (one went away mid-stream), nothing is left running and
  // every block is free, as the gRPC API sees it.
  absl::StatusOr<v1::GetStatsResponse> stats =
      WaitUntilAllBlocksFree((*cluster)->stub(), absl::Seconds(60));
  ASSERT_TRUE(stats.ok()) << stats.status();
  absl::StatusOr<v1::GetModelInfoResponse> info = GetModelInfo((*cluster)->stub());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(stats->num_running(), 0u);
  EXPECT_EQ(stats->num_free_gpu_blocks(), info->num_gpu_blocks());

  absl::StatusOr<int> stopped = (*cluster)->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped.status();
  fs::remove_all(dir);
}

// --ssl-certfile / --ssl-keyfile: the same API over HTTPS, the client trusting only the
// server's self-signed certificate (made with the openssl tool for the test).
TEST(OpenAIApiTest, ServesHttpsWithTheGivenCertificate) {
  if (!fs::exists(LLM_TEST_PYTHON)) {
    GTEST_SKIP() << LLM_TEST_PYTHON << " does not exist: run `make pyenv` to run this test";
  }
  char tmpl[] = "/tmp/openai-api-test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string cert = dir + "/cert.pem", key = dir + "/key.pem";
  if (RunCommand(absl::StrCat("openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "
                              "/CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 -keyout ",
                              ShellQuote(key), " -out ", ShellQuote(cert))) != 0) {
    fs::remove_all(dir);
    GTEST_SKIP() << "the openssl tool cannot make a certificate here (output above)";
  }
  const std::string http_port_file = dir + "/http.port";
  ClusterOptions options;
  options.model = std::string(LLM_SOURCE_DIR) + "/models/fortune-llama";
  options.engine = {{"max_model_len", "512"},
                    {"http_port", "0"},
                    {"http_port_file", http_port_file},
                    {"ssl_certfile", cert},
                    {"ssl_keyfile", key}};
  options.api_key = kApiKey;
  options.tls_ca = cert;
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::optional<int> http_port = ReadPortFile(http_port_file);
  ASSERT_TRUE(http_port.has_value()) << http_port_file;

  const std::string prompt = "Once upon a time";
  const GenerateResult ref = Generate((*cluster)->stub(), GreedyRequest(prompt, 16));
  ASSERT_TRUE(ref.status.ok()) << ref.status.error_message();
  const std::string ref_file = dir + "/reference.json";
  std::ofstream(ref_file) << nlohmann::json{
      {"prompt", prompt},
      {"max_tokens", 16},
      {"text", ref.text.at(0)},
      {"token_ids",
       ref.token_ids.at(0)}}.dump();
  const std::string script =
      std::string(LLM_SOURCE_DIR) + "/tests/integration/openai_client_check.py";
  EXPECT_EQ(RunCommand(absl::StrCat(
                ShellQuote(LLM_TEST_PYTHON), " ", ShellQuote(script),
                " --base-url=https://127.0.0.1:", *http_port, "/v1 --api-key=", kApiKey,
                " --model=fortune-llama --reference=", ShellQuote(ref_file),
                " --cafile=", ShellQuote(cert),
                " --checks=check_models_and_health,check_greedy_equals_grpc,check_stream_usage,"
                "check_errors")),
            0)
      << "openai_client_check.py over HTTPS: failed checks (output above)";
  absl::StatusOr<int> stopped = (*cluster)->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped.status();
  fs::remove_all(dir);
}

// Structured outputs from a real model: SmolLM2 (fetched by `make test`) served on the CPU,
// asked through the official client's `parse` with Pydantic models; every finished output
// validates against its schema (tests/integration/structured_outputs_check.py).
TEST(OpenAIApiTest, StructuredOutputsFromARealModel) {
  if (!fs::exists(LLM_TEST_PYTHON)) {
    GTEST_SKIP() << LLM_TEST_PYTHON << " does not exist: run `make pyenv` to run this test";
  }
  const std::string model = CachedModelPath("SmolLM2-135M-Instruct.Q4_1.gguf");
  if (!fs::exists(model)) {
    GTEST_SKIP() << model << " is not there (tools/models/fetch_smollm2.sh fetches it)";
  }
  char tmpl[] = "/tmp/openai-api-test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string http_port_file = dir + "/http.port";
  ClusterOptions options;
  options.model = model;
  options.engine = {
      {"max_model_len", "1024"}, {"http_port", "0"}, {"http_port_file", http_port_file}};
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::optional<int> http_port = ReadPortFile(http_port_file);
  ASSERT_TRUE(http_port.has_value()) << http_port_file;
  const std::string script =
      std::string(LLM_SOURCE_DIR) + "/tests/integration/structured_outputs_check.py";
  const int failed = RunCommand(absl::StrCat(ShellQuote(LLM_TEST_PYTHON), " ", ShellQuote(script),
                                             " --base-url=http://127.0.0.1:", *http_port,
                                             "/v1 --model=SmolLM2-135M-Instruct.Q4_1"));
  EXPECT_EQ(failed, 0) << "structured_outputs_check.py: failures (output above)";
  absl::StatusOr<int> stopped = (*cluster)->Stop();
  EXPECT_TRUE(stopped.ok()) << stopped.status();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace llm::testing
