"""Target adapter: what speculative decoding needs from any Hugging Face causal LM.

One forward with a KV cache that also returns the outputs of chosen decoder layers (the drafter's
features), the target's embedding and LM head (shared with the drafter), cache rollback after
partial acceptance, and a draft tree's forward under an ancestor mask (`forward_tree`, `keep_path`).
Works for decoder-only `AutoModelForCausalLM` models whose layers `target_cache.py` can roll back:
full attention (Llama, Qwen3, Qwen3-MoE), sliding windows and attention sinks (gpt-oss, gemma4),
gated delta-net hybrids (Qwen3.5, Qwen3.5-MoE, Qwen3-Next).
"""

from __future__ import annotations

import inspect
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

from ..errors import CheckpointError, ConfigError
from ..speed.batch_invariant import SUFFIX as ROWWISE
from ..speed.batch_invariant import is_batch_invariant, make_batch_invariant
from ..speed.compiled_steps import CompiledBackend
from ..speed.cpu_linear import pack_linears
from ..speed.cuda_graphs import StepGraphs
from ..speed.kernels import cpu_attention
from .attention import GROUPED_SDPA
from .hub import looks_like_path
from .target_cache import TargetCache


class LayerTaps:
    """One forward hook on each decoder layer of a model, shared by every Target over it: the
    outputs of the layers the running Target taps go to that Target.

    Dynamo guards the number of hooks on each module a compiled step calls. Hooks added and
    removed per Target and per run of taps would change those counts whenever another Target over
    the model (another lane of the app) tapped layers, and every compiled step would compile again;
    a hook per layer from the first Target on keeps them fixed, and a step traced for one Target
    serves every other Target with the same taps.
    """

    def __init__(self, layers):
        self.recording = None  # the Target whose forward runs now
        for layer_id, layer in enumerate(layers):
            layer.register_forward_hook(self._recorder(layer_id))

    @classmethod
    def of(cls, model, layers) -> LayerTaps:
        """The model's taps, made at the first Target over it."""
        if not isinstance(taps := model.__dict__.get("_dflash_layer_taps"), cls):
            taps = model.__dict__["_dflash_layer_taps"] = cls(layers)
        return taps

    def _recorder(self, layer_id: int):
        def record(_module, _inputs, output):
            target = self.recording
            # A flag per layer, not `layer_id in target.feature_layers`: dynamo makes the ints of a
            # tuple that changed between compiles symbolic, and the membership test then failed.
            if target is not None and target._tapped[layer_id]:
                target._taps[layer_id] = output[0] if isinstance(output, tuple) else output

        return record


def wants_batch_invariance(device: torch.device | str, dtype: torch.dtype) -> bool:
    """bfloat16 on CPU, where rounding differences between a block and one-token steps flip
    near-tied argmaxes; float32 keeps its fastest one-row matmul library (docs/benchmarks.md)."""
    return torch.device(device).type == "cpu" and dtype == torch.bfloat16


def default_attention(device: torch.device | str) -> str:
    """PyTorch SDPA everywhere, flash-attn installed or not.

    transformers' flash-attention path checks the position ids of every multi-token forward for
    packed sequences with a host sync in every layer (`_is_packed_sequence`), which would add one
    sync per layer to each verification; on CUDA in bf16, SDPA runs fused flash/memory-efficient
    kernels of its own. flash-attn still serves the drafter's attention (`fallbacks.py`).
    """
    del device  # the same answer on every device; kept so callers need not change
    return "sdpa"


def supported_attention(name: str, preferred: str) -> str:
    """`preferred`, or eager attention for a model class that lacks it (gpt-oss has no SDPA path:
    its attention sinks are an extra softmax column that only its eager and flex kernels add)."""
    config = AutoConfig.from_pretrained(name)
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    if preferred == "sdpa" and model_class is not None and not getattr(model_class, "_supports_sdpa", True):
        return "eager"
    return preferred


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(name: str):
    """The model's tokenizer, or None for a bare checkpoint (which still decodes from prompt ids)."""
    local = Path(name).expanduser()
    # transformers would otherwise build an empty default tokenizer from the model type alone.
    if local.is_dir() and not any((local / f).is_file() for f in TOKENIZER_FILES):
        return None
    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError, TypeError):
        return None


