"""The target's cache, and its exact rollback after partial acceptance for every kind of layer.

A verify forward appends a whole block; only the accepted prefix may stay. Each kind of layer goes
back in its own way (`TargetCache.crop`):
- full attention: transformers drops the last positions (a static layer only moves its length back);
- sliding-window attention (gpt-oss, gemma4): transformers' past recording
  (`Cache.activate_past_recording`) keeps what a forward pushed out of the window until `crop`
  drops the rejected positions and trims the window back;
- gated delta-net linear attention (Qwen3.5, Qwen3.5-MoE, Qwen3-Next): the convolution state goes
  back the same way; the recurrent state, which no crop can undo, is kept before and after every
  position of each forward, and the one at the accepted length is put back. From transformers 5.25
  the library keeps them itself (`activate_past_recording(recurrent_states_to_keep=n)`, restored
  by `crop`); before it, `RecurrentStates` keeps them and copies the accepted one back;
- attention sinks (gpt-oss) are weights, not state, and KV-sharing layers (gemma4) cache nothing.
A target forward still runs once per cycle: accepted tokens never go through the target again.
After a verified draft tree (`tree.py`) a full-attention cache keeps the walked path instead of a
prefix: `TargetCache.keep` moves its rows' keys and values into place.

The rollback runs just before the next forward, so several crops after one forward (as benchmarks
do) still go back exactly; on a target with more than full attention it can reach back to the
start of the last forward, not beyond. Any other kind of layer state fails at construction with a
`ConfigError` naming the architecture and the layer.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from contextvars import ContextVar

import torch
import transformers
from transformers import DynamicCache, StaticCache, cache_utils

from ..errors import ConfigError

FULL, SLIDING, LINEAR, NONE = "full attention", "sliding-window attention", "gated delta-net", "no cache"
# The functions a gated delta-net layer calls for its recurrence, looked up in its modeling module.
CHUNK_RULE, RECURRENT_RULE = "torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"


def library_keeps_recurrent_states() -> bool:
    """Whether transformers' past recording keeps per-position recurrent states (5.25 on).

    From 5.25 a gated delta-net layer under past recording asks the cache how many of a forward's
    last positions to run one at a time (`get_recurrent_states_to_keep`), keeps their states, and
    `crop` puts the accepted one back; a wrapper around its rules would then see only part of them.
    """
    activate = getattr(cache_utils.LinearAttentionCacheLayerMixin, "activate_past_recording", None)
    return activate is not None and "recurrent_states_to_keep" in inspect.signature(activate).parameters


def architecture(model) -> str:
    return f"{type(model).__name__} ({model.config.model_type})"


def layer_kinds(model) -> list[str]:
    """What each layer of the model's cache keeps, or a ConfigError for a kind that cannot roll back.

    Read from the layers of a fresh `DynamicCache`, which transformers builds from the config.
    """
    layers = DynamicCache(config=model.config).layers
    if not layers:  # no per-layer types: transformers adds plain full-attention layers as it goes
        return [FULL] * model.config.num_hidden_layers
    recurrent = gated_delta_nets(model)
    kinds = []
    for i, layer in enumerate(layers):
        if isinstance(layer, cache_utils.LinearAttentionCacheLayerMixin):
            if not isinstance(layer, cache_utils.CacheLayerMixin) and i in recurrent:
                kinds.append(LINEAR)
                continue
            raise ConfigError(
                f"{architecture(model)} is not supported: layer {i} ({layer_type(model, i)}) keeps a convolution or "
                "recurrent state that DFlash cannot roll back after a rejected draft (of such layers, only gated "
                "delta-net ones, as in Qwen3.5 and Qwen3-Next, keep their states per position)"
            )
        elif isinstance(layer, cache_utils.DynamicSlidingWindowLayer):
            kinds.append(SLIDING)
        elif type(layer) is cache_utils.DynamicLayer:
            kinds.append(FULL)
        elif type(layer).__name__ == "DummyLayer":
            kinds.append(NONE)
        else:
            raise ConfigError(
                f"{architecture(model)} is not supported: layer {i} ({layer_type(model, i)}) keeps its cache in a "
                f"{type(layer).__name__}, which DFlash cannot roll back after a rejected draft"
            )
        if kinds[-1] == SLIDING and not hasattr(layer, "activate_past_recording"):
            raise _no_past_recording(model, "sliding-window layers")
    if LINEAR in kinds and not hasattr(cache_utils.LinearAttentionCacheLayerMixin, "activate_past_recording"):
        raise _no_past_recording(model, "convolution states")
    return kinds


def _no_past_recording(model, what: str) -> ConfigError:
    return ConfigError(
        f"{architecture(model)} needs transformers' past-state recording (Cache.activate_past_recording) to roll "
        f"back its {what}; transformers {transformers.__version__} lacks it (5.17 and 5.24 have it)"
    )


def layer_type(model, i: int) -> str:
    types = getattr(model.config.get_text_config(), "layer_types", None)
    return types[i] if types and i < len(types) else "no layer_types"


def gated_delta_nets(model) -> dict[int, torch.nn.Module]:
    """The model's gated delta-net modules by layer index (their modeling module defines both rules)."""
    found = {}
    for module in model.modules():
        modeling = sys.modules.get(type(module).__module__)
        if (
            type(module).__name__.endswith("GatedDeltaNet")
            and isinstance(getattr(module, "layer_idx", None), int)
            and all(callable(getattr(modeling, name, None)) for name in (CHUNK_RULE, RECURRENT_RULE))
        ):
            found[module.layer_idx] = module
    return found


