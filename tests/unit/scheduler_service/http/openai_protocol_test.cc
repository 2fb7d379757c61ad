#include "scheduler_service/http/openai_protocol.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace llm::openai {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

TEST(OpenAIProtocolTest, CompletionRequestMapsEveryField) {
  const ParseResult p = ParseCompletionRequest(R"({
      "model": "m", "prompt": "hello", "max_tokens": 7, "n": 2, "temperature": 0.5,
      "top_p": 0.9, "top_k": 5, "min_p": 0.1, "seed": 42, "stop": ["a", "bc"],
      "stop_token_ids": [3, 4], "logprobs": 3, "presence_penalty": 0.5,
      "frequency_penalty": -0.5, "repetition_penalty": 1.2, "ignore_eos": true,
      "min_tokens": 2, "stream": true, "stream_options": {"include_usage": true},
      "user": "ignored", "some_unknown_field": {"x": 1}, "suffix": null})");
  ASSERT_TRUE(p.ok()) << p.error.message;
  const OpenAIRequest& r = p.request;
  EXPECT_EQ(r.endpoint, Endpoint::kCompletions);
  EXPECT_EQ(r.model, "m");
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.request.text(), "hello");
  EXPECT_TRUE(r.request.stream());
  EXPECT_TRUE(r.request.add_special_tokens());
  const v1::SamplingParams& sp = r.request.sampling_params();
  EXPECT_EQ(sp.max_tokens(), 7u);
  EXPECT_EQ(sp.n(), 2u);
  EXPECT_FLOAT_EQ(sp.temperature(), 0.5f);
  EXPECT_FLOAT_EQ(sp.top_p(), 0.9f);
  EXPECT_EQ(sp.top_k(), 5);
  EXPECT_FLOAT_EQ(sp.min_p(), 0.1f);
  EXPECT_EQ(sp.seed(), 42u);
  EXPECT_THAT(sp.stop(), ::testing::ElementsAre("a", "bc"));
  EXPECT_THAT(sp.stop_token_ids(), ::testing::ElementsAre(3, 4));
  EXPECT_EQ(sp.logprobs(), 3u);
  EXPECT_FLOAT_EQ(sp.presence_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(sp.frequency_penalty(), -0.5f);
  EXPECT_FLOAT_EQ(sp.repetition_penalty(), 1.2f);
  EXPECT_TRUE(sp.ignore_eos());
  EXPECT_EQ(sp.min_tokens(), 2u);
}

TEST(OpenAIProtocolTest, UnsetFieldsStayUnsetForTheServiceDefaults) {
  const ParseResult p = ParseCompletionRequest(R"({"prompt": "x", "temperature": null})");
  ASSERT_TRUE(p.ok()) << p.error.message;
  const v1::SamplingParams& sp = p.request.request.sampling_params();
  EXPECT_FALSE(sp.has_temperature());
  EXPECT_FALSE(sp.has_logprobs());
  EXPECT_FALSE(sp.has_n());
  EXPECT_FALSE(p.request.logprobs);
  EXPECT_FALSE(p.request.request.stream());
  EXPECT_EQ(p.request.model, "");
  // max_tokens: completions default to 16 (OpenAI's and vLLM's default); chat leaves it unset,
  // which fills the context.
  EXPECT_EQ(sp.max_tokens(), 16u);
  for (const char* body : {R"({"prompt": "x", "max_tokens": null})", R"({"prompt": "x"})"}) {
    const ParseResult q = ParseCompletionRequest(body);
    ASSERT_TRUE(q.ok()) << q.error.message;
    EXPECT_EQ(q.request.request.sampling_params().max_tokens(), 16u) << body;
  }
  const ParseResult chat =
      ParseChatCompletionRequest(R"({"messages": [{"role": "user", "content": "x"}]})");
  ASSERT_TRUE(chat.ok()) << chat.error.message;
  EXPECT_FALSE(chat.request.request.sampling_params().has_max_tokens());
}

TEST(OpenAIProtocolTest, CompletionPromptForms) {
  ParseResult p = ParseCompletionRequest(R"({"prompt": [1, 2, 3], "top_k": 0, "n": 2.0})");
  ASSERT_TRUE(p.ok()) << p.error.message;
  EXPECT_THAT(p.request.request.token_ids().ids(), ::testing::ElementsAre(1, 2, 3));
  EXPECT_EQ(p.request.request.sampling_params().top_k(), -1);  // 0: off, as vLLM
  EXPECT_EQ(p.request.request.sampling_params().n(), 2u);      // 2.0 is an integer
  p = ParseCompletionRequest(R"({"prompt": ["only one"], "stop": "s"})");
  ASSERT_TRUE(p.ok()) << p.error.message;
  EXPECT_EQ(p.request.request.text(), "only one");
  EXPECT_THAT(p.request.request.sampling_params().stop(), ::testing::ElementsAre("s"));
  p = ParseCompletionRequest(R"({"prompt": [[5, 6]]})");
  ASSERT_TRUE(p.ok()) << p.error.message;
  EXPECT_THAT(p.request.request.token_ids().ids(), ::testing::ElementsAre(5, 6));
}

struct BadCase {
  std::string body;
  std::string param;
  std::string message_part;
};