def _exact_gemms(compile_gemms: str | None) -> str:
    """The GEMMs of a batch-invariant target's compiled steps: `library`, the layers' own row-invariant
    calls (`batch_invariant.make_batch_invariant`); inductor's `template` GEMMs pick a kernel per shape."""
    if compile_gemms == "template":
        raise ConfigError("a batch-invariant target compiles with library GEMMs (compile_gemms='library'): "
                          "template GEMMs would compute a block's rows otherwise than its one-token steps")
    return "library"


# A static cache is allocated in multiples of this many positions, so runs of similar length reuse it.
STATIC_CHUNK = 256


class Target:
    """A causal LM with its own KV cache and feature taps on selected decoder layers.

    A model on transformers' `sdpa` attention is switched to `attention.GROUPED_SDPA`, which
    computes the same outputs without a copy of the cache per query head.

    static_cache: keep keys/values in transformers' preallocated `StaticCache` (written in place,
    rolled back by moving its length) instead of a `DynamicCache` that concatenates and slices
    tensors every cycle; the cache length is tracked on the host either way, so neither costs a sync.
    Needs full attention in every layer. Either cache rolls back exactly after a rejected draft,
    whatever the layers keep (`target_cache.py`); an architecture it cannot roll back raises a
    ConfigError here.
    cuda_graphs: replay the verify forward (and, in `generate`, the draft step) from CUDA graphs
    (`cuda_graphs.py`); needs `static_cache`. `graph_backend` replaces `torch.cuda.CUDAGraph` (tests).
    compiled: run the same steps through `torch.compile` instead (`compiled_steps.py`), on any device;
    needs `static_cache`. Plain decoding's one-token steps are such verify forwards too.
    compile_gemms: how a compiled CPU step runs its linears, `template` or `library`
    (`compiled_steps.py`); None: `DFLASH_COMPILE_GEMMS`, or `template`.
    steps_folder: compiled CPU steps of `library` GEMMs are saved there and a later process loads
    them instead of compiling them again (`saved_steps.py`); None: each process compiles its own.
    """

    def __init__(self, model, tokenizer=None, static_cache: bool = False, cuda_graphs: bool = False,
                 graph_backend=None, compiled: bool = False, compile_gemms: str | None = None,
                 steps_folder: str | Path | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.layers = model.get_decoder().layers
        self.static_cache = static_cache
        config = model.config
        if cuda_graphs and compiled:
            raise ConfigError("choose CUDA graphs or compiled steps, not both: each runs the same steps its own way")
        if compile_gemms is not None and not compiled:
            raise ConfigError(f"compile_gemms={compile_gemms!r} is for compiled steps (compiled=True)")
        if steps_folder is not None and not compiled:
            raise ConfigError(f"steps_folder={str(steps_folder)!r} is for compiled steps (compiled=True)")
        steps = "CUDA graphs" if cuda_graphs else "compiled steps" if compiled else None
        if steps and not static_cache:
            raise ConfigError(
                f"{steps[0].upper()}{steps[1:]} need the static KV cache (static_cache=True, --static-cache): "
                f"{'a graph replays' if cuda_graphs else 'a compiled step runs at'} fixed cache addresses and "
                "offsets, which a DynamicCache reallocates every cycle"
            )
        self.kv = TargetCache(model, static=static_cache, chunk=STATIC_CHUNK)
        if config._attn_implementation == "sdpa":
            model.set_attn_implementation(GROUPED_SDPA)  # the same outputs, without copying the cache per head
        # Our own causal mask (see `_causal_mask`) assumes full attention in every layer (which the
        # static cache requires) and an attention that takes a 4D mask as is.
        refusal = self.steps_refusal()
        self._own_mask = static_cache and refusal is None
        self.graphs = None
        if steps:
            if refusal:
                raise ConfigError(f"{steps[0].upper()}{steps[1:]} cannot run this target: {refusal}")
            exact = is_batch_invariant(model)
            if compiled and exact:
                compile_gemms = _exact_gemms(compile_gemms)
            backend = CompiledBackend(compile_gemms, exact_casts=exact, steps_folder=steps_folder) if compiled else None
            self.graphs = StepGraphs(backend or graph_backend)
        self.reset(STATIC_CHUNK)  # generate() resets to the length each run needs
        self._taps: dict[int, torch.Tensor] = {}
        self._layer_taps = LayerTaps.of(model, self.layers)
        self.tap_layers(())
        # transformers renamed `past_key_values` to `cache` during 5.x; accept either release.
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    @classmethod
    def from_pretrained(
        cls, path_or_id: str | Path, device="cpu", dtype=torch.float32, attn_implementation=None, batch_invariant=None,
        static_cache: bool = False, cuda_graphs: bool = False, compiled: bool = False, steps_folder=None,
    ):
        """batch_invariant: verify blocks bitwise as one-token steps (`batch_invariant.py`); None
        decides by `wants_batch_invariance`. static_cache, cuda_graphs, compiled, steps_folder: see the class."""
        name = str(path_or_id)
        if looks_like_path(name) and not Path(name).expanduser().is_dir():
            raise CheckpointError(f"target model directory not found: {name}")
        try:
            attention = attn_implementation or supported_attention(name, default_attention(device))
            model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, attn_implementation=attention)
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"could not load target {name!r}: {exc}") from exc
        model = model.to(device)
        if batch_invariant is None:
            batch_invariant = wants_batch_invariance(device, dtype)
        # A no-op off CPU; the target is frozen, so its weights pack once. Batch invariance fixes
        # the one-row library, so there is nothing to time.
        pack_linears(model, calibrate=not batch_invariant)
        if batch_invariant:
            make_batch_invariant(model)
        return cls(model, load_tokenizer(name), static_cache=static_cache, cuda_graphs=cuda_graphs, compiled=compiled,
                   steps_folder=steps_folder)

    # --- shapes and shared modules -------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.get_output_embeddings().weight.dtype

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids)

    @property
    def head(self) -> torch.nn.Module:
        """The LM head module (drafters borrow its weight)."""
        return self.model.get_output_embeddings()

    # --- feature taps ---------------------------------------------------------------------------
    def tap_layers(self, layer_ids) -> None:
        """Record the outputs of these decoder layers (0-based) on every forward."""
        self.feature_layers: tuple[int, ...] = tuple(layer_ids)
        self._tapped = tuple(i in self.feature_layers for i in range(len(self.layers)))

    # --- decoding -------------------------------------------------------------------------------
    @property
    def cache(self):
        """The transformers `Cache` of the current run."""
        return self.kv.cache

    @property
    def cache_length(self) -> int:
        return self.kv.length

    @property
    def _capacity(self) -> int:
        return self.kv.capacity

    def reset(self, capacity: int | None = None) -> None:
        """Empty the cache. A static cache is (re)allocated to hold `capacity` positions (default:
        the model's context), or kept, zeroed, when it already holds that many."""
        if self.kv.reset(capacity) and self.graphs is not None:
            self.graphs.clear()  # they write into the old buffers

    def crop(self, length: int) -> None:
        """Drop cached positions from `length` on (rejected draft tokens), in every kind of layer."""
        self.kv.crop(length)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, last_logits_only: bool = False):
        """Run `ids` ([1, n]) after the cached positions; return (logits [n or 1, V], features [1, n, k*h]).

        With CUDA graphs, a forward after the prefill replays the graph of its shape (a fresh key is
        captured first); its outputs are overwritten by the next replay of that shape.
        """
        start = self.kv.length
        positions = torch.arange(start, start + ids.shape[1], device=ids.device)[None]
        with self.kv.forward(ids.shape[1]):
            if self.graphs is not None and start > 0 and not last_logits_only:
                return self.graphs(("verify", self._capacity, self.feature_layers), self._step, ids, positions)
            return self._step(ids, positions, last_logits_only)

    def _step(self, ids: torch.Tensor, positions: torch.Tensor, last_logits_only: bool = False, mask=None):
        """The forward itself: a function of the two tensors (and the cache), capturable as a graph."""
        # The prefill keeps transformers' mask: on an empty cache SDPA then runs its causal kernel.
        if mask is None and self._own_mask and not last_logits_only:
            mask = self._causal_mask(positions)
        if self.graphs is not None:
            # Writes land at the positions given, however often the step runs (capture warms it up).
            for layer in self.cache.layers:
                if layer.is_initialized:
                    layer.cumulative_length.copy_(positions[0, 0])
        self._taps.clear()
        self._layer_taps.recording = self
        try:
            out = self.model(
                input_ids=ids,
                position_ids=positions,
                attention_mask=mask,
                **{self._cache_kwarg: self.cache},
                use_cache=True,
                logits_to_keep=1 if last_logits_only else 0,
            )
        finally:
            self._layer_taps.recording = None
        features = torch.cat([self._taps[i] for i in self.feature_layers], dim=-1) if self.feature_layers else None
        self._taps.clear()
        return out.logits[0], features

    def steps_refusal(self) -> str | None:
        """Why CUDA graphs and compiled steps cannot run this target, or None when they can: they run
        its forward with the target's own causal mask, which only sdpa and eager attention take as is,
        and a batch-invariant target's row-wise wrapper over sdpa (`batch_invariant.rowwise`)."""
        attention = self.model.config._attn_implementation
        if attention in ("sdpa", GROUPED_SDPA, "eager"):
            return None
        if is_batch_invariant(self.model):
            # Compiled, its blocks and one-token steps are each query row alone only in the kernel.
            base = attention.removesuffix(ROWWISE)
            if base not in ("sdpa", GROUPED_SDPA):
                return f"a batch-invariant target needs sdpa attention for them, and this model uses {base}"
            if not cpu_attention.row_invariant_ready():
                return ("a batch-invariant target's compiled steps attend through the masked-attention kernel, "
                        "which does not build or run on this machine")
            return None
        return f"they need sdpa or eager attention, and this model uses {attention}"

    def tree_refusal(self) -> str | None:
        """Why this target cannot verify a draft tree, or None when it can."""
        if not self.kv.exact_anywhere:
            return (f"tree verification needs full attention in every layer, and {self.kv.describe()} A sliding "
                    "window would cut a node's ancestors by slot rather than by depth, and a recurrent state "
                    "would run the tree's branches into one another")
        return None

    @torch.inference_mode()
    def forward_tree(self, ids: torch.Tensor, depths: torch.Tensor, ancestors: torch.Tensor):
        """Run a draft tree's nodes `ids` ([1, n], the root first) after the cached positions, each
        at the position of its depth (`depths` [n]) and seeing the context and its own ancestors
        only (`ancestors` [n, n] bool, `tree.ancestor_mask`); return (logits [n, V], features).

        The mask goes to the model as a 4D mask, which transformers' mask functions pass through as
        is. Every node's keys and values are cached in node order; `keep_path` keeps a path's. With
        CUDA graphs or compiled steps a tree of each size is a step of its own, the mask one of its
        inputs.
        """
        if (refusal := self.tree_refusal()) is not None:
            raise ConfigError(refusal)
        start, n = self.kv.length, ids.shape[1]
        positions = (start + depths)[None]
        width = self._capacity if self.static_cache else start + n
        allowed = torch.zeros(n, width, dtype=torch.bool, device=ids.device)
        allowed[:, :start] = True
        allowed[:, start:start + n] = ancestors
        with self.kv.forward(n):
            if self.graphs is not None:
                return self.graphs(("tree", self._capacity, self.feature_layers), self._tree_step, ids, positions, allowed)
            return self._tree_step(ids, positions, allowed)

    def _tree_step(self, ids: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor):
        return self._step(ids, positions, mask=self._mask_for(allowed))

    def keep_path(self, start: int, rows: list[int]) -> None:
        """After `forward_tree` from `start`: keep the cached rows `rows` (increasing, the root's 0
        first) as positions `start`, `start + 1`, ...; drop the others."""
        self.kv.keep(start, rows)

    def _mask_for(self, allowed: torch.Tensor) -> torch.Tensor:
        """[1, 1, n, keys] from a boolean [n, keys] mask, in the form the attention takes."""
        if self.model.config._attn_implementation == "eager":  # eager attention adds its mask
            return torch.zeros(allowed.shape, dtype=self.dtype, device=allowed.device).masked_fill_(
                ~allowed, torch.finfo(self.dtype).min
            )[None, None]
        return allowed[None, None]

    def _causal_mask(self, positions: torch.Tensor) -> torch.Tensor:
        """[1, 1, n, capacity]: each query sees the cache slots up to its own position.

        transformers builds the same mask for a static cache, but first tests the cache length on
        the host (`q_offset == 0`): a second host sync per cycle, and one a graph capture cannot take.
        """
        return self._mask_for(torch.arange(self._capacity, device=positions.device)[None, :] <= positions[0, :, None])
