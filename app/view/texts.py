"""The page's prose: the intro, the hints, and the status lines the handlers show.

Templates with `{name}` fields are filled with `str.format` where they are shown.
"""

INTRO = """# ⚡ DFlash Studio
Speculative decoding with a **block-diffusion drafter**: the drafter proposes a whole block of tokens
in one pass, the target verifies it in one pass and keeps the longest agreeing prefix plus one token of
its own. Every pane decodes the same prompt with the same target; the race is paced on each lane's own
compute time, so what you see matches the measured speeds. Add lanes to race DFlash against an
autoregressive drafter (one pass per drafted token, the same injected target features) and prompt lookup
(copying from the context, no model).

Block size is a hardware trade-off: a bigger block lets more tokens be accepted per cycle, but on a
CPU verifying 16 tokens costs several plain steps (4 cost one to one and a half), so here the block-4 pair is the
faster one; on a GPU a 16-token verify costs about what one token does, the setting of the paper. The
*scheduled block* lane lets DFlash choose each cycle how many of its drafts to verify."""

HEADER = (
    "**⚡ DFlash Studio** · a block-diffusion drafter proposes a block in one pass, the target verifies it in one "
    "pass · *How it works* explains"
)
LARGE_TEXT = "Large text, high contrast"
BLOCK_BARS = "Block bars"
START_PAUSED = "Start paused"
SETTINGS_PANEL = "Settings: example prompts, more lanes, tokens, block size, sampling"
MORE_LANES = "More lanes (research: DFlash trees, DFlash2, input fusion)"
TREE_BUDGET = "Tree budget (draft nodes the tree lane verifies per cycle)"
GLOSSARY = (
    "**Glossary.** *slot*: a position of the block (slot 0 holds the last committed token); *mask_id*: the "
    "token id the drafter reads in a slot it must fill; *target layers*: the target's hidden layers whose "
    "features the drafter is given; *fc + hidden_norm*: the drafter's projection of those features; *tau*: "
    "tokens committed per cycle, the bonus counted; *bonus*: the target's own token after the kept drafts; *pass*: "
    "one forward of a drafter (DFlash: one a cycle; the AR drafter: one a draft); *n-gram*: the context's last n "
    "tokens, which prompt lookup searches for earlier in the context."
)

LESSONS = "**Lessons** (one click: a recorded race, paused where it teaches; *Next* goes on):"

REPLAY_TAB = (
    "No model needed: replay a race recorded on the default pair (or upload a trace a race "
    "downloaded), paced by its recorded compute clocks. Every view works as in a live race."
)
CYCLE_PANEL = "Inside a cycle: what the drafter saw and proposed, what the target decided"

# Where no model can run, the page still shows a real race.
REPLAY_HINT = "The *Replay a recorded run* tab plays races recorded on the default pair, with no model."

# --- the pair's status line --------------------------------------------------------------------------
PAIRS_LOADING = "Loading models…"
UNKNOWN_PAIR = "⚠ Unknown pair {pair_id!r}."
UNAVAILABLE = "⚠ **Unavailable:** {reason} " + REPLAY_HINT
LOADING = "Loading **{label}** on {device} (first time only)"
NOT_LOADED = "⚠ **Could not load {label}:** {why} " + REPLAY_HINT
FREED = " Freed {labels} to make room."
# What a visitor acts on first (ready, and which steps the lanes run) leads; the box shows four lines.
READY = (
    "✓ **{label}** ready on {device}.{steps} Loaded in {load_s:.1f} s; target in {numerics}; drafter in "
    "{drafter_dtype}, trained with block size {trained}; prompts through {chat_template} — {thinking}; {size}.{freed}"
)
BAD_THINKING = "⚠ {why}"

