"""Training's evaluation (`python -m dflash_core.training.evaluate`): tau per prompt set and category
from the target's cached greedy answers, one JSON line per drafter."""

import json

from dflash_core.training.evaluate import main


def test_evaluate_scores_each_drafter_per_set_and_category(tiny_dirs, tmp_path, capsys):
    target_dir, drafter_dir = tiny_dirs
    args = [str(drafter_dir), str(drafter_dir), "--target", str(target_dir), "--sets", "natural",
            "--num-prompts", "3", "--max-new-tokens", "6", "--block-size", "4", "--cache-dir", str(tmp_path)]
    main(args)
    lines = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [r["drafter"] for r in lines] == [str(drafter_dir)] * 2 and all(r["block_size"] == 4 for r in lines)
    natural = lines[0]["natural"]
    assert 1.0 <= natural["all"] <= 4.0 and set(natural) > {"all"}
    assert lines[1] == lines[0]  # the same drafter on the same answers scores the same
    cached = list(tmp_path.glob("responses-natural-3-6.json"))
    assert len(cached) == 1 and len(json.loads(cached[0].read_text())) == 3
    written = cached[0].stat().st_mtime_ns
    main(args)  # the second run reads the cached answers and writes nothing
    assert [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()] == lines
    assert cached[0].stat().st_mtime_ns == written