TEST(OpenAIProtocolTest, BadCompletionRequestsName400AndTheField) {
  for (const BadCase& c : {
           BadCase{R"({"prompt": "x", "max_tokens": "a"})", "max_tokens", "got a string"},
           BadCase{R"({"prompt": "x", "max_tokens": -1})", "max_tokens", "got -1"},
           // Beyond the proto's uint32: refused, never truncated to a small number.
           BadCase{R"({"prompt": "x", "max_tokens": 4294967301})", "max_tokens",
                   "in [0, 4294967295], got 4294967301"},
           BadCase{R"({"prompt": "x", "top_k": 1e12})", "top_k", "got 1000000000000.0"},
           BadCase{R"({"prompt": "x", "seed": 1e300})", "seed", "got 1e+300"},
           BadCase{R"({"prompt": "x", "n": 1.5})", "n", "got number 1.5"},
           BadCase{R"({"prompt": "x", "temperature": "hot"})", "temperature", "a number"},
           BadCase{R"({"prompt": "x", "stop": [1]})", "stop", "element 0 is number 1"},
           BadCase{R"({"prompt": "x", "stop": 3})", "stop", "a string or a list of strings"},
           BadCase{R"({"prompt": "x", "ignore_eos": 1})", "ignore_eos", "a boolean"},
           BadCase{R"({"prompt": "x", "logprobs": true})", "logprobs", "got boolean true"},
           BadCase{R"({"prompt": "x", "model": 3})", "model", "a string"},
           BadCase{R"({"prompt": ["a", "b"]})", "prompt", "a batch of 2 prompts"},
           BadCase{R"({"prompt": [1, "b"]})", "prompt", "element 1 is a string"},
           BadCase{R"({"prompt": {}})", "prompt", "got an object"},
           BadCase{R"({"max_tokens": 3})", "prompt", "'prompt' is required"},
           BadCase{R"({"prompt": "x", "stream_options": {"include_usage": true}})",
                   "stream_options", "only allowed when 'stream' is true"},
           BadCase{R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": 1}})",
                   "stream_options.include_usage", "a boolean"},
           BadCase{R"({"prompt": "x", "echo": true})", "echo", "not supported"},
       }) {
    const ParseResult p = ParseCompletionRequest(c.body);
    ASSERT_FALSE(p.ok()) << c.body;
    EXPECT_EQ(p.error.http_status, 400) << c.body;
    EXPECT_EQ(p.error.type, "invalid_request_error");
    EXPECT_EQ(p.error.param, c.param) << c.body;
    EXPECT_THAT(p.error.message, HasSubstr(c.message_part)) << c.body;
  }
}

TEST(OpenAIProtocolTest, BodyThatIsNotAJsonObjectIs400) {
  for (const char* body : {"", "{", "[1, 2]", "\"text\""}) {
    const ParseResult p = ParseChatCompletionRequest(body);
    ASSERT_FALSE(p.ok()) << body;
    EXPECT_EQ(p.error.http_status, 400);
    EXPECT_THAT(p.error.message, HasSubstr("request body"));
  }
}

TEST(OpenAIProtocolTest, ChatRequestMapsMessagesAndLogprobs) {
  const ParseResult p = ParseChatCompletionRequest(R"({
      "model": "m", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": null}],
      "max_tokens": 3, "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 4})");
  ASSERT_TRUE(p.ok()) << p.error.message;
  const v1::GenerateRequest& g = p.request.request;
  ASSERT_EQ(g.prompt_case(), v1::GenerateRequest::kChat);
  ASSERT_EQ(g.chat().messages_size(), 3);
  EXPECT_EQ(g.chat().messages(0).role(), "system");
  EXPECT_EQ(g.chat().messages(0).content(), "be brief");
  EXPECT_EQ(g.chat().messages(1).content(), "ab");
  EXPECT_EQ(g.chat().messages(2).content(), "");
  EXPECT_FALSE(g.chat().has_add_generation_prompt());
  EXPECT_FALSE(g.add_special_tokens());             // the template writes the special tokens
  EXPECT_EQ(g.sampling_params().max_tokens(), 9u);  // max_completion_tokens wins
  EXPECT_EQ(g.sampling_params().logprobs(), 4u);
  EXPECT_TRUE(p.request.logprobs);
}

TEST(OpenAIProtocolTest, BadChatRequests) {
  for (const BadCase& c : {
           BadCase{R"({"messages": []})", "messages", "non-empty list"},
           BadCase{R"({})", "messages", "'messages' is required"},
           BadCase{R"({"messages": ["hi"]})", "messages[0]", "an object"},
           BadCase{R"({"messages": [{"content": "x"}]})", "messages[0].role", "got null"},
           BadCase{R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content",
                   "a string or a list of content parts"},
           BadCase{R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
                   "messages[0].content[0]", "not supported"},
           BadCase{R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})",
                   "top_logprobs", "requires 'logprobs'"},
           BadCase{R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 2})", "logprobs",
                   "a boolean"},
       }) {
    const ParseResult p = ParseChatCompletionRequest(c.body);
    ASSERT_FALSE(p.ok()) << c.body;
    EXPECT_EQ(p.error.http_status, 400) << c.body;
    EXPECT_EQ(p.error.param, c.param) << c.body;
    EXPECT_THAT(p.error.message, HasSubstr(c.message_part)) << c.body;
  }
}

TEST(OpenAIProtocolTest, LogitBiasMapsTokenIdsToBiases) {
  for (const char* body : {R"({"prompt": "x", "logit_bias": {"5": 100, "17": -100, "0": 0.5}})",
                           R"({"messages": [{"role": "user", "content": "x"}],
                               "logit_bias": {"5": 100, "17": -100, "0": 0.5}})"}) {
    const bool chat = std::string(body).find("messages") != std::string::npos;
    const ParseResult p = chat ? ParseChatCompletionRequest(body) : ParseCompletionRequest(body);
    ASSERT_TRUE(p.ok()) << p.error.message;
    const auto& lb = p.request.request.sampling_params().logit_bias();
    ASSERT_EQ(lb.size(), 3u);
    EXPECT_FLOAT_EQ(lb.at(5), 100.0f);
    EXPECT_FLOAT_EQ(lb.at(17), -100.0f);
    EXPECT_FLOAT_EQ(lb.at(0), 0.5f);
  }
  // Absent, null or empty: no biases.
  for (const char* body : {R"({"prompt": "x"})", R"({"prompt": "x", "logit_bias": null})",
                           R"({"prompt": "x", "logit_bias": {}})"}) {
    const ParseResult p = ParseCompletionRequest(body);
    ASSERT_TRUE(p.ok()) << p.error.message;
    EXPECT_TRUE(p.request.request.sampling_params().logit_bias().empty()) << body;
  }
  for (const BadCase& c : {
           BadCase{R"({"prompt": "x", "logit_bias": [1, 2]})", "logit_bias",
                   "'logit_bias' must be an object mapping token ids to biases, got an array"},
           BadCase{R"({"prompt": "x", "logit_bias": {"abc": 1}})", "logit_bias",
                   "keys must be token ids (non-negative integers as strings), got \"abc\""},
           BadCase{R"({"prompt": "x", "logit_bias": {"-3": 1}})", "logit_bias", "got \"-3\""},
           BadCase{R"({"prompt": "x", "logit_bias": {"99999999999": 1}})", "logit_bias",
                   "got \"99999999999\""},
           BadCase{R"({"prompt": "x", "logit_bias": {"5": "up"}})", "logit_bias",
                   "'logit_bias[\"5\"]' must be a number, got a string"},
           BadCase{R"({"prompt": "x", "logit_bias": {"5": 100.5}})", "logit_bias",
                   "'logit_bias[\"5\"]' is 100.5; biases must be in [-100, 100]"},
           BadCase{R"({"prompt": "x", "logit_bias": {"5": -1000}})", "logit_bias",
                   "is -1000; biases must be in [-100, 100]"},
           BadCase{R"({"prompt": "x", "logit_bias": {"5": 1, "05": 2}})", "logit_bias",
                   "lists token id 5 twice"},
       }) {
    const ParseResult p = ParseCompletionRequest(c.body);
    ASSERT_FALSE(p.ok()) << c.body;
    EXPECT_EQ(p.error.http_status, 400) << c.body;
    EXPECT_EQ(p.error.param, c.param) << c.body;
    EXPECT_THAT(p.error.message, HasSubstr(c.message_part)) << c.body;
  }
}