# --- the race ---------------------------------------------------------------------------------------
NO_MODEL = "This app was started with --replay: no model is loaded. Replay a recorded run instead."
UNKNOWN_MODEL_PAIR = "Unknown model pair {pair_id!r}."
NO_DRAFTING = "Block size 1 means no drafting: every lane decodes plainly, one token per step."
RACE_LOADING = "Loading {label}… (first time only)"
RACING = "Racing…"
STOPPED = "Stopped."
RACE_BYTES = (
    "Stopped: this race's frames reached {mb} MB, the most one race may stream on this server (--max-race-mb). "
    "Fewer lanes or fewer tokens stream less."
)
STOPPED_EARLY = "Stopped before every lane had a token."
RACE_WAITING_STEP = (
    "Waiting for the model: the app is compiling the {step}, which takes up to a minute or two on a CPU, once "
    "(later launches load it from disk). This race starts as soon as that step is done; until every lane step "
    "is compiled, races run the eager steps."
)
RACE_WAITING = "Waiting for the model: another race or diagnosis on this pair is running. This race starts when it ends."
STOPPED_WAITING = "Stopped while waiting for the model: nothing was raced."
STEPS = "Every lane ran {steps}."  # compiled or eager, the same for every lane of a race
STEPS_RUNNING = "Every lane runs {steps}."
OWN_CLOCKS = (
    "Times are each lane's own compute time: the lanes ran interleaved in one worker, "
    "so none slowed another down."
)
STOPPED_SHOWN = "Stopped: {dflash} DFlash and {plain} plain tokens shown, numbers up to there. "
LANES_CHOICE = "Also race (DFlash and plain decoding always race)"
THINKING_CHOICE = "Thinking (the chat template's switch; every lane gets the same prompt)"
THINKING_CHOICES = [("the pair's default", "default"), ("on", "on"), ("off", "off")]
NO_LANE_DRAFTER = "{label} cannot race the {lane} lane: {why}. Pairs that can: {pairs}."
# After a pair's ready line: a lane whose drafter the pair names but whose folder is not there yet.
LANE_NOT_OFFERED = " The {lane} lane is not offered: {why}."
# In a pair's ready line, where the app compiles its lanes' steps: compiled, compiling k/n, or eager and why.
LANE_STEPS = " Lane steps: {status}."
VLLM_LANES = (
    "A vLLM pair races the server's DFlash against its plain decoding only: the scheduled block, AR "
    "drafter and prompt lookup lanes run in this engine, on the app's local pairs."
)
VLLM_BLOCK = (
    "This vLLM pair's server drafts blocks of {served} (vLLM fixes the block per server), so it cannot race "
    "block size {asked}: set the block size to {served}."
)
VLLM_THINKING = (
    "A vLLM pair's servers wrap the prompt in the chat template themselves, so this app cannot turn thinking "
    "{choice} for them; leave thinking at the pair's default."
)

# --- a replay ---------------------------------------------------------------------------------------
BAD_SPEED = "replay speed must be between 0.1x and 4x, got {speed:g}x"
BAD_SPEED_TYPE = "replay speed must be a number between 0.1 and 4, got {value!r}"
NO_URLS = "A trace is uploaded as a file; this server does not download URLs."
UNKNOWN_RECORDING = "unknown recorded run {name!r}: pick one from the list or upload a trace file (.json)"
NOT_YOURS = "{name}: that trace belongs to another visitor's session; replay your own or a recorded run"
REPLAY_BUSY = (
    "The server is busy: {playing} replays are playing and {waiting} waiting, the most it takes "
    "(--replay-concurrency, --replay-queue). Please try again in a moment."
)
REPLAY_YOURS_BUSY = (
    "Your address already has {held} replays playing or waiting, the most one address may have (--per-visitor); "
    "wait for one to finish."
)
REPLAY_WAITING = "Waiting for a free replay slot ({playing} replays are playing)…"
REPLAY_CAPPED = (
    "This recording lasts {recorded_s:.0f} s at {speed:g}×; it plays at {played:.3g}× to end within this "
    "server's {limit_s} s replay limit (--max-replay-s)."
)
REPLAY_START = "Replaying {label} at {speed:g}×"
REPLAYING = "Replaying {name} at {speed:g}× (recorded compute clocks)…"
REPLAY_NOTE = "Replay of a recorded run ({name}); times are the recorded compute clocks."
RECORDED_THINKING = "Raced with {words}."
REPLAY_FAILED = "{name} could not be replayed ({error}): the file holds something the trace checks did not foresee."

# --- pause / step / continue ------------------------------------------------------------------------
PAUSED = "**Paused** after cycle {cycle}: *Step* (→) shows cycle {next}, *Continue* (space) resumes."
PAUSED_BEFORE = "**Paused** before cycle 1: *Step* (→) shows cycle 1, *Continue* (space) plays."
PLAYING = "**Playing.**"
FINISHED = "**Finished**: pick any cycle under *Inside a cycle* to look inside it."
# The panes stepped back to an earlier cycle of a paused or finished run (← / →, the cycle picker).
BACK_AT_PAUSED = ("**Back at cycle {cycle}** of {last}{whose}: every pane shows the race after it. → goes on "
                  "(cycle {last} is where it paused), *Continue* (space) resumes.")
BACK_AT_ENDED = ("**Back at cycle {cycle}** of {last}{whose}, the race finished: every pane shows the race after "
                 "it. → goes on; cycle {last} shows the finished race.")
