"""Launcher for the DFlash Studio web app: `python app.py [--host H] [--port P] [--share]`.

Flags override the usual Gradio environment variables (GRADIO_SERVER_NAME, GRADIO_SERVER_PORT);
`--target/--drafter` add a pair from the command line and select it; `--replay FILE` serves a
recorded race with no model (torch is not even imported) and plays it when the page opens.
"""

from __future__ import annotations

import argparse
import os

# Before gradio is imported: no usage analytics, no telemetry calls home.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from app.hosting.space import default_limits, on_space, on_zerogpu  # noqa: E402  (imports neither torch nor models)

if on_zerogpu():
    import spaces  # noqa: F401  (ZeroGPU must patch CUDA before torch is imported)



def build_parser() -> argparse.ArgumentParser:
    from app.guard.limits import add_flags

    parser = argparse.ArgumentParser(description="DFlash Studio: DFlash vs plain decoding, live.")
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
    parser.add_argument("--share", action="store_true", help="create a public gradio.live link")
    parser.add_argument("--target", help="target model directory or Hub id (with --drafter)")
    parser.add_argument("--drafter", help="DFlash drafter directory or Hub id (with --target)")
    parser.add_argument("--ar-drafter", help="an autoregressive drafter (DFlashARDraftModel) for the --target/--drafter "
                        "pair's AR drafter lane")
    parser.add_argument("--dflash2-drafter", help="a DFlash2 drafter for the --target/--drafter pair's DFlash2 lane")
    parser.add_argument("--fusion-drafter", help="an input-fusion drafter for the --target/--drafter pair's input "
                        "fusion lane")
    parser.add_argument(
        "--dtype", default="auto",
        help="target dtype for the --target/--drafter pair: float32, bfloat16, float16, or auto (bfloat16 on "
        "CPUs that run it natively, where verification is batch-invariant and stays lossless; else float32)",
    )
    parser.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--pair", help="id of the pair to select at start (see app/pairs/pairs.json)")
    parser.add_argument("--vllm-url", help="race a vLLM server's DFlash (this OpenAI-compatible URL) against its "
                        "plain decoding (scripts/serve_vllm.sh starts both)")
    parser.add_argument("--vllm-plain-url", help="the plain vLLM server (default: --vllm-url's port + 1)")
    parser.add_argument("--vllm-block-size", type=int, default=4,
                        help="the DFlash server's num_speculative_tokens + 1 (default 4, as serve_vllm.sh serves)")
    parser.add_argument(
        "--mcp", action="store_true", default=os.environ.get("GRADIO_MCP_SERVER", "").lower() == "true",
        help="also serve the compare endpoint as an MCP tool, each call in a session of its own (default: off, "
        "on a Space too; GRADIO_MCP_SERVER=True turns it on)",
    )
    add_flags(parser, default_limits())
    parser.add_argument(
        "--replay", metavar="FILE",
        help="replay a recorded trace (dflash-trace/1 JSON, e.g. assets/traces/*.json) with no model loaded",
    )
    parser.add_argument(
        "--no-compile", action="store_true",
        help="race on the eager steps only (default: a CPU pair's DFlash, plain and prompt-lookup lanes run "
        "compiled steps once the app has compiled them in the background; the status line counts them)",
    )
    # The default is app/pairs/compiled.py's GEMMS, written out: importing it would import torch,
    # which --replay serves without.
    parser.add_argument(
        "--compile-gemms", choices=("library", "template"), default="library",
        help="the compiled lanes' linears: library (default: the engine's own, no copy of the weights, compiled "
        "in seconds) or template (inductor's GEMMs on packed copies: faster steps, a copy of the target's "
        "weights per compiled shape, minutes to compile)",
    )
    parser.add_argument(
        "--threads", type=int,
        help="torch CPU threads (default: all cores but one when serving on this machine's loopback, "
        "where the browser shares the CPU; all cores otherwise)",
    )
    return parser


