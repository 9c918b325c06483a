"""examples/serve end to end: keel-serve streams to the openai Python client
through both endpoints, its greedy text equals keel-generate's own decode
of the same model, batching leaves every request's text unchanged, bad
requests, departed clients and a queued request that leaves all get a clear
answer or a clean release of their pages, and the API behaves as clients
expect (unique ids, reproducible seeds, unimplemented fields refused by
name). After every scenario the allocator's count is checked: every page is
free once nothing runs. Most scenarios serve the small random Llama of
make_test_model.py (WORK_DIR/model); the last serves SmolLM2-135M-Instruct
itself to the openai client, chat and completions, and compares its text
with keel-generate's.

  serve_test.py KEEL_SERVE KEEL_GENERATE WORK_DIR SMOLLM2_DIR
"""

import atexit
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import openai

serve, generate, work, smollm2 = sys.argv[1:5]
os.chdir(work)
PROMPT = "The GNU General Public License is "
MODEL = "test-llama"


def reference(model, prompt, max_tokens, chat=False):
    """keel-generate's greedy text: one sequence, prefill then decode."""
    out = subprocess.run([generate, "--model", model, "--max-tokens", str(max_tokens),
                          "--json", "reference.json", *(["--chat"] if chat else []), prompt],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    with open("reference.json") as f:
        return json.load(f)[0]["text"]


class Server:
    def __init__(self, *args, model="model", name=MODEL):
        if os.path.exists("port"):
            os.remove("port")
        self.proc = subprocess.Popen([serve, "--model", model, "--model-name", name,
                                      "--port-file", "port", *args])
        # A failed assertion must not leave the server running: it would
        # hold ctest's output pipe open until the test's timeout.
        atexit.register(self.proc.kill)
        deadline = time.time() + 60
        while not os.path.exists("port"):
            assert self.proc.poll() is None, "keel-serve exited before it listened"
            assert time.time() < deadline, "keel-serve did not listen within 60 s"
            time.sleep(0.05)
        self.port = int(open("port").read())
        self.url = f"http://127.0.0.1:{self.port}"

    def stats(self):
        with urllib.request.urlopen(self.url + "/keel/stats", timeout=10) as r:
            return json.load(r)

    def assert_pages_back(self, scenario):
        deadline = time.time() + 20
        while True:
            s = self.stats()
            if s["running"] == 0 and s["waiting"] == 0:
                break
            assert time.time() < deadline, f"{scenario}: requests still running: {s}"
            time.sleep(0.02)
        assert s["pages_free"] == s["pages_total"], f"{scenario}: pages lost: {s}"
        assert s["failed_steps"] == 0, f"{scenario}: {s}"
        print(f"ok {scenario}: {s['pages_free']} of {s['pages_total']} pages free")

    def post(self, body, raw=None):
        data = raw if raw is not None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + "/v1/completions", data=data,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=30)
        assert code == 0, f"keel-serve exited {code} (non-zero: pages not all free at stop)"