PAUSE_EXPIRED = (
    "Ended: paused for {seconds:g} s in all, this server's pause budget per race (--max-pause-s), so the "
    "race ended to free the model for other visitors; what was shown is kept."
)
STARTING_PAUSED = "Starting paused before cycle 1…"
NOTHING_TO_PAUSE = "Nothing to pause: start a race or a replay first."
PIN = "Pin this race"
UNPIN = "Unpin"
NOTHING_TO_PIN = "Nothing to pin yet: pin a race once it has finished (or stopped), then race again beside it."
UNNAMED_RUN = "a race"
TIME_UP = (
    "Ended: the race reached this server's limit of {seconds:g} s from its start, pauses included "
    "(--max-race-s), so it ended to free the model for other visitors; what was shown is kept."
)
EVICTED = (
    "Ended: the server dropped this page's pause state to make room for newer visitors, so the paused "
    "race ended; what was shown is kept."
)

# --- serving: throughput across concurrency (vLLM) -------------------------------------------------
SERVING_TAB = "Serving (vLLM)"
SERVING_NO_VLLM = (
    "The serving view sends many requests at once to two vLLM servers, one with DFlash and one plain, and "
    "charts throughput and latency against concurrency. This app was started without them. From a shell:\n\n"
    "```bash\nbash scripts/serve_vllm.sh      # DFlash on 127.0.0.1:8765, plain on 8766\n"
    "python app.py --vllm-url http://127.0.0.1:8765\n```\n\n"
    "(`bash scripts/setup.sh --vllm` makes vLLM's venv first; docs/serving-vllm.md.) The same sweep runs "
    "from the command line, to 32 and beyond (start the servers with `MAX_NUM_SEQS=32`): "
    "`python -m dflash_core.bench --peer vllm --concurrency 1,2,4,8,16,32`."
)
SERVING_INTRO = (
    "At each level *c* picked, sends *c* requests at once to the DFlash server ({dflash}) and *c* to the plain "
    "one ({plain}), both sides at the same time (scripts/serve_vllm.sh gives each server a core of its own): "
    "{rounds} requests per client, greedy, one prompt per category of the natural set (math, code, chat, "
    "writing), each sent equally often at every level. Each point is the "
    "total output tokens per second of all requests, and a request's latency. At one request at a time "
    "speculation fills idle compute; with many at once the verify's extra rows compete with the batch for "
    "the same compute. The whole sweep ends within {seconds} s (--max-race-s); it runs in the race queue, "
    "one at a time with races. A server batches at most its --max-num-seqs requests (serve_vllm.sh: "
    "MAX_NUM_SEQS, default 8); beyond that, requests wait in its queue."
)
SERVING_RUN = "Run the sweep ▶"
SERVING_LEVELS = "Concurrency levels (requests at once)"
SERVING_TOKENS = "Max new tokens per request"
SERVING_RUNNING = "vLLM DFlash (K = {k}) against vLLM plain, {tokens} new tokens, {rounds} requests per client:"
SERVING_LEVEL = "level {level} running…"
SERVING_STOPS_PAYING = "Done. From concurrency {level} up, DFlash is slower than plain decoding on these servers."
SERVING_PAYS = "Done. DFlash is faster than plain decoding at the highest level measured."
SERVING_NONE = "Done, but no level was measured (time budget spent, or the page was closed)."
SERVING_FAILED = "⚠ **The sweep stopped:** {why}"

# --- why this tau? (the acceptance doctor) ------------------------------------------------------------
DOCTOR_BUTTON = "Why this tau?"
DOCTOR_PANEL = "Why this tau? The acceptance doctor's report for the selected pair"
DOCTOR_JSON = "The report as data (JSON, dflash-doctor/1)"
DOCTOR_LOADING = "loading {label}"
DOCTOR_WAITING = "waiting for the race on this pair to end"
DOCTOR_WAITING_STEP = "waiting for the app to compile the {step} (up to a minute or two on a CPU, once)"
DOCTOR_BUSY = (
    "The pair stayed busy with another race for {seconds:g} s, this server's limit (--max-race-s); "
    "ask again in a moment."
)
DOCTOR_TIME_UP = (
    "Stopped: the doctor reached this server's limit of {seconds:g} s (--max-race-s), so it ended to free the "
    "model for other visitors. The command below runs it without a limit."
)
DOCTOR_FAILED = "The doctor could not run on {label}: {why}"
DOCTOR_RAN = (
    "Run on demand, smaller than the command line's default: {prompts} prompts of {source}, {tokens} new "
    "tokens each, greedy, in {seconds:.0f} s. The full run (6 prompts, 64 tokens each), from a shell:"
)
DOCTOR_VLLM = (
    "This pair's models run inside the vLLM server, not in this app, so the doctor cannot decode with "
    "them here. Its command-line form loads the same target and drafter on this machine and asks the "
    "server the same prompts: it compares the server's block size, tau and outputs with this engine's. "
    "DRAFTER (and TARGET, where the command says so) is the folder or Hub id the server was started with."
)
DOCTOR_GPU_WORKER = (
    "On this Space the pair's models reach a GPU only for the length of one race, so the doctor does not "
    "run here. On a machine with a GPU, from a shell:"
)