def own_upload_folder() -> None:
    """Give this server a new folder for uploads and the files it serves, deleted when it exits.

    Gradio's default is one folder shared by every Gradio process of the machine, whose cleanup at
    shutdown does not always run (not after an MCP call): visitors' uploads would outlive the
    server. A GRADIO_TEMP_DIR set by the user is kept as it is.
    """
    if os.environ.get("GRADIO_TEMP_DIR"):
        return
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="dflash-gradio-")
    os.environ["GRADIO_TEMP_DIR"] = folder
    atexit.register(shutil.rmtree, folder, ignore_errors=True)


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    if bool(args.target) != bool(args.drafter):
        raise SystemExit("error: --target and --drafter go together")
    own_upload_folder()
    if args.replay:
        serve_replay(args)
        return

    import torch

    from app.pairs.models import PairCache, default_threads

    threads = args.threads or default_threads(args.host, torch.get_num_threads())
    if threads:
        torch.set_num_threads(threads)
    print(f"DFlash Studio: {torch.get_num_threads()} torch CPU threads", flush=True)
    from dflash_core.loading import cuda_mismatch

    if problem := cuda_mismatch():
        print(f"DFlash Studio: {problem}", flush=True)

    from app.guard.limits import from_args
    from app.pairs.registry import cli_pair, load_pairs, vllm_pair

    if on_space():
        from app.hosting.space import install_default_target

        install_default_target()
    from app.ui import build_demo

    pairs, default_id = load_pairs()
    if args.target:
        pair = cli_pair(args.target, args.drafter, args.dtype, args.ar_drafter or "", args.dflash2_drafter or "",
                        args.fusion_drafter or "")
        pairs, default_id = [pair, *pairs], pair.id
    if args.vllm_url:
        pair = vllm_pair(args.vllm_url, args.vllm_plain_url, args.vllm_block_size)
        pairs, default_id = [pair, *pairs], pair.id
    if args.pair:
        default_id = args.pair
    zerogpu = on_zerogpu()
    # ZeroGPU: models go to (emulated) CUDA at start-up; no compute happens outside a GPU call.
    cache = PairCache("cuda" if zerogpu else args.device, warm_up=not zerogpu, cpu_for_cpu_pairs=zerogpu,
                      compile_gemms=None if zerogpu or args.no_compile else args.compile_gemms)
    demo = build_demo(pairs, default_id, cache, from_args(args))
    if zerogpu:
        from app.hosting.space import load_every_pair

        load_every_pair(cache, pairs)
        serve(demo, args, mcp_server=args.mcp)
        return
    # The page opens on the default pair: once the server answers, it loads (and a CPU pair's lanes
    # compile) while nobody waits, where a visitor's first page would have started it.
    default = next((p for p in pairs if p.id == default_id), None)
    started = (lambda: cache.load_in_background(default)) if default is not None and default.kind == "local" else None
    serve(demo, args, started=started, mcp_server=args.mcp)


def serve_replay(args) -> None:
    """A replay-only app: no model pairs, no torch, so it serves within seconds."""
    from app.guard.limits import from_args
    from app.serve.replay import ReplayError, load_trace
    from app.ui import build_demo

    try:
        load_trace(args.replay)  # a bad file is named here, not as a broken page
    except ReplayError as exc:
        raise SystemExit(f"error: {exc}") from None
    demo = build_demo([], "", None, from_args(args), replay=args.replay, live=False)
    serve(demo, args)


def serve(demo, args, started=None, **launch) -> None:
    """Launch `demo` until Ctrl-C or SIGTERM; both close the server, which deletes its trace files.
    `started` (if given) is called once the server answers."""
    import signal

    from app.ui import launch_options

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a KeyboardInterrupt: Gradio then closes cleanly
    try:
        demo.launch(server_name=args.host, server_port=args.port, share=args.share, prevent_thread_lock=True,
                    **launch_options(demo), **launch)
        if started is not None:
            started()
        demo.block_thread()
    except KeyboardInterrupt:  # before Gradio's own wait for it has begun
        pass
    finally:  # the server's own shutdown may be cut short by streams still open: the files go here too
        demo.dflash_app.traces.close()


if __name__ == "__main__":
    main()
