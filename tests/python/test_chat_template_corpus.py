"""The Jinja interpreter against Python jinja2 in transformers' chat-template environment
(render_jinja_template), byte for byte: every template of the corpus
(tests/tokenizer/data/jinja_corpus, written to cover the constructs of widely used models'
templates; each file's first comment lists what it exercises) and the built-in ones
(tokenizer/chat_templates), over fixed-seed conversations (chat_conversations.py). Where
jinja2 fails (raise_exception, a template that cannot render a conversation), moeserve fails
too, in one line naming the template. Malformed templates give an error naming the line
jinja2 reports.

Constructs per corpus template (the model family each imitates):
  llama3        Llama 3.1/3.2: bos_token, `is defined`, strftime_now, messages[1:], trim, tojson(indent=4),
                raise_exception, `'tool_calls' in message`, `is mapping or is iterable`
  qwen25        Qwen2.5: tools | tojson, or/and/not chains, re-set loop variable, loop.previtem / nextitem,
                messages[loop.index0 - 1]
  qwen3         Qwen3: namespace(...=messages|length - 1), messages[::-1], startswith / endswith,
                split()[-1], lstrip / rstrip / strip with chars, `is string`, `is false`
  mistral       Mistral v3: loop_messages, alternation via `!=` of booleans and %, dict .items() in a
                for with an if filter, `out[:-1]` of tojson, |length != 9, selectattr(..., "equalto", ...)
  gemma         Gemma 3: first_user_prefix, list contents, ternary role mapping, `-%}` everywhere
  phi4          Phi: trim_blocks / lstrip_blocks with indented tags, comments, `{%+` and `+%}`, raw blocks,
                map(attribute=) | join
  deepseek_r1   DeepSeek-R1: namespace with five fields, one-line template, split('</think>')[-1]
  deepseek_v31  DeepSeek-V3.1: the `thinking` kwarg, is_last_user, split(sep, 1)[1]
  glm45         GLM-4.5: macro visible_text with is string / iterable / mapping, tojson(ensure_ascii=False),
                `for k, v in args.items()`, conditional filter application, `endswith`
  gptoss        gpt-oss: recursive macro with default argument, param_spec['items'], enum | join,
                namespace(name=none), message.thinking, reasoning_effort | default, dict literal | dictsort
  kitchen_sink  the rest: see its first comment (every filter, test and method the interpreter has)
"""
import json
import pathlib
import subprocess

import jinja2
import pytest
from transformers.utils.chat_template_utils import _compile_jinja_template, render_jinja_template

import chat_conversations
import tokenizer_oracle as oracle
from conftest import moeserve_bin

CORPUS = oracle.REPO / "tests" / "tokenizer" / "data" / "jinja_corpus"
TEMPLATE_FILES = sorted(CORPUS.glob("*.jinja")) + sorted(oracle.TEMPLATES.glob("*.jinja"))
MAX_CONVERSATIONS = 200  # conversations tried per template, until TARGET_RENDERED render
TARGET_RENDERED = 30
MIN_RENDERED = 20
SPECIALS = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("deepseek")
    oracle.deepseek_like(directory)
    return directory


def reference(text, messages, tools, kwargs, add_generation_prompt, continue_final):
    """(rendered text, None) or (None, the jinja2 error)."""
    try:
        rendered, _ = render_jinja_template(conversations=[json.loads(json.dumps(messages))], tools=tools,
                                            chat_template=text, add_generation_prompt=add_generation_prompt,
                                            continue_final_message=continue_final, **SPECIALS, **kwargs)
        return rendered[0], None
    except (jinja2.TemplateError, TypeError, ValueError) as e:
        return None, e


def render(tokenizer_dir, path, messages, tools, kwargs, add_generation_prompt, continue_final):
    args = [moeserve_bin(), "chat-template", "--tokenizer", tokenizer_dir, "--chat-template", path,
            "--messages", json.dumps(messages, ensure_ascii=False)]
    if tools is not None:
        args += ["--tools", json.dumps(tools, ensure_ascii=False)]
    if kwargs:
        args += ["--chat-template-kwargs", json.dumps(kwargs)]
    if add_generation_prompt:
        args.append("--add-generation-prompt")
    if continue_final:
        args.append("--continue-final-message")
    return subprocess.run(list(map(str, args)), capture_output=True)


@pytest.mark.parametrize("path", TEMPLATE_FILES, ids=lambda p: p.stem)
def test_renders_like_jinja2(tokenizer_dir, path):
    text = path.read_text(encoding="utf-8")
    rendered = 0
    for i, case in enumerate(chat_conversations.conversations(seed=1234 + i_of(path), count=MAX_CONVERSATIONS)):
        if rendered >= TARGET_RENDERED:
            break
        want, error = reference(text, *case)
        proc = render(tokenizer_dir, path, *case)
        where = f"{path.stem} conversation {i}: {json.dumps(case, ensure_ascii=False)}"
        if error is not None:
            err = proc.stderr.decode()
            assert proc.returncode != 0, f"{where}: jinja2 failed ({error}) but moeserve rendered"
            # The template's errors name it and the line; continue_final_message's own checks
            # (transformers' ValueErrors) name that field.
            named = "continue_final_message" if isinstance(error, ValueError) else str(path)
            assert err.count("\n") == 1 and named in err, f"{where}: {err}"
            if isinstance(error, jinja2.TemplateError) and "raise_exception" in text and str(error) in text:
                assert str(error) in err, f"{where}: {err} does not say {error}"
            continue
        assert proc.returncode == 0, f"{where}: {proc.stderr.decode()}"
        assert proc.stdout.decode("utf-8") == want, where
        rendered += 1
    assert rendered >= MIN_RENDERED, f"{path.stem}: only {rendered} of {MAX_CONVERSATIONS} conversations render"


def i_of(path):
    """A fixed, distinct seed offset per template (its index in the sorted list)."""
    return TEMPLATE_FILES.index(path)


MALFORMED = [
    "{% if x %}\nabc",
    "line1\n{{ x | nosuchfilter }}",
    "{% for x in y %}\n{% endif %}",
    "a\nb\n{{ x is nosuchtest }}",
    "{{ 'unclosed }}",
    "ok\n{% set %}",
    "\n\n{% endfor %}",
    "{{ x + }}",
    "{% macro m( %}{% endmacro %}",
    "{% if x %}{% else %}\n{% elif y %}{% endif %}",
    "one\ntwo {{ (1, 2 }}",
    "{# unclosed comment",
    "{% for x in y %}{% endfor %}\n{% endmacro %}",
    "x\n{{ a.b. }}",
    "{% for %}{% endfor %}",
    "{% if x %}\n{% for a in b %}\n{% endif %}",
    "{{ x ]] }}",
    "{% set x = 1 %}\n\n{% set y = [1, 2 %}",
    "{{ 1 2 }}",
    "{%- if a -%}\n{%- else if b -%}\n{%- endif -%}",
]


@pytest.mark.parametrize("index", range(len(MALFORMED)))
def test_malformed_template_names_the_line(tokenizer_dir, tmp_path, index):
    text = MALFORMED[index]
    with pytest.raises(jinja2.TemplateSyntaxError) as info:
        _compile_jinja_template(text)
    path = tmp_path / f"broken{index}.jinja"
    path.write_text(text, encoding="utf-8")
    proc = render(tokenizer_dir, path, [{"role": "user", "content": "hi"}], None, {}, True, False)
    err = proc.stderr.decode()
    assert proc.returncode != 0 and err.count("\n") == 1, err
    assert err.startswith(f"error: {path}:{info.value.lineno}:"), f"jinja2 says line {info.value.lineno}: {err}"
