"""The benchmark runs every method on the same prompts and ends with one JSON line."""

import json

import torch

from dflash_core.bench import main


def test_bench_reports_headline_figures(tiny_dirs, tmp_path, capsys):
    target_dir, drafter_dir = tiny_dirs
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["What is 2+3?", "def add(a, b):", "Once upon"]))
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # so that the flag, not the environment, is what makes it 1
    try:
        assert main([
            "--target", str(target_dir), "--drafter", str(drafter_dir), "--prompts", str(prompts),
            "--num-prompts", "2", "--max-new-tokens", "12", "--block-sizes", "8,4", "--threads", "1",
        ]) == 0
    finally:
        torch.set_num_threads(before)
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["num_prompts"] == 2 and result["block_size"] == 8 and result["threads"] == 1
    assert result["identical"] == 1.0 and result["per_block_size"]["4"]["identical"] == 1.0
    assert result["tau"] >= 1.0 and len(result["per_position_acceptance"]) == 7
    for key in ("speedup", "dflash_tok_s", "plain_tok_s", "speedup_prompt_lookup", "speedup_hf_generate"):
        assert result[key] > 0
    assert any("DFlash block 4" in line for line in lines)
