"""Issue 36: ``/v1/generate`` takes chat messages and applies the model's own chat template; here through a model
added from a GGUF file (its blocks stored in their GGUF types) and served by two span servers in-process."""

from __future__ import annotations

import httpx
import pytest
from transformers import AutoTokenizer

from node.compute.reference import local_generate
from node.models.convert import add_model
from node.models.lookup import model_dir_of

from ..models.synth_gguf import write_llama_gguf
from .conftest import LiveSwarm

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who wrote Hamlet?"}]


@pytest.fixture(scope="module")
def chat_swarm(tmp_path_factory):
    d = tmp_path_factory.mktemp("chat")
    src = write_llama_gguf(d / "chat.gguf", blocks=4, hidden=256, ffn=512, heads=4, kv_heads=2, type_name="Q4_K")
    model_dir = model_dir_of(add_model(src, d / "cache").name, d / "cache")
    s = LiveSwarm(d / "swarm", model_dir, spans=[(0, 2), (2, 4), (0, 4)]).start()
    try:
        yield s, model_dir
    finally:
        s.stop()


def test_messages_go_through_the_models_chat_template_and_generate_as_one_process(chat_swarm):
    live, model_dir = chat_swarm
    r = httpx.post(f"{live.api}/v1/generate", json={"messages": CHAT, "max_new_tokens": 4}, headers=live.auth,
                   timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    want = AutoTokenizer.from_pretrained(str(model_dir)).apply_chat_template(CHAT, add_generation_prompt=True,
                                                                             tokenize=True)
    want = list(want["input_ids"] if hasattr(want, "keys") else want)
    assert body["prompt_ids"] == want
    text = AutoTokenizer.from_pretrained(str(model_dir)).decode(want)
    assert text.startswith("<|system|>Be brief.\n<|user|>Who wrote Hamlet?\n") and text.endswith("<|assistant|>")
    assert body["tokens"] == local_generate(model_dir, want, 4)
    assert len(body["receipts"]) >= 1


def test_one_prompt_form_at_a_time_and_bad_chats_are_refused(chat_swarm):
    live, _ = chat_swarm
    post = lambda body: httpx.post(f"{live.api}/v1/generate", json=body, headers=live.auth, timeout=60)  # noqa: E731
    both = post({"messages": CHAT, "prompt": "hi", "max_new_tokens": 2})
    assert both.status_code == 400 and "exactly one of prompt, prompt_ids or messages" in both.text
    assert post({"messages": [], "max_new_tokens": 2}).status_code == 422
    assert post({"messages": [{"role": "robot", "content": "x"}], "max_new_tokens": 2}).status_code == 422
    assert httpx.post(f"{live.api}/v1/generate", json={"messages": CHAT}, timeout=30).status_code == 401  # no token
