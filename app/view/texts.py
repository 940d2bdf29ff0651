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
READY = (
    "✓ **{label}** ready on {device} (loaded in {load_s:.1f} s); target in {numerics}; drafter in "
    "{drafter_dtype}, trained with block size {trained}; prompts through {chat_template}; {size}.{freed}"
)

# --- the race ---------------------------------------------------------------------------------------
NO_MODEL = "This app was started with --replay: no model is loaded. Replay a recorded run instead."
UNKNOWN_MODEL_PAIR = "Unknown model pair {pair_id!r}."
NO_DRAFTING = "Block size 1 means no drafting: every lane decodes plainly, one token per step."
RACE_LOADING = "Loading {label}… (first time only)"
RACING = "Racing…"
STOPPED = "Stopped."
STOPPED_EARLY = "Stopped before every lane had a token."
OWN_CLOCKS = (
    "Times are each lane's own compute time: the lanes ran interleaved in one worker, "
    "so none slowed another down."
)
STOPPED_SHOWN = "Stopped: {dflash} DFlash and {plain} plain tokens shown, numbers up to there. "
LANES_CHOICE = "Also race (DFlash and plain decoding always race)"
NO_LANE_DRAFTER = "{label} cannot race the {lane} lane: {why}. Pairs that can: {pairs}."
# After a pair's ready line: a lane whose drafter the pair names but whose folder is not there yet.
LANE_NOT_OFFERED = " The {lane} lane is not offered: {why}."
VLLM_LANES = (
    "A vLLM pair races the server's DFlash against its plain decoding only: the scheduled block, AR "
    "drafter and prompt lookup lanes run in this engine, on the app's local pairs."
)
SCHEDULED_SAMPLING = (
    "{label}'s drafter ({method}) conditions each draft on the ones before it, so the scheduled block lane "
    "races it at temperature 0 only (the schedule must not depend on what a sampled draft drew)."
)

# --- a replay ---------------------------------------------------------------------------------------
BAD_SPEED = "replay speed must be between 0.25x and 4x, got {speed:g}x"
BAD_SPEED_TYPE = "replay speed must be a number between 0.25 and 4, got {value!r}"
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
REPLAY_FAILED = "{name} could not be replayed ({error}): the file holds something the trace checks did not foresee."

# --- pause / step / continue ------------------------------------------------------------------------
PAUSED = "**Paused** after cycle {cycle}: *Step* shows one more DFlash cycle, *Continue* resumes."
PLAYING = "**Playing.**"
PAUSED_AT = "**Paused** after cycle {cycle}: *Step* shows one more, *Continue* resumes."
FINISHED = "**Finished**: pick any cycle under *Inside a cycle* to look inside it."
PAUSE_EXPIRED = (
    "Ended: paused for {seconds:g} s in all, this server's pause budget per race (--max-pause-s), so the "
    "race ended to free the model for other visitors; what was shown is kept."
)
NOTHING_TO_PAUSE = "Nothing to pause: start a race or a replay first."
TIME_UP = (
    "Ended: the race reached this server's limit of {seconds:g} s from its start, pauses included "
    "(--max-race-s), so it ended to free the model for other visitors; what was shown is kept."
)
EVICTED = (
    "Ended: the server dropped this page's pause state to make room for newer visitors, so the paused "
    "race ended; what was shown is kept."
)

# --- why this tau? (the acceptance doctor) ------------------------------------------------------------
DOCTOR_BUTTON = "Why this tau?"
DOCTOR_PANEL = "Why this tau? The acceptance doctor's report for the selected pair"
DOCTOR_JSON = "The report as data (JSON, dflash-doctor/1)"
DOCTOR_LOADING = "loading {label}"
DOCTOR_WAITING = "waiting for the race on this pair to end"
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
