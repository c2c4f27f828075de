"""`dschat serve` and `dschat chat` on a tokenizer directory whose tokenizer_config.json has a Jinja
chat_template: the prompt is that template's rendering (its token count equals transformers'
apply_chat_template), --chat-template deepspeed brings back DeepSpeed-Chat's format, and a
template outside dschat's Jinja subset is refused at start, naming the file and the construct. A tiny
random Qwen2 served with Qwen2.5's own template answers exactly what transformers' greedy generate does;
tools offered through that template, and a scripted model's <tool_call> reply returned as tool_calls.

Run: .venv/bin/python tests/serve/chat_template_test.py   (ctest: serve_chat_template). The tokenizer
directory is made at test time from the bundled GPT-2 files plus a tokenizer_config.json.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import unittest
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_fixture import CLI, TINY_MODEL, TOKENIZER, ServedModels  # noqa: E402

import openai  # noqa: E402

# Zephyr-like, on tokens the tiny model's 50257-entry vocabulary has: <|endoftext|> as bos and eos.
TEMPLATE = ("{{ bos_token }}{% for message in messages %}\n"
            "{{ '<|' + message['role'] + '|>\\n' + message['content'] | trim + eos_token }}\n"
            "{% endfor %}\n"
            "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "  What is the capital of France? "}]


def tokenizer_dir(parent, template, special_tokens=()):
    """A copy of the GPT-2 tokenizer with `template` as its chat_template, and `special_tokens`
    added as special tokens 50257, 50258, ..."""
    path = pathlib.Path(parent)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(TOKENIZER / name, path / name)
    config = {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
              "unk_token": "<|endoftext|>", "chat_template": template}
    if special_tokens:
        added = {"content": "<|endoftext|>", "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        config["added_tokens_decoder"] = {str(50256 + i): dict(added, content=token)
                                          for i, token in enumerate(("<|endoftext|>",) + tuple(special_tokens))}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def transformers_prompt(directory, messages):
    """(text, ids) of transformers' apply_chat_template on the same directory."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return text, list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def scripted_gpt2(directory, scripts, vocab_size=50257):
    """A one-layer GPT-2 saved in `directory` whose greedy reply to a prompt of length P is
    scripts[P] (token ids): its blocks are zeroed and the position embedding at P - 1 + i points at
    the script's i-th token (30 times its embedding, so that token wins the tied head's argmax).
    Returns the transformers model, to check the scripts with its generate."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=vocab_size, n_positions=512, n_embd=64, n_layer=1, n_head=2,
                        bos_token_id=50256, eos_token_id=50256)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for parameter in model.transformer.h.parameters():
            parameter.zero_()
        model.transformer.wte.weight.normal_()
        model.transformer.wpe.weight.zero_()
        for length, script in scripts.items():
            for i, token in enumerate(script):
                model.transformer.wpe.weight[length - 1 + i] = 30.0 * model.transformer.wte.weight[token]
    model.save_pretrained(directory, safe_serialization=True)
    return model


def two_scripted_prompts(directory, asks, texts, tools=None):
    """A scripted_gpt2 in `directory` (a tokenizer_dir) that answers each of two conversations
    `asks` with the matching text of `texts` (then eos), checked with transformers' generate.
    Returns each conversation's prompt ids (the template's, with `tools` if given)."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    extra = {"tools": tools} if tools else {}
    ids = [template_ids(tokenizer, ask, **extra) for ask in asks]
    scripts = [tokenizer(text)["input_ids"] + [50256] for text in texts]
    assert len(ids[1]) > len(ids[0]) + len(scripts[0]), "the scripts would overlap"
    model = scripted_gpt2(directory, {len(ids[0]): scripts[0], len(ids[1]): scripts[1]})
    for prompt, script in zip(ids, scripts):
        assert greedy_ids(model, prompt, len(script) + 8) == script, "the scripted model does not follow its script"
    return ids


def after_the_call(messages, call):
    """The next turn after a reply's tool call: the call and its result, as OpenAI's clients send
    them, and as transformers' templates take them (arguments as a dict)."""
    result = {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}
    sent = {"id": call.id, "type": "function",
            "function": {"name": call.function.name, "arguments": call.function.arguments}}
    parsed = dict(sent, function={"name": call.function.name, "arguments": json.loads(call.function.arguments)})
    return (messages + [{"role": "assistant", "content": None, "tool_calls": [sent]}, result],
            messages + [{"role": "assistant", "content": None, "tool_calls": [parsed]}, result])