// Fields whose meaning is known but not implemented are refused naming them, on both
// endpoints, unless their value asks for nothing; unknown fields stay ignored.
TEST(OpenAIProtocolTest, UnimplementedFieldsAre400NamingThem) {
  const std::string chat_prefix = R"({"messages": [{"role": "user", "content": "x"}], )";
  const std::string completion_prefix = R"({"prompt": "x", )";
  struct Case {
    std::string rest;     // the body after the prompt, without the closing brace
    std::string param;    // empty: accepted
    std::string message;  // part of the message
    bool chat_only = false;
  };
  const Case cases[] = {
      {R"("response_format": {"type": "json_object"})", "", ""},
      {R"("response_format": {"type": "text"})", "", ""},
      {R"("tools": [])", "", ""},
      {R"("tool_choice": "none")", "", ""},
      {R"("functions": [{"name": "f"}])", "functions", "the deprecated functions API"},
      {R"("function_call": "auto")", "function_call", "the deprecated functions API"},
      {R"("function_call": "none")", "", ""},
      {R"("parallel_tool_calls": false)", "", ""},
      {R"("store": true)", "store", "'store' = true is not supported"},
      {R"("store": false)", "", ""},
      {R"("service_tier": "flex")", "service_tier", "not supported"},
      {R"("service_tier": "auto")", "", ""},
      {R"("modalities": ["text", "audio"])", "modalities", "the output is text only"},
      {R"("modalities": ["text"])", "", ""},
      {R"("audio": {"voice": "alloy", "format": "wav"})", "audio", "audio output"},
      {R"("prediction": {"type": "content", "content": "x"})", "prediction", "predicted outputs"},
      {R"("reasoning_effort": "low")", "reasoning_effort", "not supported"},
      {R"("web_search_options": {})", "web_search_options", "web search"},
      {R"("guided_whitespace_pattern": " ?")", "guided_whitespace_pattern", "not supported"},
      {R"("allowed_token_ids": [1, 2])", "allowed_token_ids", "not supported"},
      {R"("prompt_logprobs": 1)", "prompt_logprobs", "prompt logprobs"},
      {R"("use_beam_search": true)", "use_beam_search", "beam search"},
      {R"("use_beam_search": false)", "", ""},
      {R"("spaces_between_special_tokens": false)", "spaces_between_special_tokens",
       "not supported"},
      {R"("user": "u-1", "metadata": {"k": "v"}, "some_future_field": 3)", "", ""},
      {R"("echo": true)", "echo", "echoing the last message", /*chat_only=*/true},
      {R"("chat_template": "{{ x }}")", "chat_template", "the model's chat template",
       /*chat_only=*/true},
      {R"("continue_final_message": true)", "continue_final_message", "not supported",
       /*chat_only=*/true},
  };
  for (const Case& c : cases) {
    for (bool chat : {false, true}) {
      if (c.chat_only && !chat) continue;
      const std::string body = (chat ? chat_prefix : completion_prefix) + c.rest + "}";
      const ParseResult p = chat ? ParseChatCompletionRequest(body) : ParseCompletionRequest(body);
      if (c.param.empty()) {
        EXPECT_TRUE(p.ok()) << body << ": " << p.error.message;
        continue;
      }
      ASSERT_FALSE(p.ok()) << body;
      EXPECT_EQ(p.error.http_status, 400) << body;
      EXPECT_EQ(p.error.type, "invalid_request_error") << body;
      EXPECT_EQ(p.error.param, c.param) << body;
      EXPECT_THAT(p.error.message, HasSubstr(c.message)) << body;
    }
  }
}

// The three ways clients ask for a structured output reach the proto as one constraint.
TEST(OpenAIProtocolTest, StructuredOutputsFromResponseFormatStructuredOutputsAndGuidedFields) {
  const std::string chat_prefix = R"({"messages": [{"role": "user", "content": "x"}], )";
  struct Case {
    std::string rest;
    std::string expected;  // the StructuredOutput's text form
  };
  const Case cases[] = {
      {R"("response_format": {"type": "json_object"})", "json_object: true"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "a", "strict": true,
          "schema": {"type": "integer"}}})",
       R"(json_schema: "{\"type\":\"integer\"}")"},
      {R"("structured_outputs": {"json": {"type": "string"}, "disable_any_whitespace": false})",
       R"(json_schema: "{\"type\":\"string\"}" any_whitespace: true)"},
      {R"("structured_outputs": {"regex": "[0-9]+"})", R"(regex: "[0-9]+")"},
      {R"("structured_outputs": {"choice": ["yes", "no"]})",
       R"(choice { choices: "yes" choices: "no" })"},
      {R"("structured_outputs": {"grammar": "root ::= \"a\""})", R"(grammar: "root ::= \"a\"")"},
      {R"("guided_regex": "a|b", "guided_decoding_backend": "xgrammar")", R"(regex: "a|b")"},
      {R"("guided_json": "{\"type\": \"object\"}")", R"(json_schema: "{\"type\": \"object\"}")"},
      {R"("response_format": {"type": "text"})", ""},
      // The schema's keys keep the order the client wrote (properties are generated in it).
      {R"("structured_outputs": {"json": {"type": "object", "properties": {"z": {}, "a": {}}}})",
       R"(json_schema: "{\"type\":\"object\",\"properties\":{\"z\":{},\"a\":{}}}")"},
  };
  for (const Case& c : cases) {
    const std::string body = chat_prefix + c.rest + "}";
    const ParseResult p = ParseChatCompletionRequest(body);
    ASSERT_TRUE(p.ok()) << body << ": " << p.error.message;
    EXPECT_EQ(p.request.request.sampling_params().structured_output().ShortDebugString(),
              c.expected)
        << body;
  }
  const BadCase bad[] = {
      {R"("response_format": {"type": "json_schema"})", "response_format.json_schema",
       "needs 'json_schema' with a 'schema'"},
      {R"("response_format": {"type": "regex"})", "response_format.type",
       "'response_format' of type 'regex' is not supported"},
      {R"("response_format": "json")", "response_format", "an object with a string 'type'"},
      {R"("structured_outputs": {"regex": 3})", "structured_outputs.regex", "a string"},
      {R"("structured_outputs": {"choice": ["a", 1]})", "structured_outputs.choice",
       "a list of strings"},
      {R"("structured_outputs": {"whitespace_pattern": " "})",
       "structured_outputs.whitespace_pattern", "is not supported"},
      {R"("structured_outputs": {"regex": "a", "choice": ["a"]})", "structured_outputs.regex",
       "both constrain the output"},
      {R"("response_format": {"type": "json_object"}, "guided_regex": "a")", "guided_regex",
       "'response_format' and 'guided_regex' both constrain the output"},
  };
  for (const BadCase& c : bad) {
    const std::string body = chat_prefix + c.body + "}";
    const ParseResult p = ParseChatCompletionRequest(body);
    ASSERT_FALSE(p.ok()) << body;
    EXPECT_EQ(p.error.http_status, 400) << body;
    EXPECT_EQ(p.error.param, c.param) << body;
    EXPECT_THAT(p.error.message, HasSubstr(c.message_part)) << body;
  }
}

