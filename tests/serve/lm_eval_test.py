"""EleutherAI's lm-evaluation-harness (lm-eval, pinned in tools/setup.sh) against `dschat serve`.

lm-eval's `local-completions` model runs two tiny local tasks (tests/serve/lm_eval_tasks: a
generate_until task and a multiple_choice one, each a YAML file reading a JSON Lines file) against
the bundled tiny OPT served as "tiny", tokenizing through the server (tokenizer_backend=remote:
/tokenizer_info, /tokenize, /detokenize), once, as a user would run it:

    cd tests/serve/lm_eval_tasks
    python -m lm_eval run --model local-completions \
        --model_args model=tiny,base_url=http://127.0.0.1:PORT/v1/completions,tokenizer_backend=remote,num_concurrent=1,max_retries=1 \
        --include_path . --tasks dschat_tiny_gen,dschat_tiny_mc --log_samples --output_path OUT

Then, from its --log_samples output:
  - generate_until: each answer equals the server's greedy answer to a direct POST /v1/completions
    of the same prompt text (same max_tokens and stop strings), and exact_match equals the score
    recomputed from those answers;
  - multiple_choice: each choice's loglikelihood equals transformers' on the same model (fp32) within
    1e-4, the choices tokenized as lm-eval does, and acc / acc_norm equal those recomputed from
    transformers' loglikelihoods.

No network: HF_HUB_OFFLINE / HF_DATASETS_OFFLINE, caches in a temp dir, and a sitecustomize on
lm-eval's PYTHONPATH that refuses (and records) any connection or name lookup that is not loopback.

Run: .venv/bin/python tests/serve/lm_eval_test.py   (ctest: serve_lm_eval)
"""
import glob
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_fixture import ARTIFACTS, TINY_MODEL, TOKENIZER, ServedModels  # noqa: E402

import yaml  # noqa: E402  (PyYAML, a dependency of transformers and lm-eval)

TASKS_DIR = pathlib.Path(__file__).resolve().parent / "lm_eval_tasks"
GEN_TASK, MC_TASK = "dschat_tiny_gen", "dschat_tiny_mc"
LL_TOLERANCE = 1e-4
LM_EVAL_TIMEOUT_S = 300

# Loaded by lm-eval's interpreter (PYTHONPATH): any socket connection or name lookup that is not
# loopback is refused and appended to $LM_EVAL_TEST_NETWORK_LOG (a refusal lm-eval or a library
# swallows still shows there).
NETWORK_GUARD = textwrap.dedent('''
    import os, socket
    _LOOPBACK = {"127.0.0.1", "::1", "localhost"}
    _log = os.environ["LM_EVAL_TEST_NETWORK_LOG"]
    def _refuse(what):
        with open(_log, "a") as f:
            f.write(what + "\\n")
        raise OSError("lm_eval_test: network access refused: " + what)
    _getaddrinfo = socket.getaddrinfo
    def getaddrinfo(host, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else host
        if name is not None and name not in _LOOPBACK:
            _refuse("getaddrinfo %r" % (name,))
        return _getaddrinfo(host, *args, **kwargs)
    socket.getaddrinfo = getaddrinfo
    def _guard(method):
        def guarded(self, address):
            if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in _LOOPBACK:
                _refuse("connect %r" % (address,))
            return method(self, address)
        return guarded
    socket.socket.connect = _guard(socket.socket.connect)
    socket.socket.connect_ex = _guard(socket.socket.connect_ex)
''')


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def task_config(name):
    with open(TASKS_DIR / f"{name}.yaml", encoding="utf-8") as f:
        return yaml.safe_load(f)


def lm_eval_command(base_url, output_dir):
    """The lm-eval command line (run from TASKS_DIR: the YAML files' data_files are relative)."""
    model_args = (f"model=tiny,base_url={base_url}/v1/completions,tokenizer_backend=remote,"
                  "num_concurrent=1,max_retries=1")
    return [sys.executable, "-m", "lm_eval", "run", "--model", "local-completions", "--model_args", model_args,
            "--include_path", ".", "--tasks", f"{GEN_TASK},{MC_TASK}", "--log_samples",
            "--output_path", str(output_dir)]


