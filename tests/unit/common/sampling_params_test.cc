#include "common/sampling_params.h"

#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace llm {
namespace {

using ::testing::HasSubstr;

std::string Error(const SamplingParams& p, const SamplingLimits& limits = {}) {
  const absl::Status s = p.Validate(limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

TEST(SamplingParams, DefaultsAreValid) {
  EXPECT_TRUE(SamplingParams{}.Validate().ok());
  SamplingParams p{.n = 4, .temperature = 0.7, .top_p = 0.9, .top_k = 50, .min_p = 0.05};
  p.max_tokens = 100;
  p.min_tokens = 100;
  p.stop = {"\n\n"};
  p.stop_token_ids = {0, 2};
  p.logprobs = 20;
  p.presence_penalty = -2;
  p.frequency_penalty = 2;
  p.repetition_penalty = 1.3;
  p.logit_bias = {{0, -100.0f}, {31, 100.0f}, {7, 0.5f}};
  EXPECT_TRUE(p.Validate({.vocab_size = 32}).ok()) << p.Validate();
}

TEST(SamplingParams, EachFieldOutOfRangeIsNamedWithValueAndRange) {
  SamplingParams p;
  p.n = 0;
  EXPECT_THAT(Error(p), HasSubstr("n is 0; it must be in [1, 16]"));
  p = {};
  p.n = 9;
  EXPECT_THAT(Error(p, {.max_n = 8}), HasSubstr("n is 9; it must be in [1, 8]"));
  p = {};
  p.temperature = -0.5;
  EXPECT_THAT(Error(p), HasSubstr("temperature is -0.5; it must be finite and >= 0"));
  p.temperature = std::numeric_limits<double>::infinity();
  EXPECT_THAT(Error(p), HasSubstr("temperature is inf"));
  p.temperature = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(Error(p), HasSubstr("temperature is nan"));
  p = {};
  p.top_p = 0;
  EXPECT_THAT(Error(p), HasSubstr("top_p is 0; it must be in (0, 1]"));
  p.top_p = 1.5;
  EXPECT_THAT(Error(p), HasSubstr("top_p is 1.5"));
  p = {};
  p.top_k = 0;
  EXPECT_THAT(Error(p), HasSubstr("top_k is 0; it must be -1 (disabled) or >= 1"));
  p.top_k = -2;
  EXPECT_THAT(Error(p), HasSubstr("top_k is -2"));
  p = {};
  p.min_p = 1.1;
  EXPECT_THAT(Error(p), HasSubstr("min_p is 1.1; it must be in [0, 1]"));
  p = {};
  p.max_tokens = 0;
  EXPECT_THAT(Error(p), HasSubstr("max_tokens is 0; it must be >= 1"));
  p = {};
  p.max_tokens = 10;
  p.min_tokens = 11;
  EXPECT_THAT(Error(p), HasSubstr("min_tokens is 11; it must be in [0, max_tokens = 10]"));
  p = {};
  p.stop = {"ok", ""};
  EXPECT_THAT(Error(p), HasSubstr("stop is an empty string; it must be non-empty"));
  p = {};
  p.stop_token_ids = {-3};
  EXPECT_THAT(Error(p), HasSubstr("stop_token_ids is -3; it must be >= 0"));
  p = {};
  p.logprobs = 21;
  EXPECT_THAT(Error(p), HasSubstr("logprobs is 21; it must be in [0, 20]"));
  p = {};
  p.presence_penalty = 2.5;
  EXPECT_THAT(Error(p), HasSubstr("presence_penalty is 2.5; it must be in [-2, 2]"));
  p = {};
  p.frequency_penalty = -2.01;
  EXPECT_THAT(Error(p), HasSubstr("frequency_penalty is -2.01; it must be in [-2, 2]"));
  p = {};
  p.repetition_penalty = 0;
  EXPECT_THAT(Error(p), HasSubstr("repetition_penalty is 0; it must be finite and > 0"));
}

TEST(SamplingParams, LogitBiasTokenIdsAndBiasesAreChecked) {
  const SamplingLimits vocab32{.vocab_size = 32};
  SamplingParams p;
  p.logit_bias = {{32, 1.0f}};
  EXPECT_THAT(Error(p, vocab32),
              HasSubstr("logit_bias token id is 32; it must be in [0, 32) (the vocabulary)"));
  EXPECT_TRUE(p.Validate().ok());  // no vocabulary size: only >= 0
  p.logit_bias = {{-1, 1.0f}};
  EXPECT_THAT(Error(p), HasSubstr("logit_bias token id is -1; it must be >= 0"));
  p.logit_bias = {{3, 100.5f}};
  EXPECT_THAT(Error(p, vocab32), HasSubstr("logit_bias[3] is 100.5; it must be finite and in "
                                           "[-100, 100]"));
  p.logit_bias = {{3, -std::numeric_limits<float>::infinity()}};
  EXPECT_THAT(Error(p, vocab32), HasSubstr("logit_bias[3] is -inf"));
  p.logit_bias = {{3, std::numeric_limits<float>::quiet_NaN()}};
  EXPECT_THAT(Error(p, vocab32), HasSubstr("logit_bias[3] is nan"));
  p.logit_bias = {{3, 1.0f}, {5, 2.0f}, {3, -1.0f}};
  EXPECT_THAT(Error(p, vocab32), HasSubstr("logit_bias token id is 3; it must be listed once"));
}

TEST(SamplingParams, GreedyOnlyWithOneSequence) {
  SamplingParams p;
  p.temperature = 0;
  EXPECT_TRUE(p.greedy());
  EXPECT_TRUE(p.Validate().ok());
  p.n = 2;
  EXPECT_THAT(Error(p), HasSubstr("n is 2; it must be 1 when temperature is 0"));
}

}  // namespace
}  // namespace llm