TEST(OpenAIProtocolTest, BadToolCallsLegacyFunctionsAndNonTextPartsAre400NamingThem) {
  for (const BadCase& c : {
           BadCase{R"({"messages": [{"role": "user", "content": "x"},
                       {"role": "function", "name": "f", "content": "42"}]})",
                   "messages[1].role", "is 'function'"},
           BadCase{R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant",
                       "content": null, "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"arguments": "{}"}}]}]})",
                   "messages[1].tool_calls[0].function.name",
                   "'messages[1].tool_calls[0].function.name' must be a non-empty string"},
           BadCase{R"({"messages": [{"role": "assistant", "content": null, "tool_calls":
                       [{"type": "function", "function": {"name": "f", "arguments": 5}}]}]})",
                   "messages[0].tool_calls[0].function.arguments", "a string of JSON"},
           BadCase{R"({"messages": [{"role": "tool", "content": "x", "tool_call_id": 7}]})",
                   "messages[0].tool_call_id", "must be a string"},
           BadCase{R"({"messages": [{"role": "assistant", "content": null,
                       "function_call": {"name": "f", "arguments": "{}"}}]})",
                   "messages[0].function_call", "the deprecated functions API"},
           BadCase{R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                       {"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]})",
                   "messages[0].content[1]",
                   "a content part of type 'image_url', which is not supported"},
           BadCase{R"({"messages": [{"role": "user", "content": [
                       {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]})",
                   "messages[0].content[0]", "of type 'input_audio'"},
       }) {
    const ParseResult p = ParseChatCompletionRequest(c.body);
    ASSERT_FALSE(p.ok()) << c.body;
    EXPECT_EQ(p.error.http_status, 400) << c.body;
    EXPECT_EQ(p.error.param, c.param) << c.body;
    EXPECT_THAT(p.error.message, HasSubstr(c.message_part)) << c.body;
  }
  // An assistant turn with empty tool_calls and a name is fine.
  const ParseResult ok = ParseChatCompletionRequest(
      R"({"messages": [{"role": "user", "content": "x", "name": "ann"},
                       {"role": "assistant", "content": "y", "tool_calls": []}]})");
  EXPECT_TRUE(ok.ok()) << ok.error.message;
}

TEST(OpenAIProtocolTest, GrpcCodesMapToHttpStatuses) {
  EXPECT_EQ(HttpStatusFromGrpc(grpc::StatusCode::INVALID_ARGUMENT), 400);
  EXPECT_EQ(HttpStatusFromGrpc(grpc::StatusCode::ALREADY_EXISTS), 400);
  EXPECT_EQ(HttpStatusFromGrpc(grpc::StatusCode::UNAUTHENTICATED), 401);
  EXPECT_EQ(HttpStatusFromGrpc(grpc::StatusCode::PERMISSION_DENIED), 403);
  EXPECT_EQ(HttpStatusFromGrpc(grpc::StatusCode::NOT_FOUND), 404);
  EXPECT_EQ(HttpStatusFromGrpc(grpc::StatusCode::RESOURCE_EXHAUSTED), 429);
  EXPECT_EQ(HttpStatusFromGrpc(grpc::StatusCode::UNIMPLEMENTED), 501);
  EXPECT_EQ(HttpStatusFromGrpc(grpc::StatusCode::UNAVAILABLE), 503);
  EXPECT_EQ(HttpStatusFromGrpc(grpc::StatusCode::DEADLINE_EXCEEDED), 504);
  EXPECT_EQ(HttpStatusFromGrpc(grpc::StatusCode::INTERNAL), 500);
  const json e =
      ErrorFromGrpc(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "too many")).ToJson();
  EXPECT_EQ(e, json::parse(R"({"error": {"message": "too many", "type": "rate_limit_error",
                                         "param": null, "code": "rate_limit_exceeded"}})"));
  EXPECT_EQ(ModelNotFound("x").ToJson()["error"]["code"], "model_not_found");
  EXPECT_EQ(ModelNotFound("x").http_status, 404);
}

v1::GenerateResponse TwoSequences() {
  v1::GenerateResponse r;
  r.set_request_id("req-1");
  v1::SequenceOutput* a = r.add_outputs();
  a->set_index(0);
  a->set_text("Hi there");
  a->add_token_ids(10);
  a->add_token_ids(11);
  for (const auto& [text, lp] : {std::pair<std::string, float>{"Hi", -0.5f}, {" there", -1.0f}}) {
    v1::Logprobs* l = a->add_logprobs();
    l->mutable_sampled()->set_text(text);
    l->mutable_sampled()->set_logprob(lp);
    v1::TokenLogprob* t = l->add_top();
    t->set_text(text);
    t->set_logprob(lp);
    t = l->add_top();
    t->set_text("alt");
    t->set_logprob(-std::numeric_limits<float>::infinity());  // clamped: JSON has no -inf
  }
  a->set_finish_reason(v1::FINISH_REASON_STOP);
  a->set_stop_reason("!");
  v1::SequenceOutput* b = r.add_outputs();
  b->set_index(1);
  b->set_text("Yo");
  b->set_finish_reason(v1::FINISH_REASON_LENGTH);
  r.mutable_usage()->set_prompt_tokens(5);
  r.mutable_usage()->set_completion_tokens(3);
  r.mutable_usage()->set_cached_prompt_tokens(2);
  return r;
}

