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
def served(tiny_dirs, one_thread):
    demo, url = launch_app(*tiny_dirs, mcp_server=True)
    yield url
    demo.close()


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
    assert set(tool.inputSchema["properties"]) == {"prompt", "max_new_tokens", "block_size", "temperature", "top_p", "seed"}
    assert "chat template" in tool.inputSchema["properties"]["prompt"]["description"]
    assert not result.isError
    # Gradio returns the endpoint's outputs in order, as text; the summary is the `report` output.
    outputs = [ast.literal_eval(c.text) if c.text.startswith(("[", "{")) else c.text for c in result.content]
    outputs = outputs[0] if len(outputs) == 1 and isinstance(outputs[0], list) else outputs
    summary = outputs[-2]
    assert summary["identical"] is True and summary["stopped"] is False and 1 <= summary["dflash_tokens"] <= 6
    assert summary["tau"] >= 1.0 and summary["speedup"] > 0
