"""Renders chat templates the way transformers does, for tests/tokenizer/jinja_template_test.cpp.

    jinja_oracle.py CASES.json OUT.json

CASES.json: [{"template": TEXT, "variables": {...}}, ...]. With "messages" among the variables the
case goes through transformers' render_jinja_template (what apply_chat_template calls); without,
through the same compiled environment (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, transformers' tojson and raise_exception). OUT.json: per case {"text": ...} or
{"error": "ExceptionType: message"}.
"""
import json
import sys

from transformers.utils.chat_template_utils import _compile_jinja_template, render_jinja_template


def render(case):
    variables = dict(case["variables"])
    try:
        if "messages" in variables:
            messages = variables.pop("messages")
            rendered, _ = render_jinja_template(conversations=[messages], chat_template=case["template"], **variables)
            return {"text": rendered[0]}
        return {"text": _compile_jinja_template(case["template"]).render(**variables)}
    except Exception as error:  # the C++ side must fail too; the test compares raise_exception messages
        return {"error": f"{type(error).__name__}: {error}"}


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump([render(case) for case in cases], f, ensure_ascii=False)


if __name__ == "__main__":
    main()