TEST(OpenAIProtocolTest, CompletionBodyHasOpenAIsShape) {
  OpenAIRequest req;
  req.endpoint = Endpoint::kCompletions;
  req.logprobs = true;
  const ResponseContext ctx{
      .id = ResponseId(Endpoint::kCompletions, "req-1"), .created = 1700000000, .model = "m"};
  EXPECT_EQ(CompletionBody(req, ctx, TwoSequences()), json::parse(R"({
      "id": "cmpl-req-1", "object": "text_completion", "created": 1700000000, "model": "m",
      "choices": [
        {"index": 0, "text": "Hi there", "finish_reason": "stop", "stop_reason": "!",
         "logprobs": {"tokens": ["Hi", " there"], "token_logprobs": [-0.5, -1.0],
                      "top_logprobs": [{"Hi": -0.5, "alt": -9999.0},
                                       {" there": -1.0, "alt": -9999.0}],
                      "text_offset": [0, 2]}},
        {"index": 1, "text": "Yo", "finish_reason": "length", "stop_reason": null,
         "logprobs": {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                      "text_offset": []}}],
      "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8,
                "prompt_tokens_details": {"cached_tokens": 2}}})"));
}

// stop_reason as vLLM's: the stop string, the stop token id as an integer, null for EOS.
TEST(OpenAIProtocolTest, StopReasonIsTheStopStringTheTokenIdOrNull) {
  OpenAIRequest req;
  req.endpoint = Endpoint::kCompletions;
  v1::GenerateResponse r;
  for (int i = 0; i < 3; ++i) {
    v1::SequenceOutput* o = r.add_outputs();
    o->set_index(i);
    o->set_finish_reason(v1::FINISH_REASON_STOP);
  }
  r.mutable_outputs(0)->set_stop_reason("###");
  r.mutable_outputs(1)->set_stop_token_id(13);
  const json body = CompletionBody(req, {.id = "cmpl-x", .created = 1, .model = "m"}, r);
  EXPECT_EQ(body["choices"][0]["stop_reason"], "###");
  EXPECT_EQ(body["choices"][1]["stop_reason"], 13);
  EXPECT_TRUE(body["choices"][2]["stop_reason"].is_null());
  StreamState state;
  const std::vector<json> chunks =
      StreamChunks(req, {.id = "cmpl-x", .created = 1, .model = "m"}, r, &state);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[1]["choices"][0]["stop_reason"], 13);
  EXPECT_TRUE(chunks[2]["choices"][0]["stop_reason"].is_null());
}

TEST(OpenAIProtocolTest, ChatBodyHasOpenAIsShape) {
  OpenAIRequest req;
  req.endpoint = Endpoint::kChatCompletions;
  const json body = CompletionBody(
      req, {.id = ResponseId(Endpoint::kChatCompletions, "req-1"), .created = 1, .model = "m"},
      TwoSequences());
  EXPECT_EQ(body["id"], "chatcmpl-req-1");
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"],
            json::parse(R"({"role": "assistant", "content": "Hi there"})"));
  EXPECT_EQ(body["choices"][0]["logprobs"], nullptr);
  EXPECT_EQ(body["choices"][1]["finish_reason"], "length");
}

TEST(OpenAIProtocolTest, ChatStreamSendsTheRoleOncePerChoiceAndLogprobs) {
  OpenAIRequest req;
  req.endpoint = Endpoint::kChatCompletions;
  req.logprobs = true;
  const ResponseContext ctx{.id = "chatcmpl-x", .created = 1, .model = "m"};
  StreamState state;
  v1::GenerateResponse r = TwoSequences();
  std::vector<json> first = StreamChunks(req, ctx, r, &state);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(first[0]["choices"][0]["delta"],
            json::parse(R"({"role": "assistant", "content": "Hi there"})"));
  EXPECT_EQ(first[0]["choices"][0]["logprobs"]["content"][0],
            json::parse(R"({"token": "Hi", "logprob": -0.5, "bytes": [72, 105],
                            "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]},
                                             {"token": "alt", "logprob": -9999.0,
                                              "bytes": [97, 108, 116]}]})"));
  std::vector<json> second = StreamChunks(req, ctx, r, &state);
  EXPECT_EQ(second[0]["choices"][0]["delta"], json::parse(R"({"content": "Hi there"})"));
  EXPECT_EQ(second[1]["choices"][0]["delta"], json::parse(R"({"content": "Yo"})"));
  const json usage = UsageChunk(req, ctx, r.usage());
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"]["total_tokens"], 8);
}

TEST(OpenAIProtocolTest, CompletionStreamContinuesTextOffsets) {
  OpenAIRequest req;
  req.logprobs = true;
  StreamState state;
  const v1::GenerateResponse r = TwoSequences();
  StreamChunks(req, {}, r, &state);
  const std::vector<json> again = StreamChunks(req, {}, r, &state);
  EXPECT_EQ(again[0]["choices"][0]["logprobs"]["text_offset"], json::parse("[8, 10]"));
  EXPECT_EQ(again[0]["object"], "text_completion");
}

