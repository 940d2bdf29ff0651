"""Drafter training, apart from the decoding engine that it builds on.

- `prompts`: the prompt pool (packaged corpora, generated tasks, self-written user messages);
- `datagen`: the target's greedy answers to those prompts, written as shards;
- `regenerate`: a chat dataset's prompts (Hub or folder) answered by the target, through transformers,
  vLLM or a server, into the same shards;
- `text_data`: text the target did not write (offline corpora) as shards, for target-labelled training;
- `data`: shards as training sequences, the held-out split, the draft vocabulary;
- `objective`: what one step computes (anchors, block mask, loss, held-out tau);
- `drafter_init`: a new drafter's config and weights, or a warm one grown;
- `train`: the training loop and its CLI (`python -m dflash_core.training.train`), DDP or FSDP under torchrun;
- `config`: a run as one TOML file, checked, and the `train` command it stands for
  (`python -m dflash_core.training run CONFIG`, `__main__`);
- `evaluate`: drafters scored by tau as greedy decoding meets it (`python -m dflash_core.training.evaluate`).

The engine (`dflash_core`) never imports from here; of the benchmarks only `drafter-costs` does.
"""
