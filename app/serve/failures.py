"""What the app tells a visitor when loading a pair or a race fails: the engine's words for the
failure (`dflash_core.errors.user_message`), then what to try in this app."""

from __future__ import annotations

import html

import gradio as gr

from dflash_core.errors import failure_kind, user_message

ADVICE = {
    "out_of_memory": "Load one pair at a time, pick a smaller pair or dtype, or lower max_new_tokens.",
    "cuda": "If it repeats, restart the app: the GPU state may be broken.",
}


def failure_message(exc: BaseException, device=None) -> str:
    message = user_message(exc, device)
    advice = ADVICE.get(failure_kind(exc))
    return f"{message} {advice}" if advice else message


def visitor_error(message: str) -> gr.Error:
    """A `gr.Error` that shows `message` as text. Gradio renders an error's message as HTML (it
    strips scripts, but an <img> of any address still loads), and these messages quote what a
    visitor sent: a prompt character, a number, a field of an uploaded trace."""
    return gr.Error(html.escape(message, quote=False))
