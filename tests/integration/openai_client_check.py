#!/usr/bin/env python3
"""Drives llm-scheduler's OpenAI-compatible HTTP API with the official `openai` client.

Run by tests/integration/openai_api_test.cc against a local cluster (fortune-llama, started
with --api-key) after it took a greedy reference over gRPC:

  openai_client_check.py --base-url http://127.0.0.1:PORT/v1 --api-key KEY --model NAME \
      --reference ref.json [--chat=unimplemented|served]

With --cafile the base URL is https and only that certificate is trusted; --checks runs a
subset.

ref.json: {"prompt": str, "max_tokens": int, "text": str, "token_ids": [int]} -- the gRPC
Generate output of a greedy request (BOS added, ignore_eos) for the prompt.

Every check runs; each failure is printed; the exit status is the number of failed checks
(0: all passed). Checks are sequential, so the server's metrics move by this script's
requests only.
"""

import argparse
import json
import re
import socket
import ssl
import sys
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request

import openai
from prometheus_client.parser import text_string_to_metric_families

HANG_GUARD_S = 60  # generous: only a hang trips it


class Checker:
    def __init__(self, args):
        self.args = args
        self.root = args.base_url[: -len("/v1")] if args.base_url.endswith("/v1") else args.base_url
        # HTTPS: the server's certificate is the only one trusted.
        self.ssl = ssl.create_default_context(cafile=args.cafile) if args.cafile else None
        self.http_client = openai.DefaultHttpxClient(verify=self.ssl) if self.ssl else None
        self.client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0,
                                    timeout=HANG_GUARD_S, http_client=self.http_client)
        with open(args.reference) as f:
            self.ref = json.load(f)
        self.failures = []

    # --- helpers ---------------------------------------------------------------------------
    def http(self, method, path, body=None, headers=None):
        """(status, parsed JSON or text) of a raw request."""
        data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.root + path, method=method, data=data,
                                     headers={"Content-Type": "application/json",
                                              **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=HANG_GUARD_S, context=self.ssl) as r:
                status, data = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, data = e.code, e.read().decode()
        try:
            return status, json.loads(data)
        except ValueError:
            return status, data

    def metrics(self):
        """{sample name + sorted labels: value} of /metrics (no key needed)."""
        status, text = self.http("GET", "/metrics")
        assert status == 200, f"/metrics answered {status}"
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
                out[(s.name, labels)] = s.value
        return out

    @staticmethod
    def m(metrics, name, **labels):
        return metrics[(name, tuple(sorted(labels.items())))]

    def expect_error(self, fn, status, code=None, param=None):
        try:
            fn()
        except openai.APIStatusError as e:
            assert e.status_code == status, f"HTTP {e.status_code}, expected {status}: {e.body}"
            body = e.response.json()
            err = body["error"]
            for k in ("message", "type", "param", "code"):
                assert k in err, f"error body lacks {k!r}: {body}"
            assert isinstance(err["message"], str) and err["message"], body
            if code is not None:
                assert err["code"] == code, f"code {err['code']!r}, expected {code!r}"
            if param is not None:
                assert err["param"] == param, f"param {err['param']!r}, expected {param!r}"
            return err
        raise AssertionError(f"no error; expected HTTP {status}")

    def greedy(self, prompt, max_tokens, **kw):
        extra = {"ignore_eos": True, **kw.pop("extra_body", {})}
        return self.client.completions.create(
            model=self.args.model, prompt=prompt, max_tokens=max_tokens, temperature=0,
            extra_body=extra, **kw)

    # --- checks ----------------------------------------------------------------------------
    def check_models_and_health(self):
        models = self.client.models.list()
        ids = [m.id for m in models.data]
        assert ids == [self.args.model], f"/v1/models lists {ids}"
        status, _ = self.http("GET", "/health")
        assert status == 200, f"/health answered {status}"

    def check_greedy_equals_grpc(self):
        r = self.greedy(self.ref["prompt"], self.ref["max_tokens"])
        assert r.choices[0].text == self.ref["text"], (
            f"HTTP text {r.choices[0].text!r} != gRPC text {self.ref['text']!r}")
        assert r.object == "text_completion" and r.id.startswith("cmpl-"), (r.object, r.id)
        assert r.model == self.args.model
        assert r.choices[0].finish_reason == "length"
        assert r.usage.completion_tokens == self.ref["max_tokens"], r.usage

    def check_stream_usage(self):
        stream = self.client.completions.create(
            model=self.args.model, prompt=self.ref["prompt"], max_tokens=12, temperature=0,
            logprobs=0, stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True})
        text, tokens, usage, finish = "", 0, None, None
        for chunk in stream:
            if chunk.usage is not None:
                assert not chunk.choices, "the usage chunk has choices"
                usage = chunk.usage
                continue
            for c in chunk.choices:
                text += c.text
                tokens += len(c.logprobs.tokens)
                finish = c.finish_reason or finish
        assert usage is not None, "no usage chunk with include_usage"
        assert usage.completion_tokens == tokens == 12, (usage, tokens)
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        assert finish == "length", finish
        # The greedy stream is the non-streamed greedy text's prefix (12 of max_tokens).
        assert self.ref["text"].startswith(text), (text, self.ref["text"])

    def check_logprobs(self):
        r = self.greedy(self.ref["prompt"], 6, logprobs=2)
        lp = r.choices[0].logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6, lp
        assert "".join(lp.tokens) == r.choices[0].text, (lp.tokens, r.choices[0].text)
        for tok, lp_tok, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            assert lp_tok <= 0, lp_tok
            assert len(top) >= 2, top
            # Greedy: the sampled token is the most likely one.
            assert abs(max(top.values()) - lp_tok) < 1e-4, (tok, lp_tok, top)

    def check_n2(self):
        r = self.client.completions.create(model=self.args.model, prompt=self.ref["prompt"],
                                           max_tokens=5, n=2, temperature=1.0, seed=7,
                                           extra_body={"ignore_eos": True})
        assert sorted(c.index for c in r.choices) == [0, 1], r.choices
        assert all(c.text for c in r.choices), r.choices
        assert r.usage.completion_tokens == 10, r.usage

    def check_stop(self):
        full = self.ref["text"]
        # A stop string from the middle of the greedy text: the output ends before its first
        # occurrence.
        k = len(full) // 2
        stop = full[k:k + 3]
        first = full.find(stop)
        assert first > 0 and len(stop) == 3, f"no usable stop string in {full!r}"
        r = self.greedy(self.ref["prompt"], self.ref["max_tokens"], stop=[stop])
        assert r.choices[0].text == full[:first], (r.choices[0].text, full[:first], stop)
        assert r.choices[0].finish_reason == "stop", r.choices[0].finish_reason
        # A single string works as well as a list.
        r2 = self.greedy(self.ref["prompt"], self.ref["max_tokens"], stop=stop)
        assert r2.choices[0].text == full[:first]
        assert r2.choices[0].stop_reason == stop, r2.choices[0].stop_reason
        # A stop token id: stop_reason is that id, an integer (vLLM's); length: null.
        ids = self.ref["token_ids"]
        r3 = self.greedy(self.ref["prompt"], self.ref["max_tokens"],
                         extra_body={"stop_token_ids": [ids[4]]})
        assert r3.choices[0].finish_reason == "stop", r3.choices[0].finish_reason
        assert r3.choices[0].stop_reason == ids[4], r3.choices[0].stop_reason
        r4 = self.greedy(self.ref["prompt"], 4)
        assert r4.choices[0].finish_reason == "length" and r4.choices[0].stop_reason is None, r4

    def check_errors(self):
        # A wrong type: 400 naming the field.
        self.expect_error(lambda: self.client.completions.create(
            model=self.args.model, prompt="x", max_tokens=4, extra_body={"top_k": "many"}),
            400, param="top_k")
        # A value the gRPC service refuses: 400 with its message.
        err = self.expect_error(lambda: self.client.completions.create(
            model=self.args.model, prompt="x", max_tokens=4, temperature=-1), 400)
        assert "temperature" in err["message"], err
        # Wrong model: 404 model_not_found.
        self.expect_error(lambda: self.client.completions.create(
            model="no-such-model", prompt="x", max_tokens=4), 404, code="model_not_found")
        # No key, a wrong key: 401; /health and /metrics need none.
        status, body = self.http("POST", "/v1/completions",
                                 {"model": self.args.model, "prompt": "x", "max_tokens": 2})
        assert status == 401 and body["error"]["code"] == "invalid_api_key", (status, body)
        bad = openai.OpenAI(base_url=self.args.base_url, api_key="wrong", max_retries=0,
                            http_client=self.http_client)
        self.expect_error(lambda: bad.models.list(), 401, code="invalid_api_key")
        # Not JSON: 400.
        status, body = self.http("POST", "/v1/completions", b"{not json",
                                 {"Authorization": f"Bearer {self.args.api_key}"})
        assert status == 400 and "error" in body, (status, body)

    def check_logit_bias(self):
        ids = self.ref["token_ids"]
        # The greedy tokens' texts, from the unbiased run's logprobs (which name tokens by text).
        plain = self.greedy(self.ref["prompt"], self.ref["max_tokens"], logprobs=0)
        texts = plain.choices[0].logprobs.tokens
        assert len(texts) == len(ids), (texts, ids)
        # A token greedy emits later but not first: +100 makes greedy emit it at every step.
        k = next(i for i in range(1, len(ids)) if ids[i] != ids[0] and texts[i] != texts[0])
        r = self.greedy(self.ref["prompt"], 4, logprobs=0, logit_bias={str(ids[k]): 100})
        assert r.choices[0].logprobs.tokens == [texts[k]] * 4, (
            r.choices[0].logprobs.tokens, ids[k], texts[k])
        # The same on the chat endpoint (the bias does not care what the prompt is).
        c = self.client.chat.completions.create(
            model=self.args.model, messages=[{"role": "user", "content": "Hi"}],
            max_completion_tokens=3, temperature=0, logprobs=True,
            logit_bias={str(ids[k]): 100}, extra_body={"ignore_eos": True})
        assert [t.token for t in c.choices[0].logprobs.content] == [texts[k]] * 3, c
        # -100 on greedy's first token: another comes first.
        r = self.greedy(self.ref["prompt"], 1, logprobs=0, logit_bias={str(ids[0]): -100})
        assert r.choices[0].logprobs.tokens[0] != texts[0], (r.choices[0].logprobs, texts[0])
        # Bad biases: 400 naming the field (the id's range is the engine's check).
        err = self.expect_error(lambda: self.greedy("x", 2, logit_bias={str(ids[0]): 150}), 400,
                                param="logit_bias")
        assert "[-100, 100]" in err["message"], err
        err = self.expect_error(lambda: self.greedy("x", 2, logit_bias={"99999999": 1}), 400)
        assert "logit_bias token id is 99999999" in err["message"], err
        err = self.expect_error(lambda: self.greedy("x", 2, logit_bias={"a": 1}), 400,
                                param="logit_bias")

    def check_unsupported_fields(self):
        """Fields whose meaning is known but not implemented: 400 naming them, never ignored."""
        messages = [{"role": "user", "content": "Give me JSON."}]

        def refused(param, fn):
            try:
                fn()
            except openai.BadRequestError as e:
                err = e.response.json()["error"]
                assert err["param"] == param, f"param {err['param']!r}, expected {param!r}"
                assert "not supported" in err["message"], err
                return
            raise AssertionError(f"{param}: no BadRequestError")

        chat = lambda **kw: self.client.chat.completions.create(
            model=self.args.model, max_completion_tokens=4, **kw)
        refused("functions", lambda: chat(messages=messages, functions=[{"name": "f"}]))
        refused("messages[0].content[1]", lambda: chat(messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]))
        refused("store", lambda: chat(messages=messages, store=True))
        # What asks for nothing is accepted: the default response format, no tool calls, text
        # parts.
        r = chat(messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                 response_format={"type": "text"}, tool_choice="none", temperature=0)
        assert r.choices[0].message.content is not None, r

    def check_tool_calling(self):
        """tools with tool_choice required and named (constrained to calls of the tools, whose
        arguments validate against their schemas), then the round trip: the calls and a tool
        message answered with tool_choice none."""
        import jsonschema

        weather = {"type": "object",
                   "properties": {"city": {"type": "string", "maxLength": 12},
                                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}
        tools = [{"type": "function", "function": {"name": "get_weather",
                                                   "description": "Current weather",
                                                   "parameters": weather}},
                 {"type": "function", "function": {"name": "get_time",
                                                   "parameters": {"type": "object",
                                                                  "properties": {}}}}]
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]

        def create(msgs, **kw):
            return self.client.chat.completions.create(model=self.args.model, messages=msgs,
                                                       tools=tools, **kw)

        def valid_calls(choice, names):
            calls = choice.message.tool_calls
            assert calls, choice
            for call in calls:
                assert call.id.startswith("call_") and call.type == "function", call
                assert call.function.name in names, call
                jsonschema.validate(json.loads(call.function.arguments),
                                    schemas[call.function.name])
            return calls

        # fortune-llama's template (SmolLM2's) teaches no tool-call format: "auto" cannot be read.
        self.expect_error(lambda: create(messages, max_completion_tokens=4), 400,
                          param="tool_choice")
        self.expect_error(lambda: create(messages, tool_choice={
            "type": "function", "function": {"name": "nope"}}), 400,
            param="tool_choice.function.name")

        required = None
        for seed in range(6):
            r = create(messages, tool_choice="required", max_completion_tokens=120,
                       temperature=1.0, seed=seed)
            c = r.choices[0]
            assert c.finish_reason in ("tool_calls", "length"), c.finish_reason
            if c.finish_reason == "tool_calls":
                required = valid_calls(c, schemas)
                break
        assert required is not None, "no required call finished within 120 tokens"

        named = None
        for seed in range(6):
            r = create(messages, tool_choice={"type": "function",
                                              "function": {"name": "get_weather"}},
                       max_completion_tokens=120, temperature=1.0, seed=seed)
            c = r.choices[0]
            if c.finish_reason == "tool_calls":
                named = valid_calls(c, ["get_weather"])
                assert len(named) == 1 and c.message.content is None, c
                break
        assert named is not None, "no named call finished within 120 tokens"

        # Streamed, named: the name first, then the arguments in pieces that join to the call.
        stream = create(messages, tool_choice={"type": "function",
                                               "function": {"name": "get_weather"}},
                        max_completion_tokens=120, temperature=1.0, seed=1, stream=True)
        name, args, finish = None, "", None
        for chunk in stream:
            if not chunk.choices:
                continue
            d = chunk.choices[0].delta
            for tc in d.tool_calls or []:
                assert tc.index == 0, tc
                if tc.function.name:
                    assert name is None and tc.id.startswith("call_"), tc
                    name = tc.function.name
                args += tc.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        assert name == "get_weather", name
        if finish == "tool_calls":
            jsonschema.validate(json.loads(args), weather)

        # The round trip: the calls, their results, and an answer in text.
        follow = messages + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": c.id, "type": "function",
                 "function": {"name": c.function.name, "arguments": c.function.arguments}}
                for c in required]}]
        follow += [{"role": "tool", "tool_call_id": c.id, "content": "21 degrees, sunny"}
                   for c in required]
        r = create(follow, tool_choice="none", max_completion_tokens=16, temperature=0)
        c = r.choices[0]
        assert c.finish_reason in ("stop", "length"), c.finish_reason
        assert not c.message.tool_calls and isinstance(c.message.content, str), c

    def check_reasoning(self):
        """The cluster runs --reasoning-parser=qwen3. fortune-llama is no reasoning model, so a
        regex constraint makes it open its answer with <think>: the answer comes back as
        reasoning_content and content, whole and streamed alike; include_reasoning false drops
        the reasoning; an answer without <think> is all content. Earlier reasoning in the
        messages, chat_template_kwargs and documents are accepted."""
        pattern = r"<think>[a-z]{1,12}</think>(yes|no)"
        msgs = [{"role": "user", "content": "Is the sky blue?"}]

        def create(**kw):
            return self.client.chat.completions.create(
                model=self.args.model, messages=msgs, max_completion_tokens=60, temperature=0,
                **kw)

        constrained = {"structured_outputs": {"regex": pattern}}
        m = create(extra_body=constrained).choices[0]
        assert m.finish_reason == "stop", m
        d = m.message.model_dump()
        reasoning, content = d.get("reasoning_content"), d.get("content")
        assert isinstance(reasoning, str) and content in ("yes", "no"), d
        assert re.fullmatch(pattern, f"<think>{reasoning}</think>{content}"), d

        streamed = {"reasoning_content": "", "content": ""}
        for chunk in create(extra_body=constrained, stream=True):
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta.model_dump()
            for key in streamed:
                streamed[key] += delta.get(key) or ""
        assert streamed == {"reasoning_content": reasoning, "content": content}, streamed

        hidden = create(extra_body={**constrained, "include_reasoning": False}).choices[0]
        assert hidden.message.model_dump().get("reasoning_content") is None, hidden
        assert hidden.message.content == content, hidden

        plain = create().choices[0].message.model_dump()
        assert plain.get("reasoning_content") is None and plain["content"], plain

        history = msgs + [{"role": "assistant", "content": content,
                           "reasoning_content": reasoning},
                          {"role": "user", "content": "Why?"}]
        r = self.client.chat.completions.create(
            model=self.args.model, messages=history, max_completion_tokens=4,
            extra_body={"chat_template_kwargs": {"enable_thinking": False},
                        "documents": [{"title": "Sky", "text": "Rayleigh scattering."}]})
        assert r.choices[0].finish_reason in ("stop", "length"), r
        self.expect_error(lambda: self.client.chat.completions.create(
            model=self.args.model, messages=msgs,
            extra_body={"chat_template_kwargs": {"messages": []}}), 400,
            param="chat_template_kwargs.messages")

    def check_structured_outputs(self):
        """Constrained outputs through every way of asking: each finished output is valid."""
        import re
        from typing import Literal

        import jsonschema
        import pydantic

        before = self.m(self.metrics(), "llm:worker_constrained_samples")

        class Pet(pydantic.BaseModel):
            name: str = pydantic.Field(max_length=10)
            kind: Literal["cat", "dog", "fish"]
            age: int = pydantic.Field(ge=0, le=30)
            vaccinated: bool
            toys: list[Literal["ball", "rope", "bell"]] = pydantic.Field(max_length=3)

        messages = [{"role": "user", "content": "Describe a pet as JSON."}]
        finished = 0
        for seed in range(4):
            r = self.client.chat.completions.parse(
                model=self.args.model, messages=messages, response_format=Pet,
                max_completion_tokens=120, temperature=1.0, seed=seed)
            c = r.choices[0]
            assert c.finish_reason in ("stop", "length"), c.finish_reason
            if c.finish_reason == "stop":
                finished += 1
                jsonschema.validate(json.loads(c.message.content), Pet.model_json_schema())
                assert c.message.parsed is not None and isinstance(c.message.parsed, Pet), c
                assert re.fullmatch(r"\{.*\}", c.message.content), c.message.content  # compact
        assert finished >= 3, f"only {finished} of 4 schema outputs ended within 120 tokens"

        def completion(extra, seed, max_tokens=40, prompt="Say something: "):
            r = self.client.completions.create(model=self.args.model, prompt=prompt,
                                               max_tokens=max_tokens, temperature=1.0,
                                               seed=seed, extra_body=extra)
            return r.choices[0]

        email = r"[a-z]{3,8}@[a-z]{2,5}\.(com|org)"
        for seed in range(3):
            c = completion({"structured_outputs": {"regex": email}}, seed)
            assert c.finish_reason == "stop" and re.fullmatch(email, c.text), (c.finish_reason,
                                                                               c.text)
        colors = ["red", "green", "dark blue"]
        for seed in range(3):
            c = completion({"guided_choice": colors}, seed)
            assert c.finish_reason == "stop" and c.text in colors, (c.finish_reason, c.text)
        gbnf = 'root ::= "(" num ("+" num){0,3} ")"\nnum ::= [1-9] [0-9]{0,2}'
        for seed in range(3):
            c = completion({"structured_outputs": {"grammar": gbnf}}, seed)
            assert c.finish_reason == "stop" and re.fullmatch(
                r"\([1-9][0-9]{0,2}(\+[1-9][0-9]{0,2}){0,3}\)", c.text), (c.finish_reason, c.text)
        # JSON mode: an object; with few tokens, a prefix of one cut at the length.
        c = completion({"response_format": {"type": "json_object"}}, 7, max_tokens=200)
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.text), dict), c.text
        assert c.text.startswith("{"), c.text
        # A truncated output says so.
        c = completion({"structured_outputs": {"json": {"type": "array", "items": {
            "type": "string"}, "minItems": 40}}}, 1, max_tokens=5)
        assert c.finish_reason == "length" and c.text.startswith("["), (c.finish_reason, c.text)
        # n > 1 and logprobs beside a constraint: every sequence obeys it.
        r = self.client.completions.create(
            model=self.args.model, prompt="Pick: ", max_tokens=10, temperature=1.0, n=3, seed=5,
            logprobs=2, extra_body={"structured_outputs": {"choice": colors}})
        assert all(c.finish_reason == "stop" and c.text in colors for c in r.choices), r.choices
        # Streaming: the deltas concatenate to a match.
        stream = self.client.completions.create(
            model=self.args.model, prompt="x", max_tokens=40, temperature=1.0, seed=3,
            stream=True, extra_body={"structured_outputs": {"regex": email}})
        text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
        assert re.fullmatch(email, text), text
        # A constraint the grammar engine refuses is a 400 naming it; nothing was generated.
        for extra, field in (({"structured_outputs": {"regex": "(ab"}}, "structured_output.regex"),
                             ({"response_format": {"type": "json_schema", "json_schema": {
                                 "name": "x", "schema": {"type": "object", "properties": {
                                     "a": {"type": "strin"}}}}}},
                              "structured_output.json_schema")):
            try:
                completion(extra, 0)
                raise AssertionError(f"{extra}: no BadRequestError")
            except openai.BadRequestError as e:
                assert field in e.response.json()["error"]["message"], e.response.json()
        # The worker sampled them under its masks (its own count, through /metrics).
        after = self.m(self.metrics(), "llm:worker_constrained_samples")
        assert after - before >= 40, (before, after)

    def check_metrics_count_tokens(self):
        before = self.metrics()
        r = self.greedy(self.ref["prompt"], 7)
        after = self.metrics()
        d = lambda name, **l: self.m(after, name, **l) - self.m(before, name, **l)
        assert d("vllm:generation_tokens_total") == r.usage.completion_tokens == 7, (
            d("vllm:generation_tokens_total"), r.usage)
        assert d("vllm:prompt_tokens_total") == r.usage.prompt_tokens, (
            d("vllm:prompt_tokens_total"), r.usage)
        assert d("vllm:request_success_total", finished_reason="length") == 1
        for h in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"):
            assert d(h + "_count") == 1, (h, d(h + "_count"))
            assert self.m(after, h + "_bucket", le="+Inf") == self.m(after, h + "_count")
        # One inter-token observation per step after the first token.
        assert d("vllm:inter_token_latency_seconds_count") == 6
        for g in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                  "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                  "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total"):
            assert (g, ()) in after, f"/metrics lacks {g}"
        assert d("vllm:prefix_cache_queries_total") >= r.usage.prompt_tokens
        # The rank-0 worker's memory by kind, from its step results (llm.v1.WorkerStats.memory).
        mem = lambda kind: self.m(after, "llm:worker_memory_bytes", kind=kind)
        assert mem("weights") > 0 and mem("resident") > mem("weights"), (
            mem("weights"), mem("resident"))
        assert mem("kv_cache_reserved") > 0, mem("kv_cache_reserved")
        assert 0 <= mem("kv_cache_resident") <= mem("kv_cache_reserved"), (
            mem("kv_cache_resident"), mem("kv_cache_reserved"))

    def check_disconnect_aborts(self):
        before = self.metrics()
        max_len = self.client.models.list().data[0].model_extra["max_model_len"]
        # A long request (n sequences to the end of the context, with logprobs) that the client
        # leaves as soon as its stream has begun: a raw socket, so that nothing but the close
        # happens between the first event and the disconnect.
        n, max_tokens = 8, max_len - 32
        body = json.dumps({"model": self.args.model, "prompt": self.ref["prompt"], "n": n,
                           "max_tokens": max_tokens, "temperature": 1.0, "logprobs": 5,
                           "ignore_eos": True, "stream": True}).encode()
        url = urllib.parse.urlsplit(self.root)
        sock = socket.create_connection((url.hostname, url.port), timeout=HANG_GUARD_S)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Authorization: Bearer " + self.args.api_key.encode() + b"\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        received = b""
        while b"data: " not in received:
            data = sock.recv(65536)
            assert data, f"the server closed the stream first: {received!r}"
            received += data
        sock.close()  # the client goes away mid-stream
        assert received.startswith(b"HTTP/1.1 200"), received[:200]
        deadline = time.time() + HANG_GUARD_S
        while True:
            now = self.metrics()
            gone = (self.m(now, "vllm:num_requests_running") == 0
                    and self.m(now, "vllm:num_requests_waiting") == 0
                    and self.m(now, "vllm:kv_cache_usage_perc") == 0)
            aborted = (self.m(now, "vllm:request_success_total", finished_reason="abort")
                       - self.m(before, "vllm:request_success_total", finished_reason="abort"))
            if gone and aborted == 1:
                break
            assert time.time() < deadline, f"request not aborted / blocks not freed: {now}"
            time.sleep(0.05)
        generated = (self.m(now, "vllm:generation_tokens_total")
                     - self.m(before, "vllm:generation_tokens_total"))
        assert generated < n * max_tokens, f"generated {generated} of {n * max_tokens}: not aborted"

    def check_chat(self):
        messages = [{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "Tell me a fortune."}]
        if self.args.chat == "unimplemented":
            # Until chat templates are served, the gRPC UNIMPLEMENTED maps to 501.
            self.expect_error(lambda: self.client.chat.completions.create(
                model=self.args.model, messages=messages, max_completion_tokens=8), 501,
                code="not_implemented")
            self.expect_error(lambda: self.client.chat.completions.create(
                model=self.args.model, messages=messages, max_completion_tokens=8, stream=True,
                stream_options={"include_usage": True}), 501, code="not_implemented")
        else:
            r = self.client.chat.completions.create(
                model=self.args.model, messages=messages, max_completion_tokens=8,
                temperature=0, extra_body={"ignore_eos": True})
            assert r.object == "chat.completion" and r.id.startswith("chatcmpl-"), r
            assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
            assert r.usage.completion_tokens == 8, r.usage
            stream = self.client.chat.completions.create(
                model=self.args.model, messages=messages, max_completion_tokens=8,
                temperature=0, stream=True, stream_options={"include_usage": True},
                logprobs=True, extra_body={"ignore_eos": True})
            text, tokens, usage, role = "", 0, None, None
            for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage
                    continue
                for c in chunk.choices:
                    role = role or c.delta.role
                    text += c.delta.content or ""
                    tokens += len(c.logprobs.content) if c.logprobs else 0
            assert role == "assistant", role
            assert usage is not None and usage.completion_tokens == tokens == 8, (usage, tokens)
            assert text == r.choices[0].message.content, (text, r.choices[0].message.content)
        # Bad messages are refused before the chat path either way.
        self.expect_error(lambda: self.client.chat.completions.create(
            model=self.args.model, messages=[{"role": 3, "content": "x"}]), 400,
            param="messages[0].role")

    def run(self):
        checks = [name for name in dir(self) if name.startswith("check_")]
        order = ["check_models_and_health", "check_metrics_count_tokens",
                 "check_greedy_equals_grpc", "check_stream_usage", "check_logprobs",
                 "check_n2", "check_stop", "check_errors", "check_logit_bias",
                 "check_unsupported_fields", "check_structured_outputs", "check_tool_calling",
                 "check_reasoning", "check_chat",
                 "check_disconnect_aborts"]
        assert sorted(order) == sorted(checks), "every check is run once"
        if self.args.checks:
            order = [c for c in order if c in self.args.checks.split(",")]
        for name in order:
            start = time.time()
            try:
                getattr(self, name)()
                print(f"PASS {name} ({time.time() - start:.2f} s)", flush=True)
            except Exception:  # each failure is reported; the others still run
                self.failures.append(name)
                print(f"FAIL {name} ({time.time() - start:.2f} s)\n{traceback.format_exc()}",
                      flush=True)
        print(f"{len(order) - len(self.failures)} of {len(order)} checks passed", flush=True)
        return len(self.failures)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--api-key", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--reference", required=True)
    p.add_argument("--chat", choices=["unimplemented", "served"], default="unimplemented")
    p.add_argument("--cafile", help="HTTPS: the server's certificate, trusted alone")
    p.add_argument("--checks", help="comma-separated check_ names to run (default: all)")
    sys.exit(Checker(p.parse_args()).run())


if __name__ == "__main__":
    main()