TEST(OpenAIProtocolTest, SseEventsAndInvalidUtf8) {
  EXPECT_EQ(SseEvent(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
  // A token text that is not UTF-8 on its own (half a character) is replaced, not thrown on.
  EXPECT_EQ(SseEvent(json{{"t", std::string("\xe4\xbd")}}), "data: {\"t\":\"\xEF\xBF\xBD\"}\n\n");
}

// Messages that call tools and answer them reach the proto with transformers' fields.
TEST(OpenAIProtocolTest, ToolMessagesReachTheProto) {
  const ParseResult p = ParseChatCompletionRequest(R"({"messages": [
      {"role": "user", "content": [{"type": "text", "text": "Weather "}, {"type": "text",
       "text": "in Paris?"}]},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time",
         "arguments": {"tz": "CET"}}}]},
      {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "21 C"}]})");
  ASSERT_TRUE(p.ok()) << p.error.message;
  const v1::ChatPrompt& chat = p.request.request.chat();
  ASSERT_EQ(chat.messages_size(), 3);
  EXPECT_EQ(chat.messages(0).content(), "Weather in Paris?");
  EXPECT_EQ(chat.messages(1).content(), "");  // null: "", as vLLM gives templates
  ASSERT_EQ(chat.messages(1).tool_calls_size(), 2);
  EXPECT_EQ(chat.messages(1).tool_calls(0).id(), "call_1");
  EXPECT_EQ(chat.messages(1).tool_calls(0).type(), "function");
  EXPECT_EQ(chat.messages(1).tool_calls(0).function().name(), "get_weather");
  EXPECT_EQ(chat.messages(1).tool_calls(0).function().arguments(), R"({"city": "Paris"})");
  EXPECT_EQ(chat.messages(1).tool_calls(1).function().arguments(), R"({"tz":"CET"})");
  EXPECT_EQ(chat.messages(2).role(), "tool");
  EXPECT_EQ(chat.messages(2).tool_call_id(), "call_1");
  EXPECT_EQ(chat.messages(2).name(), "get_weather");
  EXPECT_EQ(chat.messages(2).content(), "21 C");
  EXPECT_EQ(chat.tools_json(), "");
  EXPECT_EQ(p.request.tool_choice, ToolChoice::kNone);
}

constexpr const char* kTools = R"("tools": [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                    "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time"}}])";

ParseResult ParseWithTools(const std::string& rest) {
  return ParseChatCompletionRequest(
      absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], )", kTools, rest, "}"));
}

TEST(OpenAIProtocolTest, ToolsAndToolChoice) {
  // Default "auto": the tools reach the template in the order written; the output is free.
  ParseResult p = ParseWithTools("");
  ASSERT_TRUE(p.ok()) << p.error.message;
  EXPECT_EQ(p.request.tool_choice, ToolChoice::kAuto);
  EXPECT_TRUE(p.request.parallel_tool_calls);
  EXPECT_FALSE(p.request.request.sampling_params().has_structured_output());
  EXPECT_EQ(p.request.request.chat().tools_json(),
            R"([{"type":"function","function":{"name":"get_weather","description":"Weather",)"
            R"("parameters":{"type":"object","properties":{"city":{"type":"string"},)"
            R"("unit":{"enum":["c","f"]}},"required":["city"]}}},)"
            R"({"type":"function","function":{"name":"get_time"}}])");

  p = ParseWithTools(R"(, "tool_choice": "none")");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p.request.tool_choice, ToolChoice::kNone);
  EXPECT_FALSE(p.request.request.chat().tools_json().empty());  // the template still sees them

  // Named: the output is the function's arguments.
  p = ParseWithTools(
      R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}})");
  ASSERT_TRUE(p.ok()) << p.error.message;
  EXPECT_EQ(p.request.tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(p.request.tool_name, "get_weather");
  EXPECT_EQ(p.request.request.sampling_params().structured_output().json_schema(),
            R"({"type":"object","properties":{"city":{"type":"string"},)"
            R"("unit":{"enum":["c","f"]}},"required":["city"]})");

  // Required: a list of calls of the tools.
  p = ParseWithTools(R"(, "tool_choice": "required", "parallel_tool_calls": false)");
  ASSERT_TRUE(p.ok()) << p.error.message;
  EXPECT_EQ(p.request.tool_choice, ToolChoice::kRequired);
  EXPECT_FALSE(p.request.parallel_tool_calls);
  EXPECT_EQ(json::parse(p.request.request.sampling_params().structured_output().json_schema()),
            json::parse(R"({"type": "array", "minItems": 1, "maxItems": 1, "items": {"anyOf": [
              {"type": "object", "properties": {
                 "name": {"type": "string", "enum": ["get_weather"]},
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                "unit": {"enum": ["c", "f"]}}, "required": ["city"]}},
               "required": ["name", "parameters"]},
              {"type": "object", "properties": {
                 "name": {"type": "string", "enum": ["get_time"]},
                 "parameters": {"type": "object"}},
               "required": ["name", "parameters"]}]}})"));
}

TEST(OpenAIProtocolTest, BadToolsAndToolChoiceAre400NamingTheField) {
  const std::string prefix = R"({"messages": [{"role": "user", "content": "x"}], )";
  for (const BadCase& c : {
           BadCase{prefix + R"("tools": [{"type": "function", "function": {"description": "d"}}]})",
                   "tools[0].function.name", "must be a non-empty string"},
           BadCase{prefix + R"("tools": [{"type": "retrieval"}]})", "tools[0].type",
                   "must be \"function\""},
           BadCase{prefix + R"("tools": {"type": "function"}})", "tools", "a list of tools"},
           BadCase{prefix + R"("tools": [{"type": "function", "function": {"name": "f",
                       "parameters": "x"}}]})",
                   "tools[0].function.parameters", "a JSON schema"},
           BadCase{prefix + R"("tools": [{"type": "function", "function": {"name": "f"}},
                       {"type": "function", "function": {"name": "f"}}]})",
                   "tools[1].function.name", "two functions named 'f'"},
           BadCase{absl::StrCat(prefix, kTools, R"(, "tool_choice": {"type": "function",
                       "function": {"name": "nope"}}})"),
                   "tool_choice.function.name", "'nope', which is not among the tools"},
           BadCase{absl::StrCat(prefix, kTools, R"(, "tool_choice": "sometimes"})"), "tool_choice",
                   "is not one of"},
           BadCase{absl::StrCat(prefix, kTools, R"(, "tool_choice": {"type": "function"}})"),
                   "tool_choice", "must be \"none\", \"auto\", \"required\" or"},
           BadCase{prefix + R"("tool_choice": "required"})", "tool_choice", "needs 'tools'"},
           BadCase{absl::StrCat(prefix, kTools, R"(, "parallel_tool_calls": "yes"})"),
                   "parallel_tool_calls", "must be a boolean"},
           BadCase{absl::StrCat(prefix, kTools, R"(, "tool_choice": "required",
                       "response_format": {"type": "json_object"}})"),
                   "tool_choice", "cannot be combined with response_format"},
       }) {
    const ParseResult p = ParseChatCompletionRequest(c.body);
    ASSERT_FALSE(p.ok()) << c.body;
    EXPECT_EQ(p.error.http_status, 400) << c.body;
    EXPECT_EQ(p.error.param, c.param) << c.body;
    EXPECT_THAT(p.error.message, HasSubstr(c.message_part)) << c.body;
  }
  // Completions have no tools.
  const ParseResult p = ParseCompletionRequest(
      R"({"prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}]})");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error.param, "tools");
}