def open_stream(server, max_tokens):
    """A raw streaming request; returns the socket once the first token arrived."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens,
                       "stream": True, "ignore_eos": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return s


def read_until(s, marker):
    got = b""
    while marker not in got:
        chunk = s.recv(4096)
        assert chunk, "connection closed early"
        got += chunk
    return got


server = Server("--max-batch", "4", "--pages", "128", "--max-model-len", "512")
client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)

# 1. The openai client streams; the text is keel-generate's own decode.
expected = reference("model", PROMPT, 64)
chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=64,
                                        temperature=0, stream=True,
                                        stream_options={"include_usage": True}))
text = "".join(c.choices[0].text for c in chunks if c.choices)
assert text == expected, f"served {text!r}\nkeel-generate {expected!r}"
assert chunks[-1].usage.completion_tokens == 64, chunks[-1]
assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
server.assert_pages_back("openai client stream")

# 2. Not streamed: the same text, with usage.
r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=64, temperature=0)
assert r.choices[0].text == text and r.usage.prompt_tokens == chunks[-1].usage.prompt_tokens, r
server.assert_pages_back("openai client, one body")

# 3. Eight at once (more than --max-batch: some queue) with prompts of
# different lengths: each text equals the same request made alone.
prompts = [PROMPT[i:] for i in range(0, 32, 4)]
alone = [client.completions.create(model=MODEL, prompt=p, max_tokens=24 + i,
                                   temperature=0).choices[0].text
         for i, p in enumerate(prompts)]
together = [None] * len(prompts)


def one(i):
    stream = client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=24 + i,
                                       temperature=0, stream=True)
    together[i] = "".join(c.choices[0].text for c in stream if c.choices)


threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
for t in threads:
    t.start()
for t in threads:
    t.join(timeout=120)
assert together == alone, f"batched {together}\nalone {alone}"
server.assert_pages_back("eight concurrent streams")

# 4. Stop strings end the text before them.
r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=64, temperature=0,
                              stop=[text[10:13]])
assert r.choices[0].text == text[:text.find(text[10:13])] and r.choices[0].finish_reason == "stop", r
server.assert_pages_back("stop string")

# Nucleus sampling that keeps only the most probable token is greedy,
# whatever the temperature and seed.
r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=64, temperature=1.5,
                              top_p=1e-9, seed=7)
assert r.choices[0].text == text, r
server.assert_pages_back("top_p keeping one token")

# 5. Errors the client types, without retrying.
for kwargs, error, scenario in [
        ({"model": "gpt-4"}, openai.NotFoundError, "unknown model"),
        ({"max_tokens": 600}, openai.BadRequestError, "longer than the context"),
        ({"prompt": ""}, openai.BadRequestError, "empty prompt"),
        ({"n": 2}, openai.BadRequestError, "n = 2"),
        ({"temperature": 3}, openai.BadRequestError, "temperature 3"),
        ({"top_p": 0}, openai.BadRequestError, "top_p 0")]:
    args = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, **kwargs}
    try:
        client.completions.create(**args)
        raise AssertionError(f"{scenario}: no error")
    except error as e:
        assert e.body and e.body.get("message"), (scenario, e.body)
    server.assert_pages_back(scenario)

# 6. Bodies no client library would send.
for raw, status, scenario in [(b"{not json", 400, "malformed JSON"),
                              (b"[1, 2]", 400, "not an object"),
                              (b'{"model": "test-llama", "prompt": "\\u0004"}', 400,
                               "a prompt of bytes without a token"),
                              (b'{"model": "test-llama", "prompt": [99999]}', 400,
                               "token id out of range"),
                              (b'{"model": "test-llama", "prompt": "a", "stream_options": {}}', 400,
                               "stream_options without stream"),
                              (b"x" * (2 << 20), 413, "a 2 MiB body")]:
    code, body = server.post(None, raw=raw)
    assert code == status, (scenario, code, body)
    if status == 400:
        assert body["error"]["message"] and body["error"]["code"] == 400, (scenario, body)
    server.assert_pages_back(scenario)

# 7. A client that leaves mid-stream: its request stops (long before its
# 400 tokens) and its pages return.
before = server.stats()["tokens_generated"]
s = open_stream(server, 400)
read_until(s, b"data: ")
s.close()
server.assert_pages_back("client left mid-stream")
assert server.stats()["tokens_generated"] - before < 300, server.stats()

# 8. A client that leaves while queued behind a full batch.
busy = [open_stream(server, 400) for _ in range(4)]
for b in busy:
    read_until(b, b"data: ")
queued = open_stream(server, 400)
deadline = time.time() + 20
while server.stats()["waiting"] != 1:
    assert time.time() < deadline, f"the fifth request never queued: {server.stats()}"
    time.sleep(0.02)
queued.close()
for b in busy:
    b.close()
server.assert_pages_back("client left while queued")

# 9. A client that leaves before the first byte of a non-streamed reply.
s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 400,
                   "ignore_eos": True}).encode()
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          + b"Content-Length: %d\r\n\r\n" % len(body) + body)
before = server.stats()["tokens_generated"]
time.sleep(0.1)
s.close()
server.assert_pages_back("client left before a non-streamed reply")
assert server.stats()["tokens_generated"] - before < 300, server.stats()

# 10. What clients expect of the API.
# Ids are unique (random, not addresses that repeat).
ids = {client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1).id
       for _ in range(50)}
assert len(ids) == 50 and all(re.fullmatch(r"cmpl-[0-9a-f]{32}", i) for i in ids), ids
# A seed, 0 included, repeats its sample; no seed draws a fresh one.
def sampled(**seed):
    return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=32,
                                     temperature=1, **seed).choices[0].text
for seed in (0, 1):
    assert sampled(seed=seed) == sampled(seed=seed), f"seed {seed} did not repeat"
assert sampled(seed=0) != sampled(seed=1), "seeds 0 and 1 drew the same 32 characters"
assert sampled() != sampled(), "two unseeded requests drew the same 32 characters"
# Fields the server does not implement are refused by name, unless they hold
# the value that means "off"; unknown fields too.
for field, value in [("frequency_penalty", 0.5), ("presence_penalty", 1), ("top_k", 5),
                     ("echo", "yes"), ("logprobs", 1), ("best_of", 2), ("suffix", "x"),
                     ("logit_bias", {"1": 5}), ("max_completion_tokens", 3)]:
    code, body = server.post({"model": MODEL, "prompt": PROMPT, field: value})
    assert code == 400 and body["error"]["param"] == field, (field, code, body)
for field, value in [("frequency_penalty", 0), ("presence_penalty", 0), ("echo", False),
                     ("n", 1), ("logprobs", None), ("user", "someone")]:
    code, body = server.post({"model": MODEL, "prompt": PROMPT, "max_tokens": 2, field: value})
    assert code == 200, (field, value, code, body)
# Each error names the parameter at fault.
for body, param, words in [({"prompt": PROMPT * 100}, "prompt", "context length"),
                           ({"prompt": [1.5]}, "prompt", "integers"),
                           ({"prompt": PROMPT, "seed": 1.5}, "seed", "integer"),
                           ({"prompt": PROMPT, "max_tokens": 510}, "max_tokens", "context length")]:
    code, reply = server.post({"model": MODEL, **body})
    assert code == 400 and reply["error"]["param"] == param and words in reply["error"]["message"], \
        (body, reply)
server.assert_pages_back("the API clients expect")

# Chat completions: the openai client streams a conversation rendered with
# the chat template; the deltas add up to the text of the same request not
# streamed, and the ids are chat's.
messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi! ¿Qué tal? 👋"},
            {"role": "assistant", "content": "Fine."}, {"role": "user", "content": "日本語で?"}]
whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)
assert whole.id.startswith("chatcmpl-") and whole.object == "chat.completion", whole
assert whole.choices[0].message.role == "assistant", whole
chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24,
                                             temperature=0, stream=True,
                                             stream_options={"include_usage": True}))
deltas = [c.choices[0].delta for c in chunks if c.choices]
assert deltas[0].role == "assistant", deltas[0]
assert "".join(d.content or "" for d in deltas) == whole.choices[0].message.content, chunks
assert chunks[-1].usage.total_tokens == whole.usage.total_tokens, (chunks[-1], whole.usage)
for bad, param in [({"messages": []}, "messages"),
                   ({"messages": [{"role": "tool", "content": "x"}]}, "messages"),
                   ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
                   ({"messages": messages, "tools": [{"type": "function"}]}, "tools"),
                   ({"messages": messages, "prompt": "x"}, "prompt")]:
    req = urllib.request.Request(server.url + "/v1/chat/completions",
                                 data=json.dumps({"model": MODEL, **bad}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=60)
        raise AssertionError(f"chat {bad}: no error")
    except urllib.error.HTTPError as e:
        body = json.loads(e.read())
        assert e.code == 400 and body["error"]["param"] == param, (bad, e.code, body)
server.assert_pages_back("chat completions")

server.stop()
print("ok SIGTERM: keel-serve stopped with every page free")

# 11. A cache that cannot hold one sequence of the context is refused at start.
bad = subprocess.run([serve, "--model", "model", "--pages", "2", "--max-model-len", "512"],
                     capture_output=True, text=True, timeout=60)
assert bad.returncode == 2 and "cannot hold one sequence" in bad.stderr, bad
bad = subprocess.run([serve, "--model", "/nonexistent"], capture_output=True, text=True, timeout=60)
assert bad.returncode == 2 and "/nonexistent" in bad.stderr, bad
print("ok refused configurations")

# 12. SmolLM2-135M-Instruct itself, to the openai client, through both
# endpoints: the same greedy text as keel-generate's decode.
server = Server("--threads", "2", model=smollm2, name="smollm2")
client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
question = "What is the capital of France?"
answer = reference(smollm2, question, 32, chat=True)
chunks = client.chat.completions.create(model="smollm2", temperature=0, max_tokens=32, stream=True,
                                        messages=[{"role": "user", "content": question}])
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
assert text == answer and "Paris" in text, f"served {text!r}\nkeel-generate {answer!r}"
prose = "The quick brown fox jumps over the lazy dog. The dog"
expected = reference(smollm2, prose, 24)
text = client.completions.create(model="smollm2", prompt=prose, max_tokens=24,
                                 temperature=0).choices[0].text
assert text == expected, f"served {text!r}\nkeel-generate {expected!r}"
server.assert_pages_back("SmolLM2, chat and completions")
server.stop()
print(f"ok SmolLM2 served: {question!r} -> {answer!r}")