def crop_static(cache: StaticCache, count: int) -> None:
    """Move every static layer's length back by `count`; the next forward overwrites the stale slots.

    `StaticLayer.crop` exists only from transformers 5.24, while the pin allows 5.5; the length
    tensor it moves is there in every 5.x release.
    """
    for layer in cache.layers:
        layer.cumulative_length.sub_(count)


# The `RecurrentStates` whose forward is running, if any; the wrapped rules below consult it.
_RECORDING: ContextVar[RecurrentStates | None] = ContextVar("dflash_recurrent_states", default=None)


def _route_rules(modeling) -> None:
    """Make the gated delta rules of a modeling module defer to the recording forward, if any.

    Outside a recording forward (and for every other user of the module) they run unchanged. The
    module-level names are the only hook there is: a layer calls them by name from its forward.
    """
    if getattr(modeling, "_dflash_routed", False):
        return
    recurrent = getattr(modeling, RECURRENT_RULE)

    def routed(original):
        @functools.wraps(original)
        def rule(*args, **kwargs):
            recorder = _RECORDING.get()
            if recorder is None:
                return original(*args, **kwargs)
            return recorder.run(recurrent, *args, **kwargs)

        return rule

    for name in (CHUNK_RULE, RECURRENT_RULE):
        setattr(modeling, name, routed(getattr(modeling, name)))
    modeling._dflash_routed = True


class RecurrentStates:
    """The recurrent state of every gated delta-net layer before and after each position of a forward.

    While recording, a layer's recurrence runs one position at a time through the library's own
    recurrent rule, as plain decoding does, so a block's states are exactly those of one-token
    steps; the projections around it still run on the whole block at once.
    """

    def __init__(self, modules: dict[int, torch.nn.Module]):
        for module in modules.values():
            _route_rules(sys.modules[type(module).__module__])
        self._hooks = [module.register_forward_pre_hook(self._enter) for module in modules.values()]
        self.states: dict[int, list[torch.Tensor]] = {}
        self._layer: int | None = None

    def _enter(self, module, _args):
        # Another Target may wrap the same model (the app's plain side): only follow our own forward.
        if _RECORDING.get() is self:
            self._layer = module.layer_idx

    @contextlib.contextmanager
    def recording(self):
        self.states = {}
        token = _RECORDING.set(self)
        try:
            yield
        finally:
            _RECORDING.reset(token)
            self._layer = None

    def run(self, recurrent, query, key, value, *, g, beta, initial_state=None, output_final_state=False, **kwargs):
        """The gated delta rule over [batch, seq, heads, dim] inputs, one position at a time."""
        kwargs.pop("chunk_size", None)
        state = initial_state
        # The cache updates its state in place after the forward: the starting state needs a copy.
        states = [None if state is None else state.clone()]
        outputs = []
        for t in range(query.shape[1]):
            step = slice(t, t + 1)
            out, state = recurrent(
                query[:, step], key[:, step], value[:, step], g=g[:, step], beta=beta[:, step],
                initial_state=state, output_final_state=True, **kwargs,
            )
            outputs.append(out)
            states.append(state)
        self.states[self._layer] = states
        return torch.cat(outputs, dim=1), state if output_final_state else None

    def restore(self, cache, keep: int) -> None:
        """Put each layer's state back to where it was after the first `keep` positions of the forward."""
        for layer_id, states in self.states.items():
            held = cache.layers[layer_id].recurrent_states
            held = held[0] if isinstance(held, dict) else held
            if states[keep] is None:
                held.zero_()
            else:
                held.copy_(states[keep])


