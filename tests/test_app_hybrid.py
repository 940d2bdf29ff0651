"""A hybrid target through the app: a tiny random Qwen3.5 target (three gated delta-net layers, then
full attention) with a released-format drafter, raced over HTTP through `compare` with gradio_client.

The drafter may propose only one token (a draft vocabulary of one), a token the target itself
emits, so some cycles accept a draft and reject the next: the target's recurrent, convolution and
attention states all roll back inside the app's race, which crashed there before they did.
"""

from __future__ import annotations

from collections import Counter

import pytest

gradio_client = pytest.importorskip("gradio_client")

from families import build_family_target  # noqa: E402
from serve import launch_app  # noqa: E402
from tiny import build_drafter  # noqa: E402

from dflash_core import Target, run  # noqa: E402
from dflash_core.loading.prompting import encode_prompt  # noqa: E402
from dflash_core.trace import validate_trace  # noqa: E402

PROMPT = "What is the capital of France?"
NEW_TOKENS = 32
BLOCK = 4


@pytest.fixture(scope="module")
def hybrid_app(tmp_path_factory, one_thread):
    root = tmp_path_factory.mktemp("qwen3_5")
    target_dir = build_family_target(root / "target", "qwen3_5", seed=3)
    target = Target.from_pretrained(target_dir)
    plain = run(target, encode_prompt(target.tokenizer, PROMPT), None, max_new_tokens=NEW_TOKENS).output_ids
    # The token the target emits most often after its first: every time it comes, a draft is accepted.
    token, _ = Counter(plain[1:]).most_common(1)[0]
    drafter_dir = build_drafter(root / "drafter", target_dir, draft_vocab=[token])
    demo, url = launch_app(target_dir, drafter_dir)
    yield url, plain
    demo.close()


def test_the_tiny_qwen3_5_pair_races_losslessly_through_compare_with_rollbacks(hybrid_app):
    url, plain = hybrid_app
    client = gradio_client.Client(url, verbose=False)
    result = client.predict(PROMPT, NEW_TOKENS, BLOCK, 0.0, 1.0, 0, api_name="/compare")
    summary = result[-2]
    assert summary["identical"] is True and summary["dflash_tokens"] == summary["plain_tokens"] > 8
    runs = validate_trace(result[-1])["runs"]
    out = runs["dflash"]["output_ids"]
    # Token for token; the app stops at the target's end-of-text token, the engine run above did not.
    assert out == runs["plain"]["output_ids"] == list(plain[: len(out)])
    accepted = [block["accepted"] for block in runs["dflash"]["blocks"]]
    # Partial acceptance: a draft kept and the next one rejected, so the verify forward's last
    # positions were rolled back in every kind of layer.
    assert any(0 < a < BLOCK - 1 for a in accepted), accepted
