"""What one visitor may ask of a shared server: the bounds, their flags, and the checks of a request.

`Limits` holds the queue bound, how many races are computed at once, and the sizes a request may
have; `add_flags` / `from_args` expose them on the command line, `SPACE_LIMITS` are the defaults on
a shared Space. `check_request` turns the raw values a client sent (any type, any value) into one
`RaceRequest` or raises `ValueError` with a message for the visitor; `check_prompt_tokens` bounds the
prompt in tokens, after the chat template, by the flag and by the target's context.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass, fields

# block_size's bound before the pair is known, the one a recorded trace is held to: far above any
# drafter's trained size, which the engine checks once the pair has loaded (`serve/sessions.py`).
from dflash_core.trace import MAX_BLOCK_SIZE

from ..race.lanes import MAX_TREE_BUDGET, TREE_BUDGET
from ..race.request import RaceRequest
from ..race.thinking import check_thinking


@dataclass(frozen=True)
class Limits:
    concurrency: int = 1  # races computed at once; each holds its pair's caches, a CPU's cores
    max_queue: int = 16  # requests waiting beyond the running ones; more are told the server is busy
    max_new_tokens: int = 512
    # lanes x max_new_tokens: every lane decodes with the target, so an added lane costs a side of a
    # race more; four lanes at the most tokens, all eight at 256
    max_lane_tokens: int = 2048
    max_race_mb: int = 64  # megabytes of frames one race may stream; then it stops and says why
    max_prompt_tokens: int = 2048  # after the chat template
    max_prompt_chars: int = 16_000  # checked before tokenizing, so a huge paste costs nothing
    max_pause_s: int = 60  # seconds a race or replay may spend paused in all; then it ends, freeing the model
    max_race_s: int = 420  # wall seconds a race or replay may last from its start, pauses included
    replay_concurrency: int = 4  # replays played at once (they need no model, only a thread each)
    replay_queue: int = 8  # replays that may wait for one of those; more are told the server is busy
    max_replay_s: int = 300  # a replay lasting longer in real time is sped up to end within it
    per_visitor: int = 2  # requests one visitor (one address) may have waiting in each queue, races and replays
    upload_mb_per_hour: int = 100  # megabytes of uploads one visitor may send in an hour
    # requests to the queue's routes (joins, event streams, heartbeats) one visitor may send in a
    # minute, in a burst or spread out: a page sends 5 on loading and 2 per race
    queue_requests_per_min: int = 300
    # requests to the routes Gradio answers at once, outside the queue (Stop, Pause, Step, tab
    # switches, the status line's tick every 3 s while a pair compiles): a page without a model sends
    # 3 on loading
    direct_requests_per_min: int = 1200
    session_capacity: int = 200  # sessions whose last outputs Gradio keeps in memory (it drops the oldest)
    # Addresses of a reverse proxy whose X-Forwarded-For names the visitor ("": none; every visitor
    # is then the TCP peer, and behind a proxy all would share its bounds).
    trusted_proxy: str = ""

    def __post_init__(self):
        for f in fields(self):
            if isinstance(getattr(self, f.name), int) and getattr(self, f.name) < 1:
                raise ValueError(f"{f.name} must be at least 1, got {getattr(self, f.name)}")


# A ZeroGPU slice is shared by every visitor of the Space and each GPU call is bounded in time, so
# a Space serves shorter races and turns visitors away sooner than a machine of one's own.
SPACE_LIMITS = Limits(
    concurrency=1, max_queue=8, max_new_tokens=256, max_lane_tokens=1024, max_race_mb=32, max_prompt_tokens=1024, max_prompt_chars=8_000, replay_concurrency=2,
    replay_queue=4, max_replay_s=180, max_race_s=240, upload_mb_per_hour=60, session_capacity=100,
)

_FLAGS = {
    "concurrency": "races computed at the same time (default %(default)s; more than 1 only helps with several pairs on a GPU)",
    "max_queue": "requests that may wait for a free slot; beyond it a visitor is told the server is busy (default %(default)s)",
    "max_new_tokens": "largest max_new_tokens a request may ask for (default %(default)s)",
    "max_lane_tokens": "largest lanes x max_new_tokens a race may ask for, DFlash and plain decoding counted "
    "(default %(default)s)",
    "max_race_mb": "megabytes of frames one race may stream before it stops and says so (default %(default)s)",
    "max_prompt_tokens": "longest prompt in tokens after the chat template (default %(default)s)",
    "max_prompt_chars": "longest prompt in characters, checked before tokenizing (default %(default)s)",
    "max_pause_s": "seconds a race or replay may spend paused in all (no click renews them) before it ends and "
    "frees the model (default %(default)s)",
    "max_race_s": "wall seconds a race or replay may last from its start, pauses included (default %(default)s)",
    "replay_concurrency": "replays played at the same time (default %(default)s)",
    "replay_queue": "replays that may wait for a free replay slot; beyond it a visitor is told the server is busy "
    "(default %(default)s)",
    "max_replay_s": "longest a replay may last in real time; a longer recording is played faster (default %(default)s)",
    "per_visitor": "requests one visitor (one client address) may have waiting, in the race queue and in the replay "
    "line each (default %(default)s)",
    "upload_mb_per_hour": "megabytes of trace uploads one visitor may send per hour (default %(default)s)",
    "queue_requests_per_min": "requests to the queue's routes (joins, event streams, heartbeats) one visitor may send "
    "per minute, at once or spread out; past it they get HTTP 429 (default %(default)s)",
    "direct_requests_per_min": "requests to the routes answered outside the queue (the page's Stop, Pause, Step and "
    "tab switches, the REST run and api routes) one visitor may send per minute; past it they get HTTP 429 "
    "(default %(default)s)",
    "session_capacity": "browser sessions whose last outputs the server keeps in memory; the oldest are dropped "
    "(default %(default)s)",
    "trusted_proxy": "addresses (comma-separated, or *) of a reverse proxy in front of the app: a request from one "
    "counts as the visitor its X-Forwarded-For names, for every per-visitor bound (default: none)",
}


def add_flags(parser: argparse.ArgumentParser, defaults: Limits = Limits()) -> None:
    group = parser.add_argument_group("limits")
    for name, text in _FLAGS.items():
        default = getattr(defaults, name)
        group.add_argument("--" + name.replace("_", "-"), type=type(default), default=default, help=text)


def from_args(args: argparse.Namespace) -> Limits:
    return Limits(**{name: getattr(args, name) for name in _FLAGS})


_SURROGATE = re.compile("[\ud800-\udfff]")
SEED_MAX = 2**63 - 1  # torch.Generator.manual_seed takes a signed 64-bit seed


def check_request(limits: Limits, pair_id: str, prompt, max_new_tokens, block_size, temperature, top_p, seed,
                  lanes=None, thinking=None, tree_budget=None) -> RaceRequest:
    """The race request of the page's raw values, or ValueError naming the bad value and its bounds.
    What the pair can honour (block_size within its drafter's, the lanes it ships) its kind checks."""
    if not isinstance(prompt, str):
        raise ValueError(f"The prompt must be text, got {type(prompt).__name__}.")
    if not prompt.strip():
        raise ValueError("The prompt is empty: type a message or pick an example.")
    if len(prompt) > limits.max_prompt_chars:
        raise ValueError(f"The prompt has {len(prompt)} characters; the limit is {limits.max_prompt_chars}.")
    bad = _SURROGATE.search(prompt)
    if bad:
        raise ValueError(f"The prompt has an invalid character (a lone UTF-16 surrogate) at position {bad.start()}.")
    max_new_tokens = _whole(max_new_tokens, "max_new_tokens", 1, limits.max_new_tokens)
    block_size = _whole(block_size, "block_size", 1, None)
    if block_size > MAX_BLOCK_SIZE:
        raise ValueError(f"block_size must be at most {MAX_BLOCK_SIZE}, got {_shown(block_size)}.")
    seed = None if seed is None or seed == "" else _whole(seed, "seed", 0, SEED_MAX)
    from dflash_core import SamplingParams

    sampling = SamplingParams(
        temperature=_real(temperature, "temperature"), top_p=_real(top_p, "top_p"), seed=seed
    )  # its own checks name the ranges
    lanes = check_lanes(lanes)
    tree_budget = TREE_BUDGET if tree_budget is None or tree_budget == "" else _whole(
        tree_budget, "tree_budget", 1, MAX_TREE_BUDGET)
    if len(lanes) * max_new_tokens > limits.max_lane_tokens:
        raise ValueError(
            f"{len(lanes)} lanes x {max_new_tokens} new tokens is {len(lanes) * max_new_tokens} lane-tokens; this "
            f"server races at most {limits.max_lane_tokens} (--max-lane-tokens): fewer lanes or fewer tokens."
        )
    return RaceRequest(pair_id, prompt, max_new_tokens, block_size, sampling.temperature, sampling.top_p,
                       sampling.seed, lanes, check_thinking(thinking), tree_budget)


ADDED_LANES = ("scheduled", "tree", "dflash2", "fusion", "ar", "lookup")  # the lanes a visitor may add; DFlash and plain decoding always race


def check_lanes(lanes) -> tuple[str, ...]:
    """The lanes of a race, DFlash and plain decoding included, in the order they are shown; or
    ValueError naming the bad value. `lanes`: the ones added, a list of names (None: none)."""
    if lanes is None or lanes == "":
        lanes = []
    if isinstance(lanes, str):
        lanes = [lanes]
    if not isinstance(lanes, (list, tuple)) or not all(isinstance(name, str) for name in lanes):
        raise ValueError(f"lanes must be a list of lane names ({', '.join(ADDED_LANES)}), got {_shown(lanes)}.")
    unknown = [name for name in lanes if name not in ADDED_LANES]
    if unknown:
        raise ValueError(
            f"Unknown lane {unknown[0][:40]!r}: the lanes a race can add are {', '.join(ADDED_LANES)} "
            "(DFlash and plain decoding always race)."
        )
    return ("dflash", *(name for name in ADDED_LANES if name in lanes), "plain")


def check_prompt_tokens(num_tokens: int, limits: Limits, context: int | None) -> None:
    """ValueError when the templated prompt is longer than the flag allows or the target can hold."""
    over_flag = num_tokens > limits.max_prompt_tokens
    over_context = context is not None and num_tokens >= context
    if over_flag or over_context:
        where = f"; the target's context holds {context} positions" if context is not None else ""
        raise ValueError(
            f"The prompt is {num_tokens} tokens after the chat template; this server accepts at most "
            f"{limits.max_prompt_tokens} (--max-prompt-tokens){where}. Shorten the prompt."
        )


def _shown(value) -> str:
    """A number as a message quotes it: a huge integer by its digit count, never all 400 digits."""
    if isinstance(value, int) and abs(value) >= 10**18:
        return f"a {len(str(abs(value)))}-digit integer"
    return str(value)[:40]


def _real(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{name} must be a number, got {type(value).__name__}.")
    if isinstance(value, str) and len(value) > 400:  # float() of a huge digit string costs time
        raise ValueError(f"{name} must be a number, got a string of {len(value)} characters.")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {str(value)[:40]!r}.") from None
    except OverflowError:  # an int beyond any float
        raise ValueError(f"{name} must be a finite number, got {_shown(value)}.") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {number}.")
    return number


def _whole(value, name: str, low: int, high: int | None) -> int:
    bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
    if isinstance(value, int) and not isinstance(value, bool):  # exact: no trip through a float
        if value < low or (high is not None and value > high):
            raise ValueError(f"{name} must be {bounds}, got {_shown(value)}.")
        return value
    number = _real(value, name)
    if number != int(number):
        raise ValueError(f"{name} must be a whole number, got {value}.")
    number = int(number)
    if number < low or (high is not None and number > high):
        raise ValueError(f"{name} must be {bounds}, got {_shown(number)}.")
    return number