def post_json(url, body):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def encode_pair(tokenize, context, continuation):
    """lm-eval's TemplateLM._encode_pair for a causal model (lm_eval/api/model.py): trailing
    whitespace of the context moves to the continuation; the continuation's tokens are those of
    context + continuation after the context's own tokens."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = tokenize(context + continuation)
    context_ids = tokenize(context)
    return context_ids, whole[len(context_ids):]


class LmEvalTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="dschat-lm-eval-")
        tmp = pathlib.Path(cls.tmp.name)
        cls.server = ServedModels(models=[f"tiny={TINY_MODEL}"]).__enter__()
        try:
            cls.tokenizer_info = cls.server.get_json("/tokenizer_info")
        except Exception as e:
            cls.server.stop()
            raise RuntimeError(f"dschat serve does not answer GET /tokenizer_info (needed by lm-eval's "
                               f"tokenizer_backend=remote): {e}") from e
        guard_dir = tmp / "guard"
        guard_dir.mkdir()
        (guard_dir / "sitecustomize.py").write_text(NETWORK_GUARD)
        cls.network_log = tmp / "network.log"
        cls.network_log.touch()
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_EVALUATE_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1", HF_HOME=str(tmp / "hf"), HF_DATASETS_CACHE=str(tmp / "hf" / "datasets"),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(guard_dir), os.environ.get("PYTHONPATH")])),
                   LM_EVAL_TEST_NETWORK_LOG=str(cls.network_log), TOKENIZERS_PARALLELISM="false",
                   OPENAI_API_KEY="")
        cls.output_dir = tmp / "out"
        command = lm_eval_command(cls.server.url, cls.output_dir)
        print("lm-eval:", " ".join(command), file=sys.stderr)
        try:
            run = subprocess.run(command, cwd=TASKS_DIR, env=env, capture_output=True, text=True,
                                 timeout=LM_EVAL_TIMEOUT_S)
            cls.direct = cls.direct_answers() if run.returncode == 0 else None
        finally:
            cls.server.stop()
        cls.lm_eval_log = run.stdout + run.stderr
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "lm_eval_test.log").write_text(cls.lm_eval_log + "\n--- dschat serve ---\n" + cls.server.log())
        if run.returncode != 0:
            raise RuntimeError(f"lm-eval exited {run.returncode}:\n{cls.lm_eval_log[-6000:]}\n"
                               f"--- dschat serve log ---\n{cls.server.log()[-3000:]}")
        results = glob.glob(str(cls.output_dir / "*" / "results_*.json"))
        assert len(results) == 1, results
        with open(results[0], encoding="utf-8") as f:
            cls.results = json.load(f)["results"]
        cls.samples = {}
        for task in (GEN_TASK, MC_TASK):
            files = glob.glob(str(cls.output_dir / "*" / f"samples_{task}_*.jsonl"))
            assert len(files) == 1, files
            cls.samples[task] = sorted(read_jsonl(files[0]), key=lambda s: s["doc_id"])

    @classmethod
    def gen_stop(cls):
        """The stop strings lm-eval sends: the task's `until` plus the server's EOS text (lm-eval's
        handle_stop_sequences adds the tokenizer's eos_token)."""
        stop = list(task_config(GEN_TASK)["generation_kwargs"]["until"])
        eos = cls.tokenizer_info.get("eos_token")
        if eos is not None and eos not in stop:
            stop.append(eos)
        return stop

    @classmethod
    def direct_answers(cls):
        """The server's answers to direct temperature-0 POSTs of the generate_until prompts."""
        max_tokens = task_config(GEN_TASK)["generation_kwargs"]["max_gen_toks"]
        return [post_json(cls.server.url + "/v1/completions",
                          {"model": "tiny", "prompt": doc["prompt"], "max_tokens": max_tokens, "temperature": 0,
                           "stop": cls.gen_stop()})["choices"][0]
                for doc in read_jsonl(TASKS_DIR / "gen.jsonl")]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_nothing_tried_the_network(self):
        self.assertEqual(self.network_log.read_text(), "", "lm-eval tried to reach beyond loopback")

    def test_generate_until_answers_are_the_servers_greedy_answers(self):
        """Each logged answer equals a direct temperature-0 POST of the same prompt text, with the
        max_tokens and stop strings lm-eval sends (the task's `until`, plus the server's EOS text, as
        lm-eval's handle_stop_sequences adds it); exact_match is the mean of answer == target."""
        docs = read_jsonl(TASKS_DIR / "gen.jsonl")
        stop, direct = self.gen_stop(), self.direct
        samples = self.samples[GEN_TASK]
        self.assertEqual(len(samples), len(docs))
        for doc, sample, answer in zip(docs, samples, direct):
            with self.subTest(prompt=doc["prompt"]):
                self.assertEqual(sample["arguments"]["gen_args_0"]["arg_0"], doc["prompt"])
                self.assertEqual(sample["resps"], [[answer["text"]]])
                self.assertEqual(sample["filtered_resps"], [answer["text"]])
                self.assertFalse(any(s in answer["text"] for s in stop), answer["text"])
                self.assertEqual(sample["exact_match"], float(answer["text"] == doc["target"]))
        # The stop strings ended some answers (the tiny model repeats " flask"), and the targets are
        # the model's greedy answers for half of the prompts (regenerate gen.jsonl if assets/tiny-opt changes).
        self.assertIn("stop", [answer["finish_reason"] for answer in direct])
        exact_match = sum(answer["text"] == doc["target"] for doc, answer in zip(docs, direct)) / len(docs)
        self.assertTrue(0 < exact_match < 1, [answer["text"] for answer in direct])
        self.assertAlmostEqual(self.results[GEN_TASK]["exact_match,none"], exact_match, places=12)

    def test_multiple_choice_matches_transformers(self):
        """Every choice's loglikelihood equals transformers' (fp32, the same token ids as lm-eval:
        the GPT-2 tokenizer without special tokens, lm-eval's context/continuation split) within
        1e-4; acc and acc_norm equal those recomputed from transformers' loglikelihoods."""
        import torch
        import transformers
        tokenizer = transformers.GPT2Tokenizer.from_pretrained(str(TOKENIZER))
        model = transformers.AutoModelForCausalLM.from_pretrained(str(TINY_MODEL), dtype=torch.float32).eval()

        def tokenize(text):
            return tokenizer(text, add_special_tokens=False)["input_ids"]

        docs = read_jsonl(TASKS_DIR / "mc.jsonl")
        delimiter = task_config(MC_TASK).get("target_delimiter", " ")
        samples = self.samples[MC_TASK]
        self.assertEqual(len(samples), len(docs))
        acc = acc_norm = 0.0
        worst = 0.0
        for doc, sample in zip(docs, samples):
            context, choices = doc["question"], doc["choices"]
            # --log_samples writes each (loglikelihood, is_greedy) as strings: ["-10.89…", "False"].
            lm_eval_lls = [float(resp[0][0]) for resp in sample["resps"]]
            lm_eval_greedy = [str(resp[0][1]) == "True" for resp in sample["resps"]]
            self.assertEqual(len(lm_eval_lls), len(choices))
            self.assertEqual([float(ll) for ll, _ in sample["filtered_resps"]], lm_eval_lls)
            reference = []
            for i, choice in enumerate(choices):
                continuation = delimiter + choice
                self.assertEqual(sample["arguments"][f"gen_args_{i}"], {"arg_0": context, "arg_1": continuation})
                context_ids, continuation_ids = encode_pair(tokenize, context, continuation)
                ids = context_ids + continuation_ids
                with torch.no_grad():
                    logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)
                ll = sum(float(logprobs[p - 1, ids[p]]) for p in range(len(context_ids), len(ids)))
                # lm-eval's is_greedy (from the server's top_logprobs), where no position is a near tie.
                top2 = [logprobs[p - 1].topk(2).values for p in range(len(context_ids), len(ids))]
                clear = all(float(v[0] - v[1]) > LL_TOLERANCE for v in top2)
                greedy = all(int(logprobs[p - 1].argmax()) == ids[p] for p in range(len(context_ids), len(ids)))
                reference.append(ll)
                with self.subTest(context=context, choice=choice):
                    self.assertTrue(math.isfinite(lm_eval_lls[i]))
                    self.assertLessEqual(abs(lm_eval_lls[i] - ll), LL_TOLERANCE, (lm_eval_lls[i], ll))
                    if clear:
                        self.assertEqual(lm_eval_greedy[i], greedy)
                worst = max(worst, abs(lm_eval_lls[i] - ll))
            pred = max(range(len(choices)), key=lambda i: reference[i])
            pred_norm = max(range(len(choices)), key=lambda i: reference[i] / len(choices[i]))
            acc += pred == doc["label"]
            acc_norm += pred_norm == doc["label"]
            self.assertEqual(sample["acc"], float(pred == doc["label"]))
            self.assertEqual(sample["acc_norm"], float(pred_norm == doc["label"]))
        print(f"multiple_choice: largest |lm-eval - transformers| loglikelihood difference {worst:.2e}", file=sys.stderr)
        self.assertAlmostEqual(self.results[MC_TASK]["acc,none"], acc / len(docs), places=12)
        self.assertAlmostEqual(self.results[MC_TASK]["acc_norm,none"], acc_norm / len(docs), places=12)


if __name__ == "__main__":
    unittest.main(verbosity=2)