v1::GenerateResponse OneOutput(const std::string& text, v1::FinishReason reason) {
  v1::GenerateResponse r;
  v1::SequenceOutput* o = r.add_outputs();
  o->set_text(text);
  o->set_finish_reason(reason);
  return r;
}

TEST(OpenAIProtocolTest, ToolCallsInTheChatBody) {
  const ResponseContext ctx{.id = "chatcmpl-x", .created = 1, .model = "m"};
  OpenAIRequest req;
  req.endpoint = Endpoint::kChatCompletions;
  req.tool_choice = ToolChoice::kAuto;
  req.tool_format = ToolCallFormat::kHermes;
  json body = CompletionBody(req, ctx,
                             OneOutput("<tool_call>\n{\"name\": \"get_time\", \"arguments\": "
                                       "{}}\n</tool_call>",
                                       v1::FINISH_REASON_STOP));
  json choice = body["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["content"], nullptr);
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  const json call = choice["message"]["tool_calls"][0];
  EXPECT_TRUE(call["id"].get<std::string>().starts_with("call_"));
  EXPECT_EQ(call["id"].get<std::string>().size(), 29u);
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"], json::parse(R"({"name": "get_time", "arguments": "{}"})"));

  // No call: the text, finish_reason stop, no tool_calls.
  body = CompletionBody(req, ctx, OneOutput("It is noon.", v1::FINISH_REASON_STOP));
  EXPECT_EQ(body["choices"][0]["message"], json::parse(R"({"role": "assistant",
                                                          "content": "It is noon."})"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");

  req.tool_choice = ToolChoice::kNamed;
  req.tool_name = "get_weather";
  body = CompletionBody(req, ctx, OneOutput(R"({"city":"Oslo"})", v1::FINISH_REASON_STOP));
  EXPECT_EQ(body["choices"][0]["message"]["tool_calls"][0]["function"],
            json::parse(R"({"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"})"));

  body = CompletionBody(req, ctx, OneOutput(R"({"city":"Os)", v1::FINISH_REASON_LENGTH));
  EXPECT_EQ(body["choices"][0]["message"], json::parse(R"({"role": "assistant",
                                                          "content": "{\"city\":\"Os"})"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");

  req.tool_choice = ToolChoice::kRequired;
  body = CompletionBody(
      req, ctx,
      OneOutput(R"([{"name":"get_weather","parameters":{"city":"Oslo"}},{"name":"get_time",)"
                R"("parameters":{}}])",
                v1::FINISH_REASON_STOP));
  choice = body["choices"][0];
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 2u);
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["arguments"], R"({"city":"Oslo"})");
  EXPECT_EQ(choice["message"]["tool_calls"][1]["function"]["name"], "get_time");
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  // Cut by max_tokens: the text as it is.
  body = CompletionBody(req, ctx, OneOutput(R"([{"name":"get_w)", v1::FINISH_REASON_LENGTH));
  EXPECT_EQ(body["choices"][0]["message"]["content"], R"([{"name":"get_w)");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
}

TEST(OpenAIProtocolTest, ToolCallsStreamAsDeltas) {
  const ResponseContext ctx{.id = "chatcmpl-x", .created = 1, .model = "m"};
  OpenAIRequest req;
  req.endpoint = Endpoint::kChatCompletions;
  req.tool_choice = ToolChoice::kAuto;
  req.tool_format = ToolCallFormat::kHermes;
  StreamState state;
  std::vector<json> deltas;
  json last;
  for (const char* piece : {"Checking", ".\n<tool", "_call>\n{\"name\": \"get_time\", ",
                            "\"arguments\": {}}\n</tool_call>", ""}) {
    v1::GenerateResponse r =
        OneOutput(piece, *piece == '\0' ? v1::FINISH_REASON_STOP : v1::FINISH_REASON_UNSPECIFIED);
    for (const json& chunk : StreamChunks(req, ctx, r, &state)) {
      deltas.push_back(chunk["choices"][0]["delta"]);
      last = chunk["choices"][0];
    }
  }
  ASSERT_EQ(deltas.size(), 5u);
  EXPECT_EQ(deltas[0], json::parse(R"({"role": "assistant", "content": "Checking"})"));
  EXPECT_EQ(deltas[1], json::parse(R"({"content": "."})"));
  EXPECT_EQ(deltas[2], json::parse(R"({"content": ""})"));
  ASSERT_TRUE(deltas[3].contains("tool_calls"));
  EXPECT_FALSE(deltas[3].contains("content"));
  const json call = deltas[3]["tool_calls"][0];
  EXPECT_EQ(call["index"], 0);
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"], json::parse(R"({"name": "get_time", "arguments": "{}"})"));
  EXPECT_EQ(last["finish_reason"], "tool_calls");

  // Named: the name first, then the arguments as generated.
  req.tool_choice = ToolChoice::kNamed;
  req.tool_name = "get_weather";
  StreamState named;
  std::vector<json> chunks =
      StreamChunks(req, ctx, OneOutput("{\"city\"", v1::FINISH_REASON_UNSPECIFIED), &named);
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["tool_calls"][0]["function"],
            json::parse(R"({"name": "get_weather", "arguments": "{\"city\""})"));
  chunks = StreamChunks(req, ctx, OneOutput(":\"Oslo\"}", v1::FINISH_REASON_STOP), &named);
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["tool_calls"][0],
            json::parse(R"({"index": 0, "function": {"arguments": ":\"Oslo\"}"}})"));
  EXPECT_EQ(chunks[0]["choices"][0]["finish_reason"], "tool_calls");
}

