"""A race of a vLLM server's DFlash against its plain decoding: the app's race and panes, remote lanes.

`python app.py --vllm-url URL [--vllm-plain-url URL2]` adds a pair of kind `vllm` (or app/pairs/pairs.json
names one, with `vllm_url` and `vllm_plain_url`): URL serves the target with DFlash speculation,
URL2 the same target plain (vLLM 0.32.0 sets speculation per server, not per request;
`scripts/serve_vllm.sh` starts both). `VllmRaceSession` has `RaceSession`'s interface, so the race,
frames and report are the local ones; its lanes are `dflash_core.vllm.client` streams, which both
decode at once on their servers and are timed by wall clock from here.

What the panes show of a remote engine is what vLLM reports: the tokens, and per verify step how
many drafts were accepted (from `--per-request-spec-decode-metrics detailed`). Rejected drafts,
probabilities and the draft / verify split are not reported, so the draft strip, the top-k hover
boxes and the lossless verdict of this engine's target are absent; the outputs are compared
token by token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from dflash_core.vllm import ServedModel, VllmServerError, plain_url_of, served_model, stream

from .interleave import Snapshot, race
from .report import race_report
from .request import RaceRequest
from .session import RaceResult, single_token_text
from .tokens import TokenPieces

WHAT_IS_NOT_REPORTED = (
    "Served by vLLM: times are wall seconds from this app, both servers decoding at once. Colours come "
    "from vLLM's per-step acceptance record (while streaming, from its chunks, one per verify step). "
    "vLLM does not report rejected drafts, probabilities or the draft / verify split: the draft strip shows "
    "accepted drafts only, "
    "no top-k, no lossless check against this engine's target (the outputs are compared token by token)."
)


_SERVERS: dict[tuple[str, str], VllmServers] = {}


def servers_of(spec) -> VllmServers:
    """The servers of a `vllm` pair (a `PairSpec`), one object per pair of URLs."""
    key = (spec.vllm_url, spec.vllm_plain_url or plain_url_of(spec.vllm_url))
    if key not in _SERVERS:
        _SERVERS[key] = VllmServers(*key)
    return _SERVERS[key]


class VllmServers:
    """The two servers of a `vllm` pair, checked on first use: both serve the same model."""

    def __init__(self, dflash_url: str, plain_url: str):
        self.urls = {"dflash": dflash_url, "plain": plain_url}
        self.models: dict[str, ServedModel] | None = None
        self.tokenizer = None
        self.block_size = 1

    def connect(self) -> dict[str, ServedModel]:
        """Both servers' model, the tokenizer and the DFlash block; raises VllmServerError naming what is wrong."""
        models = {lane: served_model(url) for lane, url in self.urls.items()}
        if models["dflash"].name != models["plain"].name:
            raise VllmServerError(f"the two servers serve different models: {models['dflash'].name} at "
                                  f"{models['dflash'].url}, {models['plain'].name} at {models['plain'].url}")
        if self.tokenizer is None:
            self.tokenizer = _tokenizer(models["dflash"])
        self.models = models
        return models

    def status(self) -> str:
        """The pair's status line: both servers answering, or why not."""
        try:
            models = self.connect()
        except VllmServerError as exc:
            return f"⚠ **vLLM servers not ready:** {exc}"
        return (f"✓ vLLM servers ready: **{models['dflash'].name}** with DFlash at {models['dflash'].url}, plain at "
                f"{models['plain'].url}. {WHAT_IS_NOT_REPORTED}")


def _tokenizer(model: ServedModel):
    # The panes decode token ids to text as for a local race; a loopback server's model directory
    # is on this machine.
    from transformers import AutoTokenizer

    if not model.root or not Path(model.root).is_dir():
        raise VllmServerError(f"{model.url} serves {model.name} from {model.root!r}, which is not a directory on "
                              "this machine: the app decodes token ids with the served model's tokenizer")
    return AutoTokenizer.from_pretrained(model.root)


class VllmRaceSession:
    """One race of a vLLM pair on one prompt, with `RaceSession`'s `snapshots`, `result`, `pieces`, `text_of`, `last`."""

    def __init__(self, servers: VllmServers, req: RaceRequest):
        self.servers, self.prompt = servers, req.prompt
        self.max_new_tokens, self.sampling = req.max_new_tokens, req.sampling
        self.models = servers.connect()
        self.block_size = req.block_size
        self.pieces = {lane: TokenPieces(servers.tokenizer) for lane in ("dflash", "plain")}
        self.text_of = single_token_text(servers.tokenizer)
        self.last: Snapshot | None = None

    def snapshots(self, stop: Callable[[], bool] | None = None, control=None) -> Iterator[Snapshot]:
        s = self.sampling
        common = {"max_new_tokens": self.max_new_tokens, "temperature": s.temperature, "top_p": s.top_p,
                  "seed": s.seed if s.temperature > 0 else None}
        # Both requests go out now, so the servers decode side by side.
        dflash = stream(self.models["dflash"], self.prompt, block_size=self.block_size, **common)
        plain = stream(self.models["plain"], self.prompt, block_size=1, **common)
        run = control.reset() if control is not None else None  # this run's pause and wall-clock budgets start now
        try:
            for self.last in race({"dflash": dflash, "plain": plain}, block_sizes={"dflash": self.block_size},
                                  stop=stop or (lambda: False), control=control):
                yield self.last
        finally:
            if control is not None:
                control.done(run)

    def result(self) -> RaceResult | None:
        how = "stopped" if self.last.stopped else "running"
        summaries = {name: view.as_summary(how) for name, view in self.last.lanes.items()}
        if any(summary is None for summary in summaries.values()):
            return None
        d, p = summaries["dflash"], summaries["plain"]
        report = race_report(d, p, self.sampling.temperature, self.block_size, None, stopped=self.last.stopped)
        trace = {"format": "vllm-race", "servers": {lane: m.url for lane, m in self.models.items()},
                 "model": self.models["dflash"].name, "prompt": self.prompt, "report": report.to_dict(),
                 "runs": {name: summary.to_trace() for name, summary in summaries.items()},
                 "pieces": {name: self.pieces[name].extend(s.output_ids) for name, s in summaries.items()}}
        return RaceResult(summaries, None, report, lambda: trace)


