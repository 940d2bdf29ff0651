"""Target-labelled text: labels of text the target did not write come from its own greedy tokens."""

from __future__ import annotations

import torch

from dflash_core import DFlashDrafter, Target, run
from dflash_core.training.objective import DrafterTrainer, block_layout, default_gamma, greedy_path_labels


def test_labels_stop_where_the_text_leaves_the_greedy_path():
    ids = torch.tensor([5, 6, 7, 8, 9, 10, 11, 12])
    # greedy[t] is the target's next token after t; the text agrees except after t = 2 and t = 5.
    greedy = torch.tensor([6, 7, 0, 9, 10, 0, 12, 13])
    labels, valid = greedy_path_labels(ids, greedy, torch.tensor([0, 1, 2, 6]), 4)
    assert labels.tolist() == [
        [6, 7, 0],  # tokens 1 and 2 are what greedy decoding writes, so slots 2 and 3 are known
        [7, 0, -100],  # token 3 (8) is not greedy[2] (0): after it greedy decoding is elsewhere
        [0, -100, -100],  # slot 1 is always the target's own next token
        [12, 13, -100],  # the last position's next token is known; past the end nothing is
    ]
    assert valid.tolist() == (labels >= 0).tolist()


def test_on_the_targets_own_output_the_labels_are_the_data():
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (20,))
    greedy = torch.cat([ids[1:], torch.tensor([7])])  # the text is the greedy path
    anchors = torch.tensor([3, 9, 14])
    labels, valid = greedy_path_labels(ids, greedy, anchors, 5)
    _, _, data_labels, data_valid = block_layout(anchors, len(ids), 5, 99, ids)
    assert torch.equal(labels, data_labels) and torch.equal(valid, data_valid)


def test_trainer_labels_text_with_the_targets_greedy_tokens(tiny_dirs, one_thread):
    target_dir, drafter_dir = tiny_dirs
    target = Target.from_pretrained(target_dir)
    drafter = DFlashDrafter.from_pretrained(drafter_dir)
    B, V = drafter.block_size, target.vocab_size
    trainer = DrafterTrainer(target, drafter, B, default_gamma(B))
    prompt = target.tokenizer.apply_chat_template([{"role": "user", "content": "Hi there"}],
                                                  add_generation_prompt=True, tokenize=True, return_dict=False)
    own = run(target, list(prompt), None, max_new_tokens=24).output_ids
    ids = torch.tensor(list(prompt) + list(own))
    anchors = torch.arange(len(prompt), len(ids) - B)  # blocks that end inside the sequence
    with torch.no_grad():
        data = trainer.forward(ids, anchors, dense=True)
        labelled = trainer.forward(ids, anchors, dense=True, target_labels=True)
    # The target's own greedy output: its labels are the data's, and so is the loss.
    assert torch.equal(data.labels, labelled.labels)
    torch.testing.assert_close(data.loss, labelled.loss)
    # Text it did not write: slot 1 is its argmax after the anchor; later slots only on its path.
    torch.manual_seed(2)
    text = torch.cat([torch.tensor(list(prompt)), torch.randint(4, V - 1, (24,))])
    with torch.no_grad():
        out = trainer.forward(text, anchors, dense=True, target_labels=True)
        argmax = target.model(input_ids=text[None]).logits[0].argmax(-1)
    assert out.labels[:, 0].tolist() == argmax[anchors].tolist()
    assert (out.labels[:, 1:] == -100).any() and torch.isfinite(out.loss)
    with torch.no_grad():
        unlabelled = trainer.forward(text, anchors, dense=True)  # the text's own next tokens instead
    assert not torch.equal(unlabelled.labels, out.labels)