// vLLM's documents and chat_template_kwargs reach the proto as JSON text in the order written;
// a message's reasoning_content (or reasoning) too; the wrong types, and kwargs that would
// replace a standard variable, are 400 naming them.
TEST(OpenAIProtocolTest, DocumentsTemplateKwargsAndMessageReasoningReachTheProto) {
  ParseResult p = ParseChatCompletionRequest(R"({"messages": [
      {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello", "reasoning_content": "be nice"},
      {"role": "assistant", "content": "Again", "reasoning": "newer name"}],
      "documents": [{"title": "T", "text": "body", "a": 1}],
      "chat_template_kwargs": {"enable_thinking": false, "custom": [1, 2]},
      "include_reasoning": false})");
  ASSERT_TRUE(p.ok()) << p.error.message;
  const v1::ChatPrompt& chat = p.request.request.chat();
  EXPECT_FALSE(chat.messages(0).has_reasoning_content());
  EXPECT_EQ(chat.messages(1).reasoning_content(), "be nice");
  EXPECT_EQ(chat.messages(2).reasoning_content(), "newer name");
  EXPECT_EQ(chat.documents_json(), R"([{"title":"T","text":"body","a":1}])");
  EXPECT_EQ(chat.template_kwargs_json(), R"({"enable_thinking":false,"custom":[1,2]})");
  EXPECT_FALSE(p.request.include_reasoning);

  p = ParseChatCompletionRequest(R"({"messages": [{"role": "user", "content": "Hi"}],
                                     "chat_template_kwargs": {}, "documents": []})");
  ASSERT_TRUE(p.ok()) << p.error.message;
  EXPECT_EQ(p.request.request.chat().template_kwargs_json(), "");
  EXPECT_TRUE(p.request.include_reasoning);

  const std::pair<std::string, std::string> bad[] = {
      {R"("documents": {"text": "x"})", "documents"},
      {R"("documents": ["x"])", "documents"},
      {R"("chat_template_kwargs": [1])", "chat_template_kwargs"},
      {R"("chat_template_kwargs": {"messages": []})", "chat_template_kwargs.messages"},
      {R"("chat_template_kwargs": {"add_generation_prompt": false})",
       "chat_template_kwargs.add_generation_prompt"},
      {R"("include_reasoning": "yes")", "include_reasoning"},
  };
  for (const auto& [rest, param] : bad) {
    const std::string body = R"({"messages": [{"role": "user", "content": "x"}], )" + rest + "}";
    const ParseResult r = ParseChatCompletionRequest(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.error.http_status, 400) << body;
    EXPECT_EQ(r.error.param, param) << body;
  }
  const ParseResult r = ParseChatCompletionRequest(
      R"({"messages": [{"role": "assistant", "content": "x", "reasoning_content": 3}]})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error.param, "messages[0].reasoning_content");
}

// With a reasoning parser the answer's <think> part is reasoning_content, in the body and in
// the stream (never mixed into content); a tool call after the reasoning is read from the
// content; include_reasoning false drops it; a constrained output starts as content.
TEST(OpenAIProtocolTest, ReasoningContentInTheBodyAndTheStream) {
  const ResponseContext ctx{.id = "chatcmpl-x", .created = 1, .model = "m"};
  OpenAIRequest req;
  req.endpoint = Endpoint::kChatCompletions;
  req.reasoning = ReasoningFormat::kDeepSeekR1;
  json body = CompletionBody(req, ctx, OneOutput("Hmm.</think>\n42", v1::FINISH_REASON_STOP));
  EXPECT_EQ(body["choices"][0]["message"],
            json::parse(R"({"role": "assistant", "reasoning_content": "Hmm.",
                            "content": "\n42"})"));
  body = CompletionBody(req, ctx, OneOutput("Still going", v1::FINISH_REASON_LENGTH));
  EXPECT_EQ(body["choices"][0]["message"],
            json::parse(R"({"role": "assistant", "reasoning_content": "Still going",
                            "content": null})"));

  req.reasoning = ReasoningFormat::kQwen3;
  body = CompletionBody(req, ctx, OneOutput("No thinking.", v1::FINISH_REASON_STOP));
  EXPECT_EQ(body["choices"][0]["message"],
            json::parse(R"({"role": "assistant", "reasoning_content": null,
                            "content": "No thinking."})"));
  req.include_reasoning = false;
  body = CompletionBody(req, ctx, OneOutput("<think>x</think>y", v1::FINISH_REASON_STOP));
  EXPECT_EQ(body["choices"][0]["message"], json::parse(R"({"role": "assistant",
                                                          "content": "y"})"));
  req.include_reasoning = true;

  // A call after the reasoning.
  req.tool_choice = ToolChoice::kAuto;
  req.tool_format = ToolCallFormat::kHermes;
  body = CompletionBody(req, ctx,
                        OneOutput("<think>use the tool</think>\n<tool_call>\n{\"name\": "
                                  "\"get_time\", \"arguments\": {}}\n</tool_call>",
                                  v1::FINISH_REASON_STOP));
  json choice = body["choices"][0];
  EXPECT_EQ(choice["message"]["reasoning_content"], "use the tool");
  EXPECT_EQ(choice["message"]["content"], nullptr);
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "get_time");
  EXPECT_EQ(choice["finish_reason"], "tool_calls");

  // Streamed: reasoning deltas, then content deltas; the marker split across pieces.
  req.tool_choice = ToolChoice::kNone;
  req.reasoning = ReasoningFormat::kDeepSeekR1;
  StreamState state;
  std::string reasoning, content;
  for (const char* piece : {"Let", " me </th", "ink>", "Yes", ""}) {
    v1::GenerateResponse r =
        OneOutput(piece, *piece == '\0' ? v1::FINISH_REASON_STOP : v1::FINISH_REASON_UNSPECIFIED);
    for (const json& chunk : StreamChunks(req, ctx, r, &state)) {
      const json& delta = chunk["choices"][0]["delta"];
      if (delta.contains("reasoning_content")) {
        reasoning += delta["reasoning_content"].get<std::string>();
        EXPECT_FALSE(delta.contains("content")) << delta;
      }
      if (delta.contains("content")) content += delta["content"].get<std::string>();
    }
  }
  EXPECT_EQ(reasoning, "Let me ");
  EXPECT_EQ(content, "Yes");

  // Constrained (a JSON schema): deepseek_r1 does not take the output for reasoning.
  req.request.mutable_sampling_params()->mutable_structured_output()->set_json_schema("{}");
  EXPECT_FALSE(StartsInReasoning(req));
  body = CompletionBody(req, ctx, OneOutput("{}", v1::FINISH_REASON_STOP));
  EXPECT_EQ(body["choices"][0]["message"]["content"], "{}");
  EXPECT_EQ(body["choices"][0]["message"]["reasoning_content"], nullptr);
}

}  // namespace
}  // namespace llm::openai
