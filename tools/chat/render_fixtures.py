#!/usr/bin/env python3
"""Renders the chat templates of tests/data/chat_templates/templates with Python's jinja2,
configured as Hugging Face transformers configures it for apply_chat_template, and writes the
expected outputs the C++ interpreter (scheduler_service/chat/jinja.h) is tested against:

  tests/data/chat_templates/cases.json     each template over a set of conversations
  tests/data/chat_templates/snippets.json  small templates exercising one feature each

Usage: build/pyenv/bin/python tools/chat/render_fixtures.py   (from the repository root)
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "chat_templates")


def make_env():
    # As transformers.utils.chat_template_utils._compile_jinja_template.
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


# name -> (file, bos_token, eos_token), as each model's tokenizer_config.json has them.
TEMPLATES = {
    "smollm2": ("smollm2.jinja", "<|im_start|>", "<|im_end|>"),
    "qwen2.5": ("qwen2.5.jinja", "", "<|im_end|>"),
    "llama3": ("llama3.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    "llama3.1": ("llama3.1.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    "mistral": ("mistral.jinja", "<s>", "</s>"),
    "phi3": ("phi3.jinja", "<s>", "<|endoftext|>"),
}


def m(role, content):
    return {"role": role, "content": content}


# name -> (messages, add_generation_prompt, extra variables)
CONVERSATIONS = {
    "system_user": ([m("system", "You are a helpful assistant."),
                     m("user", "What is the capital of France?")], True, {}),
    "multi_turn": ([m("system", "You answer in one sentence."),
                    m("user", "Hi!"),
                    m("assistant", "Hello! How can I help you today?"),
                    m("user", "Name a prime number.")], True, {}),
    "no_system": ([m("user", "Hello!"),
                   m("assistant", "Hi! How can I help?"),
                   m("user", "Tell me a joke.")], True, {}),
    "no_generation_prompt": ([m("user", "Say yes."), m("assistant", "Yes.")], False, {}),
    "unicode": ([m("system", "Réponds en français 🇫🇷"),
                 m("user", "Привет, 世界! ¿Qué tal? \"quotes\", 'apostrophes', \\backslash\\ and\ttab")],
                True, {}),
    "whitespace": ([m("user", "  padded question \n\n"),
                    m("assistant", "\n  padded answer  "),
                    m("user", "\tnext")], True, {}),
    "empty_content": ([m("system", ""), m("user", "")], True, {}),
    "date_string": ([m("user", "What day is it?")], True, {"date_string": "24 Nov 2026"}),
    "tool_message": ([m("user", "What's the weather?"),
                      m("assistant", "Let me check."),
                      m("tool", "{\"temp\": 21}")], True, {}),
    "bad_alternation": ([m("user", "One."), m("user", "Two.")], True, {}),
    "starts_with_assistant": ([m("assistant", "I speak first."), m("user", "Ok.")], True, {}),
}


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city (°C or °F)",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "The time now",
    "parameters": {"type": "object", "properties": {}}}}


def call(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


# Conversations with tools, for the templates that take them: (name, messages, variables).
TOOL_CONVERSATIONS = [
    ("tools_offered", [m("system", "You are a helpful assistant."), m("user", "Weather in Paris?")],
     {"tools": [WEATHER_TOOL, TIME_TOOL]}),
    ("tools_no_system", [m("user", "What time is it?")], {"tools": [TIME_TOOL]}),
    ("tool_call_roundtrip",
     [m("user", "Weather in Paris?"),
      {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Paris", "unit": "celsius"})]},
      {"role": "tool", "name": "get_weather", "content": "{\"temp\": 21}"}],
     {"tools": [WEATHER_TOOL]}),
    ("tool_call_string_arguments",
     [m("user", "Weather in Zürich?"),
      {"role": "assistant", "content": "Checking.", "tool_calls": [call("get_weather", "{\"city\": \"Zürich\"}")]},
      {"role": "tool", "content": "sunny"},
      m("assistant", "It is sunny."), m("user", "Thanks!")],
     {"tools": [WEATHER_TOOL]}),
    ("tools_in_system_message", [m("user", "Weather in Oslo?")],
     {"tools": [WEATHER_TOOL], "tools_in_user_message": False}),
]
TOOL_TEMPLATES = ["qwen2.5", "llama3.1"]


def tool_cases(env):
    cases = []
    for name in TOOL_TEMPLATES:
        file, bos, eos = TEMPLATES[name]
        with open(os.path.join(OUT, "templates", file), encoding="utf-8") as f:
            source = f.read()
        for conv, messages, variables in TOOL_CONVERSATIONS:
            context = {"messages": messages, "documents": None, "add_generation_prompt": True,
                       "bos_token": bos, "eos_token": eos}
            context.update(variables)
            case = {"template": name, "conversation": conv, "context": context}
            case.update(render(env, source, context))
            cases.append(case)
    return cases


def render(env, source, context):
    try:
        return {"expected": env.from_string(source).render(**context)}
    except TemplateError as e:
        return {"error": str(e)}


def chat_cases(env):
    cases = []
    for name, (file, bos, eos) in TEMPLATES.items():
        with open(os.path.join(OUT, "templates", file), encoding="utf-8") as f:
            source = f.read()
        for conv, (messages, agp, extra) in CONVERSATIONS.items():
            context = {"messages": messages, "tools": None, "documents": None,
                       "add_generation_prompt": agp, "bos_token": bos, "eos_token": eos}
            context.update(extra)
            case = {"template": name, "conversation": conv, "messages": messages,
                    "add_generation_prompt": agp, "extra": extra}
            case.update(render(env, source, context))
            cases.append(case)
    return {"templates": {k: {"file": "templates/" + v[0], "bos_token": v[1], "eos_token": v[2]}
                          for k, v in TEMPLATES.items()},
            "cases": cases,
            "tool_cases": tool_cases(env)}


# Small templates, one feature each: (name, source, context). Errors are recorded as such;
# the C++ test checks that they fail (and, for raise_exception, with the same message).
# An error's message is compared too where jinja2 raises one of the runtime errors
# (UndefinedError, TypeError, ...): the C++ message contains the text after "Error: ".
SNIPPETS = [
    ("text", "plain text only", {}),
    ("print_values", "{{ 1 }}|{{ 1.5 }}|{{ 2.0 }}|{{ -3 }}|{{ true }}|{{ none }}|{{ 'a' }}|{{ [1, 'b', none] }}|{{ {'k': 'v', 'n': 1} }}", {}),
    ("float_repr", "{{ 0.1 + 0.2 }}|{{ 1e20 }}|{{ 1e-7 }}|{{ 10 / 4 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ 123456789.125 }}", {}),
    ("whitespace_control", "a  {{- ' b ' -}}  c\n  {%- if true %}  d  {% endif -%}\n  e", {}),
    ("trim_blocks", "{% if true %}\nline\n{% endif %}\nafter\n", {}),
    ("lstrip_blocks", "start\n    {% if true %}\n    indented\n    {% endif %}\nend", {}),
    ("lstrip_plus", "x\n    {%+ if true %}y{% endif %}", {}),
    ("trim_plus", "{% if true +%}\nkeep newline{% endif %}", {}),
    ("comment", "a {# a comment #}\n  {#- stripped -#}  b\n{# trim #}\nc", {}),
    ("loop_vars", "{% for x in items %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.previtem|default('-') }}{{ loop.nextitem|default('-') }} {% endfor %}", {"items": ["a", "b", "c"]}),
    ("loop_else", "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}|{% for x in undefined_thing %}{{ x }}{% else %}undef{% endfor %}", {}),
    ("loop_filter", "{% for x in range(10) if x % 3 == 0 %}{{ x }}{{ ',' if not loop.last }}{% endfor %}", {}),
    ("loop_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d|items %}{{ k }}{% endfor %}{% for k in d %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("loop_cycle", "{% for x in 'abcde' %}{{ loop.cycle('0', '1') }}{% endfor %}", {}),
    ("break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("nested_loops", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}{{ loop.index }};{% endfor %}", {}),
    ("if_elif", "{% for n in [1, 2, 3] %}{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %} {% endfor %}", {}),
    ("set_scoping", "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}|{{ x }}", {}),
    ("namespace", "{% set ns = namespace(count=0, found=false) %}{% for i in [1, 2, 3] %}{% set ns.count = ns.count + i %}{% if i == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}", {}),
    ("set_block", "{% set greeting %}Hello {{ name }}!{% endset %}[{{ greeting }}]", {"name": "World"}),
    ("set_tuple", "{% set a, b = [1, 2] %}{{ a }}{{ b }}", {}),
    ("macro", "{% macro tag(name, value='none') %}<{{ name }}>{{ value }}</{{ name }}>{% endmacro %}{{ tag('a') }}{{ tag('b', 2) }}{{ tag(value=3, name='c') }}", {}),
    ("arith_concat", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 'a' ~ 1 ~ none }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ 'x' + 'y' }} {{ -2 ** 2 }}", {}),
    ("compare", "{{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1, 2] == [1, 2] }} {{ 1 != 2 }} {{ none == none }} {{ 'a' == 1 }}", {}),
    ("logic", "{{ true and 'x' }} {{ false or 'y' }} {{ not none }} {{ 0 or [] or 'z' }} {{ 'a' and 0 }}", {}),
    ("in_not_in", "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} {{ 3 not in [1, 2] }}", {}),
    ("ternary", "{{ 'yes' if x else 'no' }} {{ 'yes' if y else 'no' }} [{{ 'only' if y }}]", {"x": 1, "y": 0}),
    ("tests", "{{ x is defined }} {{ nope is defined }} {{ nope is undefined }} {{ none is none }} {{ 'a' is string }} {{ 1 is number }} {{ 1 is integer }} {{ 1.5 is float }} {{ true is boolean }} {{ {} is mapping }} {{ [] is iterable }} {{ 'a' is sequence }} {{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 1 is not none }} {{ x is eq 1 }}", {"x": 1}),
    ("slicing", "{{ s[::-1] }} {{ s[1:3] }} {{ s[-2:] }} {{ items[::2] }} {{ items[1:] }} {{ items[:-1] }} {{ items[-1] }} {{ s[0] }}", {"s": "héllo", "items": [1, 2, 3, 4, 5]}),
    ("attr_subscript", "{{ d.a }} {{ d['a'] }} {{ d.b.c }} {{ d['b']['c'] }} {{ items[0].name }} {{ items.0.name }} [{{ d.missing }}]", {"d": {"a": 1, "b": {"c": 2}}, "items": [{"name": "first"}]}),
    ("string_methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' x') }}|{{ t.startswith('He') }}|{{ t.endswith('!') }}|{{ t.split() }}|{{ t.split('l') }}|{{ t.split('l', 1) }}|{{ t.upper() }}|{{ t.lower() }}|{{ t.replace('l', 'L') }}|{{ 'hello world'.title() }}|{{ 'hello WORLD'.capitalize() }}|{{ t.find('o') }}|{{ t.count('l') }}|{{ ', '.join(['a', 'b']) }}", {"s": "  x padded x  ", "t": "Hello, world!"}),
    ("dict_methods", "{{ d.keys() | list }} {{ d.values() | list }} {% for k, v in d.items() %}{{ k }}:{{ v }}{% endfor %} {{ d.items() | list | length }} {{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 'dflt') }}", {"d": {"a": 1, "b": [2]}}),
    ("filters_strings", "{{ '  pad  ' | trim }}|{{ 'xxpadxx' | trim('x') }}|{{ 'abc' | upper }}|{{ 'ABC' | lower }}|{{ 'hello big-world (x)' | title }}|{{ 'hELLO' | capitalize }}|{{ 'aaa' | replace('a', 'b', 2) }}|{{ 42 | string }}|{{ 'héllo' | length }}|{{ 'abc' | reverse }}", {}),
    ("filters_lists", "{{ items | length }} {{ items | first }} {{ items | last }} {{ items | join(', ') }} {{ items | join }} {{ 'abc' | list }} {{ items | reverse | list }} {{ [3, 1, 3] | unique | list }} {{ [] | first is undefined }}", {"items": [1, 2, 3]}),
    ("filters_numbers", "{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '2.5' | float }} {{ -3 | abs }} {{ 5 | float }}", {}),
    ("filter_default", "{{ missing | default('dflt') }} {{ '' | default('empty') }} {{ '' | default('empty', true) }} {{ none | default('n') }} {{ x | d('y') }}", {"x": "set"}),
    ("filter_tojson", "{{ v | tojson }}\n{{ v | tojson(indent=2) }}\n{{ 'é\"\\n' | tojson }}\n{{ [] | tojson(indent=2) }}{{ {} | tojson }}\n{{ v | tojson(sort_keys=true) }}", {"v": {"name": "Zoë", "n": [1, 2.5, True, None], "empty": {}}}),
    ("filter_select", "{{ msgs | selectattr('role', 'equalto', 'user') | map(attribute='content') | join('+') }} {{ msgs | rejectattr('role', 'eq', 'user') | list | length }} {{ [0, 1, 2, ''] | select | list }} {{ [1, 2, 3, 4] | reject('even') | list }} {{ ['a', 'b'] | map('upper') | list }} {{ msgs | selectattr('flag') | list | length }}", {"msgs": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "flag": True}, {"role": "user", "content": "c"}]}),
    ("filter_items_dictsort", "{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %} {% for k, v in d | dictsort %}{{ k }}{{ v }}{% endfor %}", {"d": {"b": 1, "A": 2, "c": 3}}),
    ("undefined", "[{{ nope }}] [{% for x in nope %}{{ x }}{% endfor %}] [{{ nope | length }}] [{% if nope %}t{% else %}f{% endif %}] [{{ d.missing | default('m') }}]", {"d": {}}),
    ("string_escapes", "{{ 'tab\\there' }}|{{ \"q\\\"uote\" }}|{{ 'uni\\u00e9' }}|{{ 'a' 'b' }}", {}),
    ("range", "{{ range(3) | list }} {{ range(1, 4) | list }} {{ range(10, 0, -3) | list }}", {}),
    ("raw", "{% raw %}{{ not rendered }}{% endraw %}", {}),
    ("attr_undefined", "{{ s.content is defined }} {{ m.content.content is defined }} [{{ s.foo }}] {{ l.foo is defined }} {{ l.append is defined }} {{ s.startswith is defined }} {{ d.items is defined }} {{ d['keys'] is defined }} {{ d.a.b is defined }} {{ none.x is defined }} {{ 1.5.x is defined }} {{ s.startswith('x') }} {{ m.content.upper() }}", {"s": "text", "m": {"content": "hi"}, "l": [1], "d": {"a": "b"}}),
    ("attr_call_missing", "{{ 'abc'.foo() }}", {}),
    ("attr_of_missing_attr", "{{ s.content.x }}", {"s": "text"}),
    ("tuples", "{{ (1, 2) }} {{ (1,) }} {{ () }} {{ d.items() | list }} {{ d | dictsort }} {{ (1, 2) == [1, 2] }} {{ (1, 2) == (1, 2) }} {{ (1, 2) + (3,) }} {{ (1, 2, 3)[1:] }} {% set t = 1, 'a' %}{{ t }} {{ t is sequence }} {{ t | length }} {{ 'b' in ('a', 'b') }} {{ 'abc'.startswith(('x', 'a')) }}", {"d": {"k": 1}}),
    ("with", "{% set a = 'outer' %}{% with a = 1, b = a %}{{ a }} {{ b }}{% set c = 3 %}{{ c }}{% endwith %} {{ a }} [{{ c }}] {% with %}{% set a = 'in' %}{{ a }}{% endwith %} {{ a }}", {}),
    ("filter_block", "{% filter upper %}hello {{ name }}{% endfilter %}|{% filter trim|replace('a', 'o') %}  banana  {% endfilter %}|{% filter indent(2, true) %}x\ny{% endfilter %}|{% for x in 'ab' %}{% filter upper %}{{ x }}{% endfilter %}{% endfor %}", {"name": "you"}),
    ("call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% for x in [1, 2] %}{% call wrap('b') %}item {{ x }}{% endcall %}{% endfor %}{% macro each(items) %}{% for i in items %}{{ caller(i, loop.index) }}{% endfor %}{% endmacro %} {% call(item, n) each(['a', 'b']) %}[{{ n }}:{{ item }}]{% endcall %}", {}),
    ("loop_changed", "{% for m in msgs %}{% if loop.changed(m.role) %}<{{ m.role }}>{% endif %}{{ m.content }}{% endfor %}|{% for x in [1, 1, 2, 1] %}{{ loop.changed(x, 0) }}{% endfor %}", {"msgs": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}, {"role": "user", "content": "d"}]}),
    ("loop_recursive", "{% for item in tree recursive %}<{{ item.name }}@{{ loop.depth }}/{{ loop.depth0 }}{% if item.children %}[{{ loop(item.children) }}]{% endif %}>{% endfor %}", {"tree": [{"name": "a", "children": [{"name": "b", "children": [{"name": "c"}]}, {"name": "d"}]}, {"name": "e"}]}),
    ("call_block_bad", "{% call 'x' %}{% endcall %}", {}),
    ("percent_format", "{{ '%s and %s' % ('a', 1) }}|{{ '%d' % 3.9 }}|{{ '%.2f' % 3.14159 }}|{{ '%5s|%-5s|' % ('ab', 'cd') }}|{{ '%05d' % -42 }}|{{ '%x %X %o %#x %#o' % (255, 255, 8, 255, 8) }}|{{ '%e' % 12345.678 }}|{{ '%g %g %g' % (0.0001, 1e20, 100) }}|{{ '%(name)s is %(age)d' % {'name': 'Bo', 'age': 3} }}|{{ '%s' % [1, 2] }}|{{ '%r' % 'q' }}|{{ '100%%' % () }}|{{ '%+d % d' % (5, 5) }}|{{ '%c%c' % (65, 'é') }}|{{ '%s' % none }}|{{ '%.3s' % 'abcdef' }}|{{ '%s' % true }}|{{ '%d' % true }}|{{ '%*d' % (5, 42) }}|{{ '%-6.2f|' % 2.5 }}|{{ '%s' % (1, 2)|string }}|{{ '%i' % -7 }}|{{ 'no args' % {} }}", {}),
    ("percent_too_few", "{{ '%s %s' % ('a',) }}", {}),
    ("percent_too_many", "{{ '%s' % ('a', 'b') }}", {}),
    ("percent_bad_type", "{{ '%d' % 'x' }}", {}),
    ("percent_bad_char", "{{ '%y' % 1 }}", {}),
    ("str_format", "{{ '{} + {} = {}'.format(1, 2, 3) }}|{{ '{0}{1}{0}'.format('a', 'b') }}|{{ '{name}!'.format(name='hi') }}|{{ '{:>6}|{:<6}|{:^6}|{:*^7}'.format('r', 'l', 'c', 'm') }}|{{ '{:.2f} {:8.3f} {:+d} {:,} {:05d} {:x} {:#b} {:e} {:%} {:,.2f}'.format(3.14159, 2.5, 7, 1234567, -42, 255, 5, 1234.5, 0.25, 1234567.891) }}|{{ '{0[0]} {0[1]} {1[k]} {1.k}'.format(['x', 'y'], {'k': 'v'}) }}|{{ '{!r} {!s}'.format('q', 1.0) }}|{{ '{{literal}}'.format() }}|{{ '{:{w}}|'.format('a', w=4) }}|{{ '{}'.format(none) }}|{{ '{:g} {:.3} {} {:.0f} {:.1f}'.format(0.5, 2.0, 1e20, 2.5, 0.25) }}|{{ '{:>8.3}|'.format('abcdef') }}|{{ '{}{}'.format(true, [1, 'a']) }}|{{ '{:d}'.format(true) }}|{{ '{:=+6}'.format(-3) }}", {}),
    ("str_format_index", "{{ '{} {}'.format(1) }}", {}),
    ("str_format_key", "{{ '{x}'.format(y=1) }}", {}),
    ("str_format_code", "{{ '{:d}'.format('s') }}", {}),
    ("filter_format", "{{ '%s-%s' | format('a', 'b') }}|{{ '%(x)s' | format(x=1) }}|{{ '%.1f%%' | format(12.34) }}|{{ '%s' | format([1]) }}", {}),
    ("string_methods_more", "{{ s.rfind('l') }} {{ s.rindex('o') }} {{ s.center(11, '*') }}|{{ 'ab'.center(5) }}|{{ 'abc'.center(6) }}|{{ 'ab'.ljust(4, '.') }}|{{ 'ab'.rjust(4) }}|{{ '-5'.zfill(4) }} {{ 'a,b,c'.partition(',') }} {{ 'a,b,c'.rpartition(',') }} {{ 'x'.partition(',') }} {{ 'prefix_x'.removeprefix('prefix_') }} {{ 'x.json'.removesuffix('.json') }} {{ 'AbC'.swapcase() }} {{ 'ABC'.isupper() }} {{ 'abc1'.islower() }} {{ '123'.isnumeric() }} {{ 'Hello'.casefold() }} {{ s.split('l', 1) }} {{ 'a-b-c'.rsplit('-', 1) }} {{ 'xxhixx'.strip('x') }} {{ 'a\\nb\\r\\nc'.splitlines() }} {{ 'ab'.endswith(('b',)) }} {{ 'a b'.split(' ') }} {{ d.copy() }} {{ l.copy() }} {{ 'abc'.index('c') }} {{ l.index(2) }} {{ l.count(1) }}", {"s": "Hello world", "d": {"a": 1}, "l": [1, 2]}),
    ("filters_center_truncate", "{{ 'ab' | center(6) }}|{{ 'Hello big world' | truncate(9) }}|{{ 'Hello big world' | truncate(9, true) }}|{{ 'Hello big world' | truncate(12, false, '..', 0) }}|{{ 'short' | truncate(5) }}|{{ ('x' * 300) | truncate | length }}|{{ 'abcdefghij' | truncate(5, leeway=0) }}", {}),
    ("filter_sort", "{{ [3, 1, 2] | sort | list }} {{ ['b', 'A', 'c'] | sort }} {{ ['b', 'A', 'c'] | sort(case_sensitive=true) }} {{ [3, 1, 2] | sort(reverse=true) }} {{ users | sort(attribute='age') | map(attribute='name') | join(',') }} {{ users | sort(attribute='age,name') | map(attribute='name') | join(',') }} {{ users | sort(attribute='name', reverse=true) | map(attribute='name') | join(',') }} {{ [[2, 'b'], [1, 'a']] | sort(attribute='0') }} {{ users | sort(true, attribute='age') | map(attribute='name') | join(',') }} {{ {'b': 1, 'a': 2} | sort }}", {"users": [{"name": "bob", "age": 30}, {"name": "al", "age": 25}, {"name": "cy", "age": 30}]}),
    ("filter_sort_mixed", "{{ [1, 'a'] | sort }}", {}),
    ("filter_aggregate", "{{ [1, 2, 3] | sum }} {{ [1.5, 2] | sum }} {{ users | sum(attribute='age') }} {{ [1, 2] | sum(start=10) }} {{ [3, 1, 2] | min }} {{ [3, 1, 2] | max }} {{ ['b', 'A', 'c'] | min }} {{ ['b', 'A', 'c'] | max(case_sensitive=true) }} {{ users | min(attribute='age') }} {{ users | max(attribute='name') }} [{{ [] | max }}] {{ ['a', 'A', 'b'] | unique | list }} {{ ['a', 'A'] | unique(case_sensitive=true) | list }} {{ users | unique(attribute='age') | map(attribute='name') | list }} {{ 'bca' | max }}", {"users": [{"name": "bob", "age": 30}, {"name": "al", "age": 25}, {"name": "cy", "age": 30}]}),
    ("filter_round", "{{ 2.5 | round }} {{ 3.5 | round }} {{ 2.675 | round(2) }} {{ 1.2345 | round(2, 'floor') }} {{ 1.2345 | round(1, 'ceil') }} {{ 5 | round }} {{ 1234 | round(-2) }} {{ 1250 | round(-2) }} {{ 1350 | round(-2) }} {{ -2.5 | round }} {{ 0.125 | round(2) }} {{ 42.0 | round(0) | int }} {{ 1e20 | round(2) }} {{ 5 | round(1, 'ceil') }}", {}),
    ("filter_round_method", "{{ 1.5 | round(0, 'up') }}", {}),
    ("filter_groupby", "{% for g in users | groupby('age') %}{{ g.grouper }}:{{ g.list | map(attribute='name') | join('+') }};{% endfor %} {% for age, members in users | groupby('age') %}{{ age }}={{ members | length }};{% endfor %} {{ (users | groupby('age'))[0] }} {% for g in words | groupby('k') %}{{ g.grouper }}{{ g.list | length }}{% endfor %} {% for g in words | groupby('k', case_sensitive=true) %}{{ g.grouper }}{% endfor %} {% for g in users | groupby('team', default='none') %}{{ g.grouper }}{{ g.list | length }}{% endfor %}", {"users": [{"name": "bob", "age": 30}, {"name": "al", "age": 25}, {"name": "cy", "age": 30, "team": "x"}], "words": [{"k": "B"}, {"k": "a"}, {"k": "b"}]}),
    ("filter_batch_slice", "{{ [1, 2, 3, 4, 5] | batch(2) | list }} {{ [1, 2, 3] | batch(2, 'x') | list }} {{ [1, 2, 3, 4, 5] | slice(3) | list }} {{ [1, 2, 3, 4] | slice(3, 0) | list }} {% for row in 'abcde' | batch(3) %}{{ row | join }};{% endfor %} {{ [] | batch(2) | list }}", {}),
    ("filter_tojson_options", "{{ v | tojson(ensure_ascii=true) }}\n{{ v | tojson(indent=2, separators=(',', ': ')) }}\n{{ v | tojson(separators=(',', ':')) }}\n{{ v | tojson(indent='\\t') }}\n{{ v | tojson(true) }}\n{{ v | tojson(false, 1, none, true) }}\n{{ (1, 'a') | tojson }}\n{{ '😀\\x7f\\x01' | tojson(ensure_ascii=true) }}\n{{ v | tojson(indent=0) }}", {"v": {"name": "Zoë", "list": [1, {"b": None}], "a": True}}),
    ("unicode_case", "{{ s | upper }}|{{ s | lower }}|{{ s.upper() }}|{{ s.lower() }}|{{ s.title() }}|{{ s | title }}|{{ s | capitalize }}|{{ s.capitalize() }}|{{ s.swapcase() }}|{{ 'ΟΔΟΣ ΣΑΣ Σ'.lower() }}|{{ 'straße'.upper() }}|{{ 'ÉCOLE' is upper }}|{{ 'école 1' is lower }}|{{ 'ÉCOLE'.isupper() }}|{{ 'Москва'.islower() }}|{{ '東京' is lower }}|{{ 'hello-wörld (ÉTÉ) [x' | title }}|{{ ['Éa', 'éb', 'Ec'] | sort }}|{{ {'Éb': 1, 'éa': 2} | dictsort }}", {"s": "héllo wörld ПРИВЕТ мир ĳ ÿ Ωμέγα tiếng việt ƠƯ 東京abc 1st ärger"}),
    ("dict_int_keys", "{% set d = {1: 'one', 2: 'two', 'k': 'v'} %}{{ d[1] }} {{ d[2] }} {{ d.k }} {{ d }} {{ 1 in d }} {{ 3 in d }} {{ d.get(2) }} {{ d.get(1.0) }} {{ d[true] }} {% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {{ d | tojson }} {{ d.keys() | list }} {{ {(1, 2): 'pair'}[(1, 2)] }} {{ {none: 'n'} }} [{{ d[5] }}] {{ {2: 'b', 1: 'a'} | dictsort }} {{ {'b': 2, 'a': 3} | dictsort(by='value', reverse=true) }} {{ {1.5: 1, true: 2, none: 3} | tojson }} {{ {1: 'x', 2: 'y'} | tojson(sort_keys=true) }} {{ {1: 'a'} == {1.0: 'a'} }} {% for k in {3: 'c', 1: 'a'} %}{{ k + 1 }}{% endfor %}", {}),
    ("dict_unhashable_key", "{{ {[1]: 2} }}", {}),
    ("indent_splitlines", "{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb\\n' | indent(width='> ', blank=true) }}|{{ '\\nx' | indent(first=true) }}|{{ 'a\\r\\nb\\rc\\x0bd' | indent(1) }}|{{ 'a\\r\\nb\\rc\\n'.splitlines() }}|{{ '  a b  c '.rsplit(None, 1) }}|{{ 'a  b c'.rsplit(None, 1) }}|{{ ' x '.rsplit(None, 5) }}|{{ 'a b c'.rsplit(' ', 1) }}", {}),
    ("filter_attr", "{{ (d | attr('items'))() | list }} [{{ d | attr('k') }}] {{ d | attr('k') is defined }} {% for g in [{'a': 1}] | groupby('a') %}{{ g | attr('grouper') }}{% endfor %} {{ 'abc' | attr('upper') is defined }}", {"d": {"k": "v"}}),
    ("raise_exception", "{% if true %}{{ raise_exception('Custom failure: ' ~ 42) }}{% endif %}", {}),
    ("undefined_callable", "{{ not_a_function(1) }}", {}),
    ("undefined_attribute_of_undefined", "{{ nope.attr }}", {}),
    ("syntax_unclosed_if", "{% if true %}never closed", {}),
    ("syntax_bad_expression", "{{ 1 + }}", {}),
    ("unknown_filter", "{{ 'a' | no_such_filter }}", {}),
    ("type_error", "{{ 'a' + 1 }}", {}),
    ("namespace_required", "{% set d = {} %}{% set d.x = 1 %}", {}),
]


def snippet_cases(env):
    out = []
    for name, source, context in SNIPPETS:
        case = {"name": name, "source": source, "context": context}
        try:
            case["expected"] = env.from_string(source).render(**context)
        except jinja2.exceptions.TemplateSyntaxError as e:
            case["error"] = str(e)
        except Exception as e:  # noqa: BLE001 -- every failure is a fixture of an error
            case["error"] = "%s: %s" % (type(e).__name__, e)
        out.append(case)
    return out


def main():
    env = make_env()
    data = chat_cases(env)
    with open(os.path.join(OUT, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(OUT, "snippets.json"), "w", encoding="utf-8") as f:
        json.dump({"jinja2_version": jinja2.__version__, "snippets": snippet_cases(env)}, f,
                  ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote %d chat cases and %d snippets (jinja2 %s)" %
          (len(data["cases"]), len(SNIPPETS), jinja2.__version__))
    return 0


if __name__ == "__main__":
    sys.exit(main())
