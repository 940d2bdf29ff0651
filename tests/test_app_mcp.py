"""The compare endpoint as an MCP tool: the app served with mcp_server on the tiny pair, listed and called over HTTP."""

from __future__ import annotations

import ast
import asyncio

import pytest

pytest.importorskip("mcp")

from mcp import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamablehttp_client  # noqa: E402
from serve import launch_app  # noqa: E402


@pytest.fixture(scope="module")
def served_demo(tiny_dirs, one_thread):
    demo, _ = launch_app(*tiny_dirs, mcp_server=True)
    yield demo
    demo.close()


@pytest.fixture(scope="module")
def served(served_demo):
    return served_demo.local_url


async def _list_and_call(url: str):
    async with streamablehttp_client(url) as (read, write, _):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = (await session.list_tools()).tools
            args = {"prompt": "What is 2 + 2?", "max_new_tokens": 6, "block_size": 4, "temperature": 0.0,
                    "top_p": 1.0, "seed": 0}
            result = await session.call_tool("compare", args)
            return tools, result


def test_compare_is_a_tool_and_answers_with_the_json_summary(served):
    from gradio_client import Client

    tools, result = asyncio.run(_list_and_call(served.rstrip("/") + "/gradio_api/mcp/"))
    # The tools are the named API endpoints; UI-only events (pair loading, Stop, Pause, ...) stay private.
    api = Client(served, verbose=False).view_api(return_format="dict", print_info=False)["named_endpoints"]
    assert sorted(t.name for t in tools) == sorted(name.lstrip("/") for name in api)
    assert "compare" in {t.name for t in tools} and not {"stop", "pause", "load_selected"} & {t.name for t in tools}
    tool = next(t for t in tools if t.name == "compare")
    assert "tau" in tool.description and "speedup" in tool.description
    assert set(tool.inputSchema["properties"]) == {"prompt", "max_new_tokens", "block_size", "temperature", "top_p", "seed", "lanes",
                                                   "thinking", "tree_budget"}
    assert "enable_thinking" in tool.inputSchema["properties"]["thinking"]["description"]
    assert "chat template" in tool.inputSchema["properties"]["prompt"]["description"]
    assert not result.isError
    # Gradio returns the endpoint's outputs in order, as text; the summary is the `report` output.
    outputs = [ast.literal_eval(c.text) if c.text.startswith(("[", "{")) else c.text for c in result.content]
    outputs = outputs[0] if len(outputs) == 1 and isinstance(outputs[0], list) else outputs
    summary = outputs[-2]
    assert summary["identical"] is True and summary["stopped"] is False and 1 <= summary["dflash_tokens"] <= 6
    assert summary["tau"] >= 1.0 and summary["speedup"] > 0


async def _calls(url: str, calls: list[tuple[str, dict]]):
    """Each call from an MCP client of its own (a separate agent)."""
    results = []
    for name, args in calls:
        async with streamablehttp_client(url) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                try:
                    results.append(await session.call_tool(name, args))
                except Exception as exc:  # noqa: BLE001 - a refused call, as the client reports it
                    results.append(exc)
    return results


def test_mcp_offers_compare_alone_and_refuses_the_endpoints_it_does_not_list(served):
    url = served.rstrip("/") + "/gradio_api/mcp/"
    tools, _ = asyncio.run(_list_and_call(url))
    assert [t.name for t in tools] == ["compare"]  # what docs/app.md lists
    shipped = "math-greedy"
    for result in asyncio.run(_calls(url, [("replay", {"shipped": shipped, "uploaded": "http://127.0.0.1:9/x.json",
                                                       "speed": 4.0}), ("select_pair", {"pair_id": "cli"})])):
        assert isinstance(result, Exception) or result.isError
        text = str(result) if isinstance(result, Exception) else result.content[0].text
        assert "Unknown tool" in text


def test_each_mcp_caller_races_in_a_session_of_its_own(served_demo):
    url = served_demo.local_url.rstrip("/") + "/gradio_api/mcp/"
    store = next(f.fn for f in served_demo.fns.values() if f.name == "compare").__self__.traces
    before = set(store.files())
    args = {"prompt": "Hi", "max_new_tokens": 4, "block_size": 4, "temperature": 0.0, "top_p": 1.0, "seed": 0}
    results = asyncio.run(_calls(url, [("compare", args)] * 5))
    assert all(not r.isError for r in results)
    # Five agents, five sessions: no agent's race deleted another's trace (a session keeps 4).
    made = set(store.files()) - before
    assert len(made) == 5
    assert len({store.owner(p)[1] for p in made}) == 5 and all(store.owner(p)[1].startswith("mcp-") for p in made)
