#!/usr/bin/env python3
"""Structured outputs from a real model (SmolLM2) through the official `openai` client.

Run by tests/integration/openai_api_test.cc (StructuredOutputsFromARealModel) against a local
cluster serving SmolLM2-135M-Instruct:

  structured_outputs_check.py --base-url http://127.0.0.1:PORT/v1 --model NAME

`client.chat.completions.parse` with Pydantic models of the kinds applications send (nested
objects through $ref, arrays with bounds, enums, optional fields as anyOf, a date format,
patterns, integer bounds), sampled at temperature 0.8 with several seeds: every output that
ends with finish_reason "stop" validates against its schema (jsonschema) and parses back into
the model; most must end so within the token budget. Exit status: the number of failures.
"""

import argparse
import datetime
import json
import sys
from typing import Literal, Optional

import jsonschema
import openai
import pydantic
from pydantic import BaseModel, Field


class Capital(BaseModel):
    country: str
    capital: str


class Address(BaseModel):
    street: str = Field(max_length=40)
    city: str = Field(max_length=30)
    postcode: str = Field(pattern=r"^[0-9]{5}$")


class Item(BaseModel):
    sku: str = Field(pattern=r"^[A-Z]{3}-[0-9]{3}$")
    quantity: int = Field(ge=1, le=10)
    price: float


class Order(BaseModel):
    id: int = Field(ge=1, le=99999)
    status: Literal["pending", "shipped", "delivered"]
    placed_on: datetime.date
    items: list[Item] = Field(min_length=1, max_length=3)
    note: Optional[str] = Field(max_length=30)
    ship_to: Address


class Person(BaseModel):
    name: str = Field(max_length=40)
    age: int = Field(ge=0, le=150)
    hobbies: list[str] = Field(max_length=4)
    employed: bool


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    args = p.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", max_retries=0, timeout=120)
    failures = []

    # Greedy: the model's own answer, in the schema's shape and order.
    r = client.chat.completions.parse(
        model=args.model, temperature=0, max_completion_tokens=60, response_format=Capital,
        messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}])
    c = r.choices[0]
    print("capital:", c.finish_reason, c.message.content)
    if c.finish_reason != "stop" or c.message.parsed is None:
        failures.append(f"capital: {c.finish_reason} {c.message.content!r}")
    elif "paris" not in c.message.parsed.capital.lower():
        failures.append(f"capital: {c.message.parsed!r} does not name Paris")
    elif list(json.loads(c.message.content)) != ["country", "capital"]:
        failures.append(f"capital: keys out of the schema's order: {c.message.content}")

    for model, prompt in ((Order, "Write an example order of a web shop as JSON."),
                          (Person, "Invent a person and describe them as JSON.")):
        schema = model.model_json_schema()
        stopped = 0
        for seed in range(4):
            r = client.chat.completions.parse(
                model=args.model, temperature=0.8, seed=seed, max_completion_tokens=300,
                response_format=model, messages=[{"role": "user", "content": prompt}])
            c = r.choices[0]
            print(f"{model.__name__} seed {seed}:", c.finish_reason, c.message.content)
            if c.finish_reason != "stop":
                continue
            stopped += 1
            try:
                jsonschema.validate(json.loads(c.message.content), schema,
                                    format_checker=jsonschema.FormatChecker())
                assert isinstance(c.message.parsed, model), c.message.parsed
            except (AssertionError, json.JSONDecodeError, jsonschema.ValidationError,
                    pydantic.ValidationError) as e:
                failures.append(f"{model.__name__} seed {seed}: {e}")
        if stopped < 3:
            failures.append(f"{model.__name__}: only {stopped} of 4 outputs ended within the budget")

    for f in failures:
        print("FAIL", f)
    print(f"{len(failures)} failure(s)")
    return len(failures)


if __name__ == "__main__":
    sys.exit(main())