class TargetCache:
    """A target's cache for one run at a time: its transformers `Cache`, its length, and its rollback.

    static: transformers' preallocated `StaticCache` instead of a `DynamicCache`; it needs full
    attention in every layer (ConfigError otherwise). `reset` allocates it in chunks of `chunk`
    positions, up to the model's context.
    """

    def __init__(self, model, static: bool = False, chunk: int = 256):
        self.model = model
        self.static = static
        self.chunk = chunk
        self.kinds = layer_kinds(model)
        if static and set(self.kinds) != {FULL}:
            raise ConfigError(
                f"the static KV cache needs full attention in every layer, and {architecture(model)} has "
                f"{', '.join(sorted(set(self.kinds)))} layers: it can only roll back a full-attention layer by moving "
                "its length. Use the dynamic cache (no static_cache, no --static-cache)"
            )
        self.exact_anywhere = set(self.kinds) <= {FULL, NONE}  # may crop to any earlier length
        deltas = gated_delta_nets(model)
        linear = {i: deltas[i] for i, kind in enumerate(self.kinds) if kind == LINEAR}
        # Whether transformers keeps every position's recurrent state (5.25 on), or `RecurrentStates` does.
        self.library_states = bool(linear) and library_keeps_recurrent_states()
        self.recurrent = RecurrentStates(linear) if linear and not self.library_states else None
        self.cache = None
        self.length = 0  # positions decoding keeps
        self.capacity = 0
        self._held = 0  # positions the cache holds (more than `length` until the rollback runs)
        self._start = 0  # where the last forward began
        self._recorded = False  # whether the last forward kept what a rollback into it needs
        self._past = False  # whether transformers' past recording is on (dynamic caches, after the prefill)

    def reset(self, capacity: int | None = None) -> bool:
        """Empty the cache; True when new static buffers were allocated (graphs of the old ones are stale).

        A static cache holds `capacity` positions (default: the model's context), rounded up to the
        chunk; one that already holds that many is kept and overwritten.
        """
        held = self._held
        self.length = self._held = self._start = 0
        self._recorded = self._past = False
        if self.recurrent is not None:
            self.recurrent.states = {}
        if not self.static:
            self.cache = DynamicCache(config=self.model.config)
            return False
        limit = getattr(self.model.config, "max_position_embeddings", None) or self.chunk
        size = min(limit, -(-(capacity or limit) // self.chunk) * self.chunk)
        if isinstance(self.cache, StaticCache) and self.capacity >= size:
            crop_static(self.cache, held)
            return False
        self.cache, self.capacity = StaticCache(config=self.model.config, max_cache_len=size), size
        return True

    def crop(self, length: int) -> None:
        """Keep only the first `length` positions (the rollback itself runs before the next forward)."""
        if length > self.length or length < 0:
            raise ValueError(f"cannot crop the target cache to {length} positions: it holds {self.length}")
        if not self.exact_anywhere and length < (self._start if self._recorded else self._held):
            raise ValueError(
                f"cannot roll the target cache back to {length} positions: {architecture(self.model)} keeps layer "
                f"states that go back only to the start of the last forward after the prefill, here position "
                f"{self._start if self._recorded else self._held}"
            )
        self.length = length

    def describe(self) -> str:
        """The architecture and the kinds of its layers, as a sentence."""
        return f"{architecture(self.model)} has {', '.join(sorted(set(self.kinds)))} layers."

    def keep(self, start: int, rows: list[int]) -> None:
        """Keep the last forward's rows `rows` (offsets from `start`, increasing, 0 first) as positions
        `start`, `start + 1`, ...: a verified tree's accepted path, moved into place in every layer.

        Only where every cached layer is full attention: a row's keys and values are then its own,
        whatever rows sit beside it, and moving them is exact.
        """
        if not self.exact_anywhere:
            raise ConfigError(f"only full-attention caches can keep a tree's path: {self.describe()}")
        if start != self._start or not rows or rows[0] != 0 or start + rows[-1] >= self._held:
            raise ValueError(f"rows {rows} from {start} are not rows of the last forward ({self._start} to {self._held})")
        moved = [r for i, r in enumerate(rows) if r != i]
        if moved:
            source = torch.tensor([start + r for r in rows], device=self.model.device)
            for layer in self.cache.layers:
                if getattr(layer, "keys", None) is None or not layer.keys.numel():
                    continue  # a layer that caches nothing (KV sharing)
                for held in (layer.keys, layer.values):
                    held[:, :, start:start + len(rows)] = held.index_select(2, source)
        self.crop(start + len(rows))

    def _roll_back(self) -> None:
        extra = self._held - self.length
        if self.static:
            if extra:
                crop_static(self.cache, extra)
        elif extra or self._past:
            # With past recording, crop(0) still trims what the last forward pushed out of a window.
            self.cache.crop(-extra)
            if extra and self.recurrent is not None:
                self.recurrent.restore(self.cache, self.length - self._start)
        self._held = self.length

    @contextlib.contextmanager
    def forward(self, n: int):
        """Around a forward of `n` positions: the pending rollback before it, the recording of every
        position's state in it (after the prefill), the bookkeeping after it."""
        self._roll_back()
        if self._past and self.library_states:
            # All n positions, so that any accepted length of this forward can be put back.
            self.cache.activate_past_recording(recurrent_states_to_keep=n)
        recording = self._past and self.recurrent is not None
        with self.recurrent.recording() if recording else contextlib.nullcontext():
            yield
        self._start, self._recorded = self.length, self._past or self.exact_anywhere
        self.length = self._held = self._start + n
        if not (self.static or self.exact_anywhere or self._past):
            # Only after the prefill, as transformers' generate does: a prefill recorded past its
            # window or convolution would hold all of its positions at once.
            self.cache.activate_past_recording()
            self._past = True
