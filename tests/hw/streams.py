"""Stream put/get helpers for Amaranth 0.5 async testbenches, shared by every gateware test."""

from __future__ import annotations

from typing import Any

__all__ = ["stream_put", "stream_get", "stream_get_n"]


async def stream_put(ctx: Any, stream: Any, payload: Any) -> None:
    """Offer one payload on ``stream`` (a producer-side port) and wait until it is taken."""
    ctx.set(stream.valid, 1)
    ctx.set(stream.payload, payload)
    await ctx.tick().until(stream.ready)
    ctx.set(stream.valid, 0)


async def stream_get(ctx: Any, stream: Any) -> Any:
    """Take one payload from ``stream`` (a consumer-side port)."""
    ctx.set(stream.ready, 1)
    (payload,) = await ctx.tick().sample(stream.payload).until(stream.valid)
    ctx.set(stream.ready, 0)
    return payload


async def stream_get_n(ctx: Any, stream: Any, count: int) -> list[Any]:
    """Take ``count`` payloads, keeping ready high throughout (full throughput)."""
    out = []
    ctx.set(stream.ready, 1)
    while len(out) < count:
        (payload,) = await ctx.tick().sample(stream.payload).until(stream.valid)
        out.append(payload)
    ctx.set(stream.ready, 0)
    return out