def greedy_ids(model, ids, max_new_tokens):
    import torch
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=50256)
    return out[0, len(ids):].tolist()


def template_ids(tokenizer, messages, **kwargs):
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, **kwargs)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


class ChatTemplateServeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="dschat-chat-template-")
        cls.directory = tokenizer_dir(cls.tmp.name, TEMPLATE)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def chat(self, server, **extra):
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        return client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0, **extra)

    def test_serve_prompts_with_the_models_jinja_template(self):
        text, ids = transformers_prompt(self.directory, MESSAGES)
        self.assertTrue(text.startswith("<|endoftext|><|system|>\nBe brief.<|endoftext|>\n<|user|>\nWhat is"), text)
        with ServedModels(models=[f"tiny={TINY_MODEL}"], tokenizer=self.directory) as server:
            answer = self.chat(server)
            streamed = list(self.chat(server, stream=True))
            log = server.log()
        self.assertIn(f"chat template: {self.directory / 'tokenizer_config.json'}", log)
        self.assertEqual(answer.usage.prompt_tokens, len(ids))  # no extra bos: the template writes its own
        # The reply is the greedy continuation of exactly that prompt, not trimmed.
        out = subprocess.run([CLI, "generate", "--model", str(TINY_MODEL), "--tokenizer", str(self.directory),
                              "--device", "cpu", "--prompt", text, "--max-new-tokens", "8"],
                             check=True, capture_output=True, text=True).stdout
        self.assertEqual(answer.choices[0].message.content, out[:-1])
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in streamed), answer.choices[0].message.content)

    def test_serve_a_qwen2_model_with_its_chatml_template_equals_transformers(self):
        """A family beyond OPT/LLaMA served end to end: a tiny random Qwen2 (q/k/v biases, GQA, untied
        head) with Qwen2.5's own chat template; the reply is transformers' greedy continuation."""
        import torch
        from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
        template = (pathlib.Path(__file__).resolve().parents[1] / "fixtures/chat_templates/qwen2.5.jinja").read_text()
        with tempfile.TemporaryDirectory(prefix="dschat-qwen2-serve-") as tmp:
            directory = tokenizer_dir(tmp, template)
            torch.manual_seed(0)
            config = Qwen2Config(vocab_size=50257, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                 tie_word_embeddings=False, bos_token_id=50256, eos_token_id=50256)
            model = Qwen2ForCausalLM(config).eval()
            model.save_pretrained(directory, safe_serialization=True)
            ids = AutoTokenizer.from_pretrained(str(directory)).apply_chat_template(
                MESSAGES, tokenize=True, add_generation_prompt=True)
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
            with torch.no_grad():
                greedy = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                        max_new_tokens=8, do_sample=False, eos_token_id=50256, pad_token_id=50256)
            expected = AutoTokenizer.from_pretrained(str(directory)).decode(greedy[0, len(ids):],
                                                                            skip_special_tokens=True)
            with ServedModels(models=[f"tiny={directory}"], tokenizer=directory) as server:
                answer = self.chat(server)
                log = server.log()
        self.assertIn(f"chat template: {directory / 'tokenizer_config.json'}", log)
        self.assertEqual(answer.usage.prompt_tokens, len(ids))
        self.assertTrue(expected)  # a random model's 8 tokens: never empty, so the comparison has teeth
        self.assertEqual(answer.choices[0].message.content, expected)

    def test_tool_calls_from_a_scripted_model(self):
        """Tools end to end with Qwen2.5's template: the prompt lists the tools as transformers'
        apply_chat_template does (same token count), and a reply holding a <tool_call> block comes
        back as OpenAI's tool_calls, whole and streamed. The model is a one-layer GPT-2 whose blocks
        are zeroed and whose position embeddings point at a script's tokens, so its greedy reply at
        that prompt length is the script (checked with transformers' generate first)."""
        from transformers import AutoTokenizer
        template = (pathlib.Path(__file__).resolve().parents[1] / "fixtures/chat_templates/qwen2.5.jinja").read_text()
        tools = [{"type": "function", "function": {
            "name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                           "required": ["city"]}}}]
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        script_text = ('Checking.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
                       '"celsius"}}\n</tool_call>')
        with tempfile.TemporaryDirectory(prefix="dschat-tools-serve-") as tmp:
            directory = tokenizer_dir(tmp, template)
            tokenizer = AutoTokenizer.from_pretrained(str(directory))
            ids = template_ids(tokenizer, messages, tools=tools)
            script = tokenizer(script_text)["input_ids"] + [50256]
            model = scripted_gpt2(directory, {len(ids): script})
            self.assertEqual(greedy_ids(model, ids, len(script) + 4), script, "the scripted model does not follow it")
            with ServedModels(models=[f"tools={directory}"], tokenizer=directory) as server:
                client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
                ask = dict(model="tools", messages=messages, tools=tools, max_tokens=len(script) + 4, temperature=0)
                answer = client.chat.completions.create(**ask)
                chunks = list(client.chat.completions.create(**ask, stream=True))
                # The next turn: the call and its result, rendered as transformers renders them.
                call = answer.choices[0].message.tool_calls[0]
                turns, hf_turns = after_the_call(messages, call)
                follow_up = client.chat.completions.create(**dict(ask, messages=turns, max_tokens=2))
                plain = client.chat.completions.create(**dict(ask, tool_choice="none", max_tokens=2))
            follow_up_ids = template_ids(tokenizer, hf_turns, tools=tools)
            no_tools_ids = template_ids(tokenizer, messages)

        self.assertEqual(answer.usage.prompt_tokens, len(ids))
        choice = answer.choices[0]
        self.assertEqual(choice.finish_reason, "tool_calls")
        self.assertEqual(choice.message.content, "Checking.")
        self.assertEqual(len(choice.message.tool_calls), 1)
        self.assertEqual(call.type, "function")
        self.assertEqual(call.function.name, "get_weather")
        self.assertEqual(json.loads(call.function.arguments), {"city": "Paris", "unit": "celsius"})
        self.assertTrue(call.id.startswith("call_"), call.id)
        # Streamed: the content before the tag, then the call (with its index), then the reason.
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(content, "Checking.")
        streamed_calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        self.assertEqual(len(streamed_calls), 1)
        self.assertEqual(streamed_calls[0].index, 0)
        self.assertEqual(streamed_calls[0].function.name, "get_weather")
        self.assertEqual(json.loads(streamed_calls[0].function.arguments), {"city": "Paris", "unit": "celsius"})
        self.assertEqual([c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason],
                         ["tool_calls"])
        self.assertEqual(follow_up.usage.prompt_tokens, len(follow_up_ids))
        self.assertEqual(plain.usage.prompt_tokens, len(no_tools_ids))  # tool_choice "none": no tools offered
        self.assertIsNone(plain.choices[0].message.tool_calls)

    def serve_a_scripted_call(self, template_name, reply_text, special_tokens=()):
        """Serves a scripted model (scripted_gpt2) with fixtures/chat_templates/`template_name`
        whose greedy reply to a weather question with one tool is the tokens of `reply_text`
        (each of `special_tokens` written in it becomes that added token) then eos; asks it whole
        and streamed, then the next turn with the call and its result. Checks the prompt lengths
        against transformers' apply_chat_template and that the call, whole and streamed, is
        get_weather(city="Paris") with no content. Returns the answer's call."""
        from transformers import AutoTokenizer
        template = (pathlib.Path(__file__).resolve().parents[1] / "fixtures/chat_templates" / template_name).read_text()
        tools = [{"type": "function", "function": {
            "name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        with tempfile.TemporaryDirectory(prefix="dschat-scripted-call-") as tmp:
            directory = tokenizer_dir(tmp, template, special_tokens=special_tokens)
            tokenizer = AutoTokenizer.from_pretrained(str(directory))
            ids = template_ids(tokenizer, messages, tools=tools)
            script = tokenizer(reply_text)["input_ids"] + [50256]
            self.assertEqual(script.count(50257), len(special_tokens))  # the tag is one special token
            model = scripted_gpt2(directory, {len(ids): script}, vocab_size=50257 + len(special_tokens))
            self.assertEqual(greedy_ids(model, ids, len(script) + 4), script, "the scripted model does not follow it")
            with ServedModels(models=[f"scripted={directory}"], tokenizer=directory) as server:
                client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
                ask = dict(model="scripted", messages=messages, tools=tools, max_tokens=len(script) + 4, temperature=0)
                answer = client.chat.completions.create(**ask)
                chunks = list(client.chat.completions.create(**ask, stream=True))
                call = answer.choices[0].message.tool_calls[0]
                turns, hf_turns = after_the_call(messages, call)
                follow_up = client.chat.completions.create(**dict(ask, messages=turns, max_tokens=2))
            follow_up_ids = template_ids(tokenizer, hf_turns, tools=tools)
        self.assertEqual(answer.usage.prompt_tokens, len(ids))
        self.assertEqual(answer.choices[0].finish_reason, "tool_calls")
        self.assertIsNone(answer.choices[0].message.content)
        self.assertEqual(len(answer.choices[0].message.tool_calls), 1)
        self.assertEqual((call.function.name, json.loads(call.function.arguments)), ("get_weather", {"city": "Paris"}))
        streamed_calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        self.assertEqual([(tc.index, tc.function.name, json.loads(tc.function.arguments)) for tc in streamed_calls],
                         [(0, "get_weather", {"city": "Paris"})])
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in chunks if c.choices), "")
        self.assertEqual(follow_up.usage.prompt_tokens, len(follow_up_ids))
        return call

    def test_mistral_tool_calls_from_a_scripted_model(self):
        """Tools with Mistral v0.3's template, whose tokenizer makes [TOOL_CALLS] a special token
        (here added to the GPT-2 files as id 50257): a "[TOOL_CALLS] [...]" reply comes back as
        tool_calls, whole and streamed, its id 9 letters and digits (Mistral's template refuses
        any other in the next turn, which renders as transformers renders it)."""
        call = self.serve_a_scripted_call(
            "mistral-v0.3.jinja", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]',
            special_tokens=["[TOOL_CALLS]"])
        self.assertRegex(call.id, r"^[A-Za-z0-9]{9}$")

    def test_llama_tool_calls_from_a_scripted_model(self):
        """Tools with LLaMA 3.1's template (the tools in the first user turn): a reply that is
        {"name", "parameters"} comes back as tool_calls with no content, whole and streamed."""
        call = self.serve_a_scripted_call("llama3.1-instruct.jinja",
                                          '{"name": "get_weather", "parameters": {"city": "Paris"}}')
        self.assertTrue(call.id.startswith("call_"), call.id)

    def test_json_mode_keeps_the_reply_one_object(self):
        """response_format json_object on a scripted model (scripted_gpt2) with two prompts: one
        whose script is a JSON object (the reply is that object, untouched), one whose script
        starts with prose (without JSON mode the reply is the prose; with it, an object starts); a
        schema whose pattern has a backreference is a 400 naming the pattern's key path."""
        template = (pathlib.Path(__file__).resolve().parents[1] / "fixtures/chat_templates/qwen2.5.jinja").read_text()
        ask_object = [{"role": "user", "content": "Weather as JSON."}]
        ask_prose = [{"role": "user", "content": "The weather in Paris today, please, as a JSON object with the "
                                                 "city and the temperature in degrees, and nothing else at all."}]
        object_text = '{"city": "Paris", "temp": 21, "sky": ["clear", null]}'
        prose_text = 'Sure! {"ok": true}'
        with tempfile.TemporaryDirectory(prefix="dschat-json-serve-") as tmp:
            directory = tokenizer_dir(tmp, template)
            two_scripted_prompts(directory, [ask_object, ask_prose], [object_text, prose_text])
            with ServedModels(models=[f"json={directory}"], tokenizer=directory) as server:
                client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
                json_mode = {"type": "json_object"}
                ask = dict(model="json", max_tokens=24, temperature=0)
                as_object = client.chat.completions.create(messages=ask_object, response_format=json_mode, **ask)
                streamed = list(client.chat.completions.create(messages=ask_object, response_format=json_mode,
                                                               stream=True, **ask))
                free = client.chat.completions.create(messages=ask_prose, **ask)
                constrained = client.chat.completions.create(messages=ask_prose, response_format=json_mode, **ask)
                with self.assertRaises(openai.BadRequestError) as caught:
                    client.chat.completions.create(messages=ask_object, response_format={
                        "type": "json_schema", "json_schema": {"name": "w", "schema": {
                            "type": "object", "properties": {"zip": {"type": "string", "pattern": "^(a)\\1$"}}}}},
                        **ask)
        self.assertEqual(as_object.choices[0].message.content, object_text)
        self.assertEqual(as_object.choices[0].finish_reason, "stop")
        self.assertEqual(json.loads(as_object.choices[0].message.content)["city"], "Paris")
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in streamed if c.choices), object_text)
        self.assertEqual(free.choices[0].message.content, prose_text)
        text = constrained.choices[0].message.content
        self.assertTrue(text.lstrip().startswith("{"), text)
        if constrained.choices[0].finish_reason == "stop":
            self.assertIsInstance(json.loads(text), dict)
        self.assertEqual(caught.exception.body["param"], "response_format.json_schema.schema.properties.zip.pattern")

    def test_json_schema_replies_validate_with_jsonschema(self):
        """response_format json_schema and tool_choice "required" on the bundled random tiny OPT,
        sampled: every reply that ends by itself ("stop") is JSON that the `jsonschema` package
        validates against the request's schema (keys in the schema's order), every forced call's
        arguments validate against its tool's parameters, and the same requests without the schema
        are not JSON at all (the constraint did the work). tool_choice "auto" with this model's
        format (DeepSpeed-Chat's, no tool calls) is a 400 naming tools."""
        import jsonschema
        schema = {"type": "object", "properties": {
            "color": {"enum": ["red", "green", "blue"]}, "count": {"type": "integer"}, "ok": {"type": "boolean"},
            "sizes": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
            "note": {"type": ["null", "boolean"]}},
            "required": ["color", "count", "ok"], "additionalProperties": False}
        tools = [{"type": "function", "function": {"name": "set_light", "parameters": {
                     "type": "object", "properties": {"on": {"type": "boolean"}, "level": {"enum": [1, 2, 3]}},
                     "required": ["on"]}}},
                 {"type": "function", "function": {"name": "reset"}}]
        response_format = {"type": "json_schema", "json_schema": {"name": "light", "strict": True, "schema": schema}}
        ask = dict(model="tiny", messages=MESSAGES, max_tokens=96, temperature=1.0, n=8)
        with ServedModels(models=[f"tiny={TINY_MODEL}"]) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
            shaped = [c for seed in (1, 2) for c in client.chat.completions.create(
                response_format=response_format, seed=seed, **ask).choices]
            free = client.chat.completions.create(seed=1, **ask).choices
            forced = [c for seed in (1, 2) for c in client.chat.completions.create(
                tools=tools, tool_choice="required", seed=seed, **ask).choices]
            # DeepSpeed-Chat's format shows no tool calls: "auto" has nothing to read them by.
            with self.assertRaises(openai.BadRequestError) as no_format:
                client.chat.completions.create(tools=tools, seed=1, **ask)
        self.assertEqual(no_format.exception.body["param"], "tools")
        self.assertIn("tool_choice \"required\" or a named function works with any model",
                      no_format.exception.body["message"])
        stopped = [c for c in shaped if c.finish_reason == "stop"]
        self.assertGreaterEqual(len(stopped), 4, [c.message.content for c in shaped])
        for choice in stopped:
            value = json.loads(choice.message.content)
            jsonschema.validate(value, schema)
            order = list(schema["properties"])
            self.assertEqual(list(value), sorted(value, key=order.index), choice.message.content)
        for choice in shaped:  # cut short by max_tokens: still the start of an object
            self.assertTrue(choice.message.content.lstrip().startswith("{"), choice.message.content)
        for choice in free:
            with self.assertRaises(ValueError):
                json.loads(choice.message.content)
        called = [c for c in forced if c.finish_reason == "tool_calls"]
        self.assertGreaterEqual(len(called), 4, [c.message.content for c in forced])
        parameters = {"set_light": tools[0]["function"]["parameters"], "reset": {"type": "object", "properties": {},
                                                                                 "additionalProperties": False}}
        for choice in called:
            self.assertIsNone(choice.message.content)
            self.assertTrue(choice.message.tool_calls)
            for call in choice.message.tool_calls:
                self.assertTrue(call.id.startswith("call_"), call.id)
                jsonschema.validate(json.loads(call.function.arguments), parameters[call.function.name])
        for choice in forced:
            if choice.finish_reason == "length":
                self.assertIsNone(choice.message.tool_calls)
                self.assertTrue(choice.message.content.lstrip().startswith("["), choice.message.content)

    def test_schema_keywords_replies_validate_with_jsonschema_formats(self):
        """A schema as Pydantic writes constrained fields (pattern, format, minLength/maxLength,
        integer and number bounds, multipleOf, a tuple's prefixItems) on the bundled random tiny OPT, sampled: every reply that stops validates
        with the `jsonschema` package, its FormatChecker included (date, uuid and ipv4 are the
        formats it checks with the standard library alone), and bounds that the model's own
        sampling would miss hold. A format dschat does not follow is a 400 naming its key path."""
        import jsonschema
        schema = {"type": "object", "properties": {
            "zip": {"type": "string", "pattern": "^[0-9]{5}(-[0-9]{4})?$"},
            "day": {"type": "string", "format": "date"},
            "id": {"type": "string", "format": "uuid"},
            "ip": {"type": "string", "format": "ipv4"},
            "n": {"type": "integer", "minimum": 10, "exclusiveMaximum": 100, "multipleOf": 5},
            "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "tag": {"type": "string", "minLength": 1, "maxLength": 4},
            "at": {"type": "string", "format": "date-time"},
            "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string", "maxLength": 3}],
                     "minItems": 2, "maxItems": 2},
            # Pydantic's HttpUrl, with maxLength 48 for its 2083 so that a random model's path ends
            "url": {"type": "string", "format": "uri", "minLength": 1, "maxLength": 48}},
            "required": ["zip", "day", "id", "ip", "n", "score", "tag", "at", "pair", "url"],
            "additionalProperties": False}
        response_format = {"type": "json_schema", "json_schema": {"name": "record", "schema": schema}}
        bad_format = {"type": "json_schema", "json_schema": {"name": "host", "schema": {
            "type": "object", "properties": {"host": {"type": "string", "format": "hostname"}}}}}
        ask = dict(model="tiny", messages=MESSAGES, max_tokens=230, temperature=1.0, n=8)
        with ServedModels(models=[f"tiny={TINY_MODEL}"]) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
            shaped = client.chat.completions.create(response_format=response_format, seed=3, **ask).choices
            with self.assertRaises(openai.BadRequestError) as refused:
                client.chat.completions.create(response_format=bad_format, seed=3, **ask)
        self.assertEqual(refused.exception.body["param"],
                         "response_format.json_schema.schema.properties.host.format")
        stopped = [c for c in shaped if c.finish_reason == "stop"]
        self.assertGreaterEqual(len(stopped), 4, [c.message.content for c in shaped])
        checker = jsonschema.FormatChecker()
        for choice in stopped:
            value = json.loads(choice.message.content)
            jsonschema.validate(value, schema, format_checker=checker)
            self.assertTrue(10 <= value["n"] < 100 and value["n"] % 5 == 0 and 0 < value["score"] <= 1 and
                            1 <= len(value["tag"]) <= 4, choice.message.content)
            url = urllib.parse.urlsplit(value["url"])  # jsonschema checks uri only with rfc3987 installed
            self.assertTrue(url.scheme in ("http", "https", "ftp") and url.hostname, value["url"])

    def test_named_and_required_tool_choice_from_a_scripted_model(self):
        """A named tool_choice and "required" with Qwen2.5's template (the tools are in the prompt,
        as transformers renders them): a scripted model (scripted_gpt2) whose reply is the call's
        JSON comes back as tool_calls, whole and streamed; a named call finishes with "stop" (as
        OpenAI answers), "required" with "tool_calls"."""
        template = (pathlib.Path(__file__).resolve().parents[1] / "fixtures/chat_templates/qwen2.5.jinja").read_text()
        tools = [{"type": "function", "function": {
            "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                  "required": ["city"]}}}]
        ask_named = [{"role": "user", "content": "Weather in Paris?"}]
        ask_required = [{"role": "user", "content": "What is the weather like in Paris today, in degrees, please?"}]
        named_text = '{"city": "Paris"}'
        required_text = '[{"name": "get_weather", "parameters": {"city": "Paris"}}]'
        with tempfile.TemporaryDirectory(prefix="dschat-forced-tools-") as tmp:
            directory = tokenizer_dir(tmp, template)
            named_ids, required_ids = two_scripted_prompts(directory, [ask_named, ask_required],
                                                           [named_text, required_text], tools=tools)
            with ServedModels(models=[f"tools={directory}"], tokenizer=directory) as server:
                client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
                ask = dict(model="tools", tools=tools, max_tokens=32, temperature=0)
                choice = {"type": "function", "function": {"name": "get_weather"}}
                named = client.chat.completions.create(messages=ask_named, tool_choice=choice, **ask)
                named_chunks = list(client.chat.completions.create(messages=ask_named, tool_choice=choice,
                                                                   stream=True, **ask))
                required = client.chat.completions.create(messages=ask_required, tool_choice="required", **ask)
        self.assertEqual(named.usage.prompt_tokens, len(named_ids))
        self.assertEqual(required.usage.prompt_tokens, len(required_ids))
        for answer, reason in ((named, "stop"), (required, "tool_calls")):
            message = answer.choices[0].message
            self.assertEqual(answer.choices[0].finish_reason, reason)
            self.assertIsNone(message.content)
            self.assertEqual(len(message.tool_calls), 1)
            self.assertEqual(message.tool_calls[0].function.name, "get_weather")
            self.assertEqual(json.loads(message.tool_calls[0].function.arguments), {"city": "Paris"})
        streamed_calls = [tc for c in named_chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        self.assertEqual([(tc.index, tc.function.name, json.loads(tc.function.arguments)) for tc in streamed_calls],
                         [(0, "get_weather", {"city": "Paris"})])
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in named_chunks if c.choices), "")
        self.assertEqual([c.choices[0].finish_reason for c in named_chunks if c.choices and c.choices[0].finish_reason],
                         ["stop"])

    def test_deepspeed_flag_brings_back_human_assistant(self):
        from transformers import GPT2TokenizerFast
        deepspeed = "Be brief.\n\n Human:   What is the capital of France? \n Assistant: "
        count = len(GPT2TokenizerFast.from_pretrained(str(TOKENIZER))(deepspeed)["input_ids"])
        with ServedModels(models=[f"tiny={TINY_MODEL}"], tokenizer=self.directory,
                          extra_args=["--chat-template", "deepspeed"]) as server:
            answer = self.chat(server)
            log = server.log()
        self.assertEqual(answer.usage.prompt_tokens, count)
        self.assertIn("chat template: DeepSpeed-Chat's Human:/Assistant: format", log)

    def test_chat_cli_uses_the_template_and_refuses_what_it_cannot_render(self):
        run = subprocess.run([CLI, "chat", "--model", str(TINY_MODEL), "--tokenizer", str(self.directory), "--device",
                              "cpu", "--prompt", "hello", "--max-new-tokens", "4"], capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn(f"chat template from {self.directory / 'tokenizer_config.json'}", run.stderr)
        self.assertTrue(run.stdout.startswith("Assistant: "), run.stdout)
        with tempfile.TemporaryDirectory() as other:
            broken = tokenizer_dir(other, "{% macro turn(m) %}{{ m.content }}{% endmacro %}"
                                          "{% for m in messages %}{{ turn(m) }}{% endfor %}")
            run = subprocess.run([CLI, "chat", "--model", str(TINY_MODEL), "--tokenizer", str(broken), "--device", "cpu",
                                  "--prompt", "hello"], capture_output=True, text=True)
            self.assertEqual(run.returncode, 1, run.stderr)
            self.assertIn(f"{broken / 'tokenizer_config.json'}:1:4: '{{% macro %}}' is not supported", run.stderr)
            # --chat-template deepspeed does not even read it.
            run = subprocess.run([CLI, "chat", "--model", str(TINY_MODEL), "--tokenizer", str(broken), "--device", "cpu",
                                  "--prompt", "hello", "--max-new-tokens", "2", "--chat-template", "deepspeed"],
                                 capture_output=True, text=True)
            self.assertEqual(run.returncode, 0, run.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
